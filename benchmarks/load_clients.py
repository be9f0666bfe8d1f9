"""The clients of benchmarks.load, in a process of their own (benchmarks.workers.Workers), so
that they share neither the server's GIL nor its memory.

`cases(spec)` builds one case per load level (face, decoding, clients), the live streams and
the mixed load; each returns its raw samples as JSON (benchmarks.load summarises them).
Clients send the clips back to back, client i's k-th request the clip (i + k * clients) mod n:

- gRPC: StreamTranscribe as benchmarks.grpc_load (float16 rows of the mean alignment head),
  over one channel without gRPC's own retries; the first text token is the time to the first
  token;
- HTTP: POST /v1/audio/transcriptions over a kept-alive connection per client
  (benchmarks.http_api's form and connection), response_format json and stream=true in turn
  (ours; the peer has no stream, so json only): the latency is to the whole text either way,
  the time to the first token is the first `transcript.text.delta`.

A refusal (gRPC RESOURCE_EXHAUSTED: its `retry-after-ms` trailing metadata, else the "retry
in about N ms" of its message; HTTP 429: its Retry-After seconds) is waited out and the request
sent again; it counts as a refusal, not a failure, and the latency runs from the first attempt.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc

from benchmarks.grpc_load import percentile, streamed
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

T = TypeVar("T")
RETRY_AFTER_MS = ("retry-after-ms", "grpc-retry-pushback-ms")  # service.grpc.servicer's keys
HINTED = re.compile(r"retry in about (\d+) ms")
DEFAULT_WAIT = 1.0  # seconds, when a refusal names no wait
GIVE_UP = 600.0  # seconds of refusals after which a request counts as failed
DECODINGS = {  # the decoding's options per face: beam 5 is the server's default (unset)
    "beam 5": ({}, {}),
    "greedy": ({"beam_size": 1, "best_of": 1}, {"beam_size": "1", "best_of": "1"}),
}


class Refused(Exception):
    """The server refused for now; `wait` is the seconds it asked for."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"refused: retry in {wait:g} s")
        self.wait = wait


@dataclass
class Sent:
    """One request: its clip, seconds from the first attempt to the whole text and to the
    first text (None: none came), refusals before it was taken, its text, or its error, and
    when it ended."""

    clip: int
    latency: float | None = None
    first: float | None = None
    refusals: int = 0
    text: str | None = None
    error: str | None = None
    end: float | None = None  # when it ended (time.perf_counter; run_level: from the start)


def grpc_wait(error: grpc.RpcError) -> float | None:
    """Seconds a RESOURCE_EXHAUSTED refusal asks to wait; None for any other error."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    metadata = dict(error.trailing_metadata() or ())
    for key in RETRY_AFTER_MS:
        if str(metadata.get(key, "")).isdigit():
            return int(metadata[key]) / 1000
    hinted = HINTED.search(error.details() or "")
    return int(hinted.group(1)) / 1000 if hinted else DEFAULT_WAIT


def http_wait(status: int, retry_after: str | None) -> float | None:
    """Seconds an HTTP 429 asks to wait (Retry-After: seconds); None for any other status."""
    if status != 429:
        return None
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else DEFAULT_WAIT
    except ValueError:  # an HTTP date: not sent by either server
        return DEFAULT_WAIT


def retrying(
    attempt: Callable[[], T], sleep: Callable[[float], None] = time.sleep, give_up: float = GIVE_UP
) -> tuple[T, int, float]:
    """attempt() until it is not refused: (its value, the refusals, seconds from the first
    attempt's start to the last one's). Waits what each refusal asks; raises TimeoutError
    once the waits pass `give_up` seconds."""
    refusals, waited, t0 = 0, 0.0, time.perf_counter()
    while True:
        start = time.perf_counter()
        try:
            return attempt(), refusals, start - t0
        except Refused as e:
            refusals += 1
            waited += e.wait
            if waited > give_up:
                raise TimeoutError(f"refused {refusals} times over {waited:.0f} s") from e
            sleep(e.wait)


def grpc_attempt(
    stub: transcriber_pb2_grpc.TranscriberStub, data: bytes, options: pb.TranscriptionOptions
) -> tuple[float, float | None, str | None]:
    try:
        total, first = streamed(stub, data, options, first_text=True)
    except grpc.RpcError as e:
        wait = grpc_wait(e)
        if wait is None:
            raise
        raise Refused(wait) from e
    return total, first or None, None


def http_attempt(conn: Any, body: bytes, stream: bool) -> tuple[float, float | None, str]:
    """One POST over `conn` (benchmarks.http_api.Http), reconnecting once if the server had
    closed the kept-alive connection; after an error the connection is closed (the next
    request opens another)."""
    t0 = time.perf_counter()
    try:
        return _http_reply(conn, body, stream, t0)
    except Refused:
        raise  # its body was read: the connection goes on
    except BaseException:
        conn.conn.close()
        raise


def _http_reply(conn: Any, body: bytes, stream: bool, t0: float) -> tuple[float, float | None, str]:
    for again in (False, True):
        try:
            reply = conn.post(body)
            break
        except (http.client.RemoteDisconnected, ConnectionError):
            conn.conn.close()
            if again:
                raise
    if reply.status != 200:
        payload = reply.read()
        wait = http_wait(reply.status, reply.getheader("Retry-After"))
        if wait is None:
            raise RuntimeError(f"HTTP {reply.status}: {payload[:300]!r}")
        raise Refused(wait)
    if not stream:
        text = json.loads(reply.read())["text"]
        return time.perf_counter() - t0, None, text
    first, text = None, None
    for line in reply:  # SSE: "data: {...}" lines
        if not line.startswith(b"data:"):
            continue
        event = json.loads(line[5:])
        if event["type"] == "transcript.text.delta" and first is None and event["delta"]:
            first = time.perf_counter() - t0
        elif event["type"] == "transcript.text.done":
            text = event["text"]
        elif event["type"] == "error":
            raise RuntimeError(f"stream error: {event['error']}")
    if text is None:
        raise RuntimeError("the stream ended without transcript.text.done")
    return time.perf_counter() - t0, first, text


def timed(clip: int, attempt: Callable[[], tuple[float, float | None, str | None]]) -> Sent:
    """One request with its retries, never raising: its Sent."""
    try:
        (total, first, text), refusals, offset = retrying(attempt)
    except Exception as e:  # noqa: BLE001 - a failed request is a figure, not an end
        return Sent(clip, error=f"{type(e).__name__}: {e}"[:300], end=time.perf_counter())
    first = None if first is None else offset + first
    return Sent(clip, offset + total, first, refusals, text, end=time.perf_counter())


def case_name(face: str, decoding: str, clients: int) -> str:
    return f"{face} {decoding} {clients}"


def clip_of(client: int, k: int, clients: int, n: int) -> int:
    """The clip client `client` sends as its k-th request (every clip in turn overall)."""
    return (client + k * clients) % n


def run_level(
    sender: Callable[[], Callable[[int, int], Sent]], clients: int, each: int, n: int
) -> dict[str, Any]:
    """`clients` threads, each with the send function `sender()` makes for it (its own
    connection), sending `each` requests back to back: every Sent (`end` from the start), the
    wall time, and `busy`: the seconds until the first client sent its last request's end,
    while every client was sending (the rest is the drain, fewer clients at a time)."""
    senders = [sender() for _ in range(clients)]
    senders[0](0, 0)  # one untimed request first (the peer loads its model on the first)

    def client(i: int) -> list[Sent]:
        return [senders[i](clip_of(i, k, clients, n), k) for k in range(each)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        per_client = list(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    sent = [replace(s, end=(s.end or t0) - t0) for ss in per_client for s in ss]
    busy = min(max(s.end or t0 for s in ss) for ss in per_client) - t0
    return {"clients": clients, "wall": wall, "busy": busy, "sent": [asdict(s) for s in sent]}


def grpc_sender(
    stub: transcriber_pb2_grpc.TranscriberStub, clips: list[bytes], options: dict
) -> Callable[[], Callable[[int, int], Sent]]:
    opts = pb.TranscriptionOptions(**options)
    return lambda: lambda clip, k: timed(clip, lambda: grpc_attempt(stub, clips[clip], opts))


def http_sender(
    port: int, clips: list[bytes], fields: dict, stream: bool
) -> Callable[[], Callable[[int, int], Sent]]:
    """Per client a connection; request k is json, or (`stream`) stream=true when k is odd."""
    from benchmarks.http_api import Http, form  # its results import brings torch: here only

    bodies = [[form(c, fields), form(c, {**fields, "stream": "true"})] for c in clips]

    def make() -> Callable[[int, int], Sent]:
        conn = Http(port)
        kind = (lambda k: k % 2) if stream else (lambda k: 0)
        return lambda clip, k: timed(
            clip, lambda: http_attempt(conn, bodies[clip][kind(k)], kind(k) == 1)
        )

    return make


def live(address: str, streams: list[list[str]], speed: float) -> dict[str, Any]:
    """benchmarks.streaming's live streams and commit delays: each stream's clips joined by
    1 s of silence, its offline reference first (while nothing else runs), then the first
    stream alone, then all of them at once."""
    from benchmarks.streaming import RATE, one_stream, reference_words
    from xattn.clients.streaming import read_pcm16

    gap = bytes(2 * RATE)
    pcms = [gap.join(read_pcm16(p) for p in group) for group in streams]
    refs = [reference_words(address, pcm) for pcm in pcms]

    def run(i: int) -> dict[str, Any]:
        r = one_stream(address, pcms[i], speed, refs[i], None)
        return {
            "delays": r.delays,
            "matched": r.matched,
            "words": r.reference_words,
            "steps": r.done.decode_steps,
            "encode s": r.done.encode_seconds,
            "audio s": len(pcms[i]) / 2 / RATE,
        }

    alone = [run(0)]
    with ThreadPoolExecutor(len(pcms)) as pool:
        together = list(pool.map(run, range(len(pcms))))
    return {"alone": alone, "together": together}


def mixed(
    stub: transcriber_pb2_grpc.TranscriberStub,
    clips: list[bytes],
    long: bytes,
    clients: int,
    each: int,
) -> dict[str, Any]:
    """`clients` short-clip clients (beam 5), `each` requests apiece alone; then again beside
    one long request, until it is done: the short requests started while it ran."""
    send = grpc_sender(stub, clips, {})
    alone = run_level(send, clients, each, len(clips))
    done = threading.Event()
    beside: list[Sent] = []

    def client(i: int) -> None:
        k = 0
        while not done.is_set():
            beside.append(send()(clip_of(i, k, clients, len(clips)), k))
            k += 1

    with ThreadPoolExecutor(clients + 1) as pool:
        t0 = time.perf_counter()
        whole = pb.TranscriptionOptions()  # beam 5, as the short ones
        longest = pool.submit(timed, -1, lambda: grpc_attempt(stub, long, whole))
        time.sleep(0.2)  # it is admitted first
        shorts = [pool.submit(client, i) for i in range(clients)]
        long_sent = longest.result()
        done.set()
        for f in shorts:
            f.result()
        wall = time.perf_counter() - t0
    return {
        "alone": alone,
        "beside": [asdict(s) for s in beside],
        "long": asdict(long_sent),
        "wall": wall,
    }


def cases(spec: Mapping[str, Any]) -> dict[str, Callable[[], str]]:
    """{name: run() -> JSON} for Workers: "<face> <decoding> <clients>" per level (faces
    "gRPC", "HTTP" as `spec` has their addresses), "live" and "mixed" when asked. `spec`'s
    "peer": the HTTP server is faster-whisper-server, whose one model is the decoding already
    (benchmarks.load_peer): its form names the model, nothing else, and never streams."""
    clips = [Path(p).read_bytes() for p in spec["clips"]]
    n, out = len(clips), {}
    peer = spec.get("peer")
    if "gRPC" in spec:
        channel = grpc.insecure_channel(spec["gRPC"])  # no retry policy: refusals are seen
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
    for decoding in spec.get("decodings", ()):
        options, fields = DECODINGS[decoding]
        senders = {}
        if "gRPC" in spec:
            senders["gRPC"] = grpc_sender(stub, clips, options)
        if "HTTP" in spec:
            form = {"model_name": peer} if peer else fields
            senders["HTTP"] = http_sender(spec["HTTP"], clips, form, stream=not peer)
        for face, make in senders.items():
            for clients, each in spec["levels"]:
                out[case_name(face, decoding, clients)] = lambda m=make, c=clients, e=each: (
                    json.dumps(run_level(m, c, e, n))
                )
    if "live" in spec:
        live_spec = spec["live"]
        out["live"] = lambda: json.dumps(
            live(spec["gRPC"], live_spec["streams"], live_spec["speed"])
        )
    if "mixed" in spec:
        m = spec["mixed"]
        out["mixed"] = lambda: json.dumps(
            mixed(stub, clips, Path(m["long"]).read_bytes(), m["clients"], m["each"])
        )
    return out


def ended_within(sent: list[Mapping[str, Any]], busy: float) -> list[Mapping[str, Any]]:
    """The requests that succeeded and ended within the first `busy` seconds (while every
    client was sending: run_level)."""
    return [s for s in sent if s["error"] is None and s.get("end") is not None and s["end"] <= busy]


def busy_rate(sent: list[Mapping[str, Any]], busy: float) -> float:
    """Requests a second that ended within the first `busy` seconds, the rate without the
    drain."""
    return len(ended_within(sent, busy)) / busy


def summary(sent: list[Mapping[str, Any]], wall: float) -> dict[str, Any]:
    """Requests, refusals and failures; req/s; latency p50/p99/mean and first-text p50 (s)."""
    ok = [s for s in sent if s["error"] is None]
    latencies = [s["latency"] for s in ok]
    firsts = [s["first"] for s in ok if s["first"] is not None]
    return {
        "requests": len(ok),
        "refused": sum(s["refusals"] for s in sent),
        "refused requests": sum(1 for s in sent if s["refusals"]),
        "failed": len(sent) - len(ok),
        "rps": len(ok) / wall,
        "p50": percentile(latencies, 50) if latencies else None,
        "p99": percentile(latencies, 99) if latencies else None,
        "mean": sum(latencies) / len(latencies) if latencies else None,
        "ttft": percentile(firsts, 50) if firsts else None,
        "errors": sorted({s["error"] for s in sent if s["error"]})[:3],
    }
