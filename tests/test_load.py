"""benchmarks.load's clients (benchmarks.load_clients): the refusal hints and retries, the
clip rotation and the summary as pure functions, then one real server whose only admission
slot is held, so that a request over gRPC and one over HTTP are refused for certain, wait the
server's hint and are taken once the slot is free. No timings are asserted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from benchmarks.load_clients import (
    DEFAULT_WAIT,
    Refused,
    Sent,
    busy_rate,
    clip_of,
    grpc_sender,
    http_sender,
    http_wait,
    retrying,
    run_level,
    summary,
)
from benchmarks.service import reset_peak, rss_mb
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig


def test_http_wait_reads_retry_after_of_429_only() -> None:
    assert http_wait(429, "3") == 3.0
    assert http_wait(429, None) == DEFAULT_WAIT
    assert http_wait(429, "Wed, 21 Oct 2015 07:28:00 GMT") == DEFAULT_WAIT
    assert http_wait(503, "5") is None
    assert http_wait(500, None) is None


def test_retrying_waits_each_hint_and_counts_the_refusals() -> None:
    waits: list[float] = []
    answers = iter([Refused(0.25), Refused(1.5), "text"])

    def attempt() -> str:
        answer = next(answers)
        if isinstance(answer, Refused):
            raise answer
        return answer

    value, refusals, offset = retrying(attempt, sleep=waits.append)
    assert (value, refusals, waits) == ("text", 2, [0.25, 1.5])
    assert offset >= 0


def test_retrying_gives_up_and_lets_other_errors_through() -> None:
    def refused() -> str:
        raise Refused(400.0)

    with pytest.raises(TimeoutError):
        retrying(refused, sleep=lambda s: None, give_up=600.0)

    def broken() -> str:
        raise ValueError("not a refusal")

    with pytest.raises(ValueError):
        retrying(broken, sleep=lambda s: None)


def test_clients_send_every_clip_in_turn() -> None:
    n, clients, each = 13, 4, 5
    sent = [clip_of(i, k, clients, n) for k in range(each) for i in range(clients)]
    assert sent == [j % n for j in range(clients * each)]


def test_summary_counts_refusals_apart_from_failures() -> None:
    sent = [
        Sent(0, latency=1.0, first=0.5, refusals=2, text="a").__dict__,
        Sent(1, latency=3.0, first=None, text="b").__dict__,
        Sent(2, error="RuntimeError: HTTP 500").__dict__,
    ]
    s = summary(sent, wall=2.0)
    assert (s["requests"], s["refused"], s["refused requests"], s["failed"]) == (2, 2, 1, 1)
    assert (s["rps"], s["p50"], s["mean"], s["ttft"]) == (1.0, 2.0, 2.0, 0.5)
    assert s["errors"] == ["RuntimeError: HTTP 500"]


def test_a_level_row_counts_the_windows_encoded_and_the_slowdown() -> None:
    """Two clips (10 s: one window; 40 s: two); alone they take 1 s and 2 s, at 2 clients 2 s
    and 6 s: slowdown 2 and 3. The server encoded 6 windows for 4 requests (by duration 6 too)
    in 8 s with a 0.5 s encoder: 38 % of the limit."""
    from benchmarks.load import Levels

    def raw(clients: int, latencies: list[float], wall: float, encoded: int) -> dict:
        sent = [Sent(i % 2, latency=t, text="x").__dict__ for i, t in enumerate(latencies)]
        return {"sent": sent, "wall": wall, "clients": clients, "windows encoded": encoded}

    levels = Levels([10.0, 40.0], probe=lambda: None)
    levels.runs.append(("ours", "gRPC", "beam 5", raw(1, [1.0, 2.0], 3.0, 3), 100.0))
    levels.runs.append(("ours", "gRPC", "beam 5", raw(2, [2.0, 6.0, 2.0, 6.0], 8.0, 6), 100.0))
    alone, loaded = levels.rows(0.5, "ours")
    assert alone["slowdown p50 / p99"] == "1.00 / 1.00"
    assert loaded["slowdown p50 / p99"] == "2.50 / 3.00"
    assert loaded["windows encoded a request"] == 1.5
    assert loaded["of limit (windows encoded)"] == loaded["of limit"] == "38%"
    assert loaded["p99 / p50"] == 1.5
    assert loaded["tokens a request"] is None  # no token count: no floor


def test_a_level_row_states_the_share_its_work_allows_at_the_ceilings() -> None:
    """A 10 s clip (one window by duration, 0.5 s encoder) whose requests took 2 windows and 19
    tokens each (21 steps with the windows' EOTs): at best 0.5 s of 2 x 0.5 s + the decoding
    floor of 2 windows and 21 steps of 5 rows, 0.25 s here: 40 %."""
    from benchmarks.load import Levels

    calls = []

    def floor(windows: float, steps: float, rows: int) -> float:
        calls.append((windows, steps, rows))
        return 0.25

    sent = [Sent(0, latency=1.0, text="x").__dict__ for _ in range(2)]
    raw = {"sent": sent, "wall": 2.0, "clients": 1, "windows encoded": 4, "tokens decoded": 38}
    levels = Levels([10.0], probe=lambda: None)
    levels.runs.append(("ours", "gRPC", "beam 5", raw, 100.0))
    (row,) = levels.rows(0.5, "ours", floor)
    assert calls == [(2.0, 21.0, 5)]
    assert (row["tokens a request"], row["of limit at most (floor)"]) == (19.0, "40%")


def test_the_decoding_floor_is_the_slower_of_compute_and_the_cross_kv_reads() -> None:
    """tiny.en's shape: a window's cross K/V is 3.54 GFLOP, a row's step 65.5 MFLOP and
    18.4 MB of cross K/V to read; at 100 GFLOP/s and 10 GB/s, 1 window and 10 steps of one row
    take max(4.19 GFLOP / 100, 184 MB / 10 GB/s) = 41.9 ms; of five rows, 67.9 ms."""
    from benchmarks.decode import decode_floor
    from benchmarks.results import Ceilings
    from xattn.model.net.dims import ModelDims

    tiny = ModelDims(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
    c = Ceilings(threads=2, fp32_gflops=100.0, memory_gbps=10.0, matmul={})
    assert decode_floor(tiny, c, 1, 10, 1) == pytest.approx(0.0419, abs=5e-4)
    assert decode_floor(tiny, c, 1, 10, 5) == pytest.approx(0.0679, abs=5e-4)
    slow_memory = Ceilings(threads=2, fp32_gflops=100.0, memory_gbps=1.0, matmul={})
    assert decode_floor(tiny, slow_memory, 1, 10, 1) == pytest.approx(0.184, abs=1e-3)


def test_a_level_counts_its_rate_while_every_client_sends() -> None:
    """Two clients: one sends two requests ending at 1 s and 2 s, the other two ending at 3 s
    and 9 s (the drain: it sends alone after 2 s). While both send (2 s) 2 requests ended."""
    ends = {(0, 0): 1.0, (0, 1): 2.0, (1, 0): 3.0, (1, 1): 9.0}

    def sender():
        def send(clip: int, k: int) -> Sent:  # client i sends clip i here (2 clips)
            return Sent(clip, latency=1.0, text="x", end=time.perf_counter() + ends[clip, k])

        return send

    raw = run_level(sender, clients=2, each=2, n=2)
    assert raw["busy"] == pytest.approx(2.0, abs=0.5)  # ends are from the level's start
    assert busy_rate(raw["sent"], raw["busy"]) == pytest.approx(1.0, abs=0.25)
    assert summary(raw["sent"], raw["wall"])["rps"] == 4 / raw["wall"]


def test_a_level_row_reads_the_share_while_every_client_sends() -> None:
    """Two clients, four 10 s clips (one window each, encoder 0.5 s): 4 requests in 8 s is 25 %
    of the limit; 3 of them ended in the first 4 s, while both sent: 38 %."""
    from benchmarks.load import Levels

    sent = [Sent(0, latency=2.0, text="x", end=e).__dict__ for e in (2.0, 3.0, 4.0, 8.0)]
    raw = {"sent": sent, "wall": 8.0, "busy": 4.0, "clients": 2}
    levels = Levels([10.0], probe=lambda: None)
    levels.runs.append(("ours", "gRPC", "beam 5", raw, 100.0))
    (row,) = levels.rows(0.5, "ours")
    assert (row["of limit"], row["of limit, all sending"]) == ("25%", "38%")
    assert (row["req/s"], row["req/s, all sending"]) == (0.5, 0.75)


def test_the_goals_read_the_rows_at_8_clients_and_more() -> None:
    from benchmarks.load import PEER, goal_rows

    def row(clients: int, decoding: str, rps: float, limit: str, spread: float) -> dict:
        face = "gRPC"
        floor = {"of limit at most (floor)": "80%"}
        return {"face": face, "decoding": decoding, "clients": clients, "req/s": rps,
                "of limit": limit, "p99 / p50": spread} | floor  # fmt: skip

    figures = {
        "load: ours": [row(1, "beam 5", 1.0, "30%", 5.0), row(8, "beam 5", 2.0, "70%", 2.5)],
        f"load: {PEER}": [row(8, "beam 5", 0.4, "14%", 1.0)],
        "live streams at real time": [
            {"streams": 1, "commit lag median s": 0.8},
            {"streams": 4, "commit lag median s": 1.5},
        ],  # fmt: skip
        "mixed load (beam 5, gRPC)": {"ratio": 1.1},
    }
    met = {(g["case"], g["goal"]): g["met"] for g in goal_rows(figures)}
    assert met == {
        ("gRPC beam 5 x8", "of limit >= 65%"): True,
        ("gRPC beam 5 x8", ">= 4x the peer's req/s"): True,
        ("gRPC beam 5 x8", "p99 <= 2x p50"): False,
        ("live x4", "median commit lag <= 1.2 s"): False,
        ("mixed", "short p50 beside / alone <= 1.5"): True,
    }
    said = {(g["case"], g["goal"]): g["measured"] for g in goal_rows(figures)}
    assert said["gRPC beam 5 x8", "of limit >= 65%"] == "70% (at most 80%)"
    assert said["gRPC beam 5 x8", ">= 4x the peer's req/s"] == "5.00x (4x: 56% of the limit)"


def test_peak_rss_starts_afresh() -> None:
    if not reset_peak():
        pytest.skip("clear_refs is not writable here")
    now, peak = rss_mb()
    assert peak >= now > 0


@pytest.fixture(scope="module")
def server(shared_audio_dir) -> Iterator[BackgroundServer]:
    # one admission slot: the tests hold it to make the server refuse
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=0, decode_processes=0)
    with BackgroundServer(config) as s:
        yield s


def refused_then_taken(server: BackgroundServer, send) -> Sent:
    """`send()` while the one slot is held: let it go after the first refusal."""
    slot = server.engine.admit_live()
    rejected = server.engine.counters().rejected
    result: list[Sent] = []
    thread = threading.Thread(target=lambda: result.append(send()))
    thread.start()
    deadline = time.monotonic() + 120
    while server.engine.counters().rejected == rejected and time.monotonic() < deadline:
        time.sleep(0.01)
    slot.release("finished")
    thread.join(300)
    return result[0]


def test_a_refused_grpc_request_waits_and_is_taken(server, shared_audio_dir) -> None:
    clip = (shared_audio_dir / "jfk.flac").read_bytes()
    with grpc.insecure_channel(server.address) as channel:
        from xattn.v1 import transcriber_pb2_grpc

        send = grpc_sender(transcriber_pb2_grpc.TranscriberStub(channel), [clip], {})
        sent = refused_then_taken(server, lambda: send()(0, 0))
        level = run_level(send, clients=1, each=1, n=1)
    assert sent.error is None and sent.refusals >= 1
    assert sent.latency is not None and sent.first is not None
    assert [s["error"] for s in level["sent"]] == [None] and level["clients"] == 1


def test_a_refused_http_request_waits_and_is_taken(server, shared_audio_dir) -> None:
    clip = (shared_audio_dir / "jfk.flac").read_bytes()
    send = http_sender(server.server.http_port, [clip], {"beam_size": "1"}, stream=True)
    client = send()
    plain = refused_then_taken(server, lambda: client(0, 0))  # k even: json
    streamed = refused_then_taken(server, lambda: client(0, 1))  # k odd: stream=true
    for sent in (plain, streamed):
        assert sent.error is None and sent.refusals >= 1
        assert "country" in (sent.text or "")
    assert plain.first is None and streamed.first is not None


def test_live_words_match_the_reference_word_of_their_own_repetition() -> None:
    """A clip said twice, 10 s apart; the live finals miss the first "not" and say "you" for
    "your": each final word pairs with the reference word of the same text ending within 1 s
    of its own end, never with the other repetition's (matching by text alone once paired
    jfk x 3's words with the previous repetition's in benchmarks.streaming: 12.8 s read)."""
    from benchmarks.live_match import matched_delays

    said = [("ask", 1.0), ("not", 1.5), ("your", 2.0), ("country.", 2.5)]
    ref = said + [(w, end + 10.0) for w, end in said]
    live = [("ask", 1.1, 1.6), ("you", 2.0, 2.6), ("country", 2.4, 3.0)]
    live += [("ask", 11.0, 11.5), ("not", 11.6, 12.0), ("your", 12.0, 12.4)]
    delays = matched_delays(ref, live)
    assert delays == pytest.approx([0.6, 0.5, 0.5, 0.5, 0.4])
