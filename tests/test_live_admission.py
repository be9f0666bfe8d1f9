"""Live capacity and who goes next: real servers on loopback ports, real clients, tiny.en.

- GetModelInfo says how many live streams each model holds at the lag target (measured at
  start-up, or as given by --max-live-streams).
- Beyond it, the next live stream is refused at once: RESOURCE_EXHAUSTED with a retry hint
  (gRPC), an `error` event server_busy with the hint (Realtime, Wyoming); the first goes on.
- Live streams do not count as queued file work: a file beside a live stream is admitted.
- Rounds: streams that always have audio never wait for another stream's two whole steps
  (the observer's step spans, by request id), and concurrent steps share batched decoder
  steps (the batcher's observer sees rows > 1).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import openai
import pytest
import torch
import torchaudio.functional as AF
from openai_ref import pipeline
from wording import LIVE_SLACK, word_distance
from wyoming_client import command

from xattn.model.audio.features import decode_audio
from xattn.model.live.types import LiveOptions
from xattn.model.live.window import SHORT_BUFFER
from xattn.service.__main__ import config_from_args, parse_args
from xattn.service.background import BackgroundServer
from xattn.service.engine import live_rounds
from xattn.service.engine.limits import live_defaults
from xattn.service.engine.live_admission import (
    LiveAdmission,
    measure_step,
    streams_for,
    voiced_audio,
)
from xattn.service.engine.observe import NO_SPAN, Observer, current_request
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

RATE = 16000
Request = pb.StreamingRecognizeRequest
Stub = transcriber_pb2_grpc.TranscriberStub
WAIT = 120.0  # seconds: a bound on event waits on a busy machine, never a pace


@pytest.fixture(scope="module")
def jfk_pcm(jfk_path: Path) -> bytes:
    return (decode_audio(jfk_path) * 32767).astype("<i2").tobytes()


def config(**kw: object) -> Request:
    return Request(
        config=pb.StreamingRecognitionConfig(encoding=pb.PCM_ENCODING_INT16, sample_rate=RATE, **kw)
    )


def test_capacity_sizing_and_flags() -> None:
    assert streams_for(1.0, 0.3) == 3 and streams_for(1.0, 2.0) == 1 and streams_for(1, 0) == 1
    given = LiveAdmission("m", 1.0, max_streams=2, step_seconds=0.1)
    assert given.max_streams == 2 and given.refusal(1) is None
    refused = given.refusal(2)
    assert refused is not None and "2 live streams of m" in refused.why
    assert refused.retry_seconds > 0
    assert LiveAdmission("m", 1.0, step_seconds=0.3).max_streams == 3  # measured
    assert LiveAdmission("m", 1.0, step_seconds=4.0).max_streams == 1
    audio = voiced_audio(2.0)
    assert audio.dtype == np.float32 and audio.shape == (2 * RATE,) and 0 < np.abs(audio).max() < 1
    args = parse_args(["--live-lag-target", "0.5", "--max-live-streams", "3"])
    c = config_from_args(args)
    assert (c.live_lag_target, c.max_live_streams) == (0.5, 3)
    assert config_from_args(parse_args([])).max_live_streams == 0  # measured


def test_the_step_that_sizes_the_capacity_is_a_median_of_three() -> None:
    """measure_step runs three pairs of steps (one untimed, one timed) with the options given."""
    pipe = pipeline("tiny.en")
    frames: list[int] = []
    hook = pipe.model.encoder.register_forward_hook(lambda _m, a, _o: frames.append(a[0].shape[-1]))
    try:
        step = measure_step(pipe, LiveOptions(encode_margin=2.0, max_buffer=12.0), seconds=12.0)
    finally:
        hook.remove()
    assert step > 0
    # 11 s + 2 s, then 12 s + 2 s, each with the window's last second: short windows, as asked
    assert frames == [1400, 1500] * 3


def test_measured_capacity_in_model_info() -> None:
    """Capacity measured with the live steps' encoder (--live-compute int8), both said."""
    config = ServerConfig(port=0, live_compute="int8")
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        with grpc.insecure_channel(server.address) as channel:
            info = Stub(channel).GetModelInfo(pb.GetModelInfoRequest())
        admission = server.engine._models[info.model_name].admission
    assert admission.step_seconds > 0  # measured: a live step timed at start-up
    assert info.limits.max_live_streams == admission.max_streams >= 1
    assert info.limits.live_lag_target_seconds == 1.0
    assert info.models[0].limits.max_live_streams == info.limits.max_live_streams
    assert info.limits.live_compute == info.models[0].limits.live_compute == "int8"
    assert info.limits.live_beam_size == 1  # the default: greedy steps


def test_a_short_live_window_is_measured_and_served(jfk_path: Path) -> None:
    """--live-window short: the live steps' defaults and the start-up step that sizes the
    capacity encode short windows, and a stream reads jfk through them within a word of the
    offline text."""
    assert config_from_args(parse_args(["--live-window", "short"])).live_window == "short"
    assert config_from_args(parse_args([])).live_window == "whole"
    with pytest.raises(SystemExit):
        parse_args(["--live-window", "half"])
    assert config_from_args(parse_args(["--live-beam-size", "1"])).live_beam_size == 1
    for bad in ("0", "17"):
        with pytest.raises(SystemExit):
            config_from_args(parse_args(["--live-beam-size", bad]))
    pcm = (decode_audio(jfk_path) * 32767).astype("<i2").tobytes()
    config = ServerConfig(port=0, live_window="short")
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        assert server.engine.limits.live_margin == 2.0
        assert live_defaults(server.engine.limits).max_buffer == SHORT_BUFFER  # 12 s
        assert all(m.admission.step_seconds > 0 for m in server.engine._models.values())
        with grpc.insecure_channel(server.address) as channel:
            stub = Stub(channel)
            offline = stub.Transcribe(
                pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes()))
            )
            first = pb.StreamingRecognizeRequest(
                config=pb.StreamingRecognitionConfig(
                    encoding=pb.PCM_ENCODING_INT16, sample_rate=16000
                )
            )
            chunks = [pcm[at : at + 32000] for at in range(0, len(pcm), 32000)]  # 1 s each
            requests = [first, *(pb.StreamingRecognizeRequest(audio_content=c) for c in chunks)]
            responses = list(stub.StreamingRecognize(iter(requests), timeout=120))
    done = responses[-1].done
    # the chunks come as fast as the channel takes them: on a loaded machine all of them may
    # arrive before the first step, which then decodes the whole clip
    assert done.audio_seconds == pytest.approx(11.0, abs=0.01) and done.decode_steps >= 1
    assert word_distance(done.text, offline.transcript.text) <= LIVE_SLACK, done.text


@pytest.fixture(scope="module")
def one_live() -> Iterator[BackgroundServer]:
    """One live stream at most; a file queue that a live stream must not look full."""
    config = ServerConfig(
        port=0,
        http_port=0,
        wyoming_port=0,
        workers=1,
        max_queue=4,
        max_queue_wait=0.001,
        max_live_streams=1,
    )
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        yield server


def holding_stream(
    stub: Stub, pcm: bytes, go: threading.Event
) -> Iterator[pb.StreamingRecognizeResponse]:
    """A live stream that sends 2 s, then waits for `go` before its last second."""

    def requests() -> Iterator[Request]:
        yield config(interim_results=True)
        yield Request(audio_content=pcm[: 4 * RATE])
        go.wait(WAIT)
        yield Request(audio_content=pcm[4 * RATE : 6 * RATE])

    return stub.StreamingRecognize(requests(), timeout=WAIT)


def test_second_live_stream_refused_first_goes_on(
    one_live: BackgroundServer, jfk_pcm: bytes, jfk_path: Path
) -> None:
    server = one_live
    go = threading.Event()
    with grpc.insecure_channel(server.address) as channel:
        stub = Stub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.limits.max_live_streams == 1
        first = holding_stream(stub, jfk_pcm, go)
        try:
            got = next(first)  # its first step's result: it holds the slot
            assert got.HasField("result")
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.StreamingRecognize(iter([config(), Request(audio_content=b"\0" * 3200)])))
            error = refused.value
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            assert "live streams" in error.details() and "retry in about" in error.details()
            trailing = dict(error.trailing_metadata() or ())
            assert int(trailing["retry-after-ms"]) > 0
            # a file beside the live stream: the worker is free, the live stream is no queue
            reply = stub.Transcribe(
                pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes()))
            )
            assert reply.transcript.text.strip()
            realtime = realtime_refusal(server.http_address, jfk_path)
            assert realtime["code"] == "server_busy" and realtime["type"] == "server_error"
            assert "retry in about" in realtime["message"]
            wyoming = asyncio.run(command(server.server.wyoming_port, jfk_pcm[: 2 * RATE]))
            assert wyoming.error is not None and wyoming.error.data["code"] == "server_busy"
            assert "retry in about" in wyoming.error.data["text"]
        finally:
            go.set()
        rest = list(first)
    assert rest[-1].HasField("done") and rest[-1].done.audio_seconds == pytest.approx(3.0)
    assert rest[-1].done.text.strip()
    assert server.engine.counters().rejected == 3  # the gRPC, Realtime and Wyoming streams


def realtime_refusal(address: str, jfk_path: Path) -> dict:
    """A Realtime session's audio while the server is full: its `error` event's fields."""
    audio = AF.resample(torch.from_numpy(decode_audio(jfk_path)[: 2 * RATE]), 2, 3).numpy()
    pcm = base64.b64encode((audio * 32767).astype("<i2").tobytes()).decode("ascii")
    sdk = openai.AsyncOpenAI(
        base_url=f"http://{address}/v1", api_key="x", websocket_base_url=f"ws://{address}/v1"
    )

    async def session() -> dict:
        beta = sdk.beta.realtime
        async with beta.connect(model="whisper-1", extra_query={"intent": "transcription"}) as c:
            await c.transcription_session.update(session={"turn_detection": None})
            await c.input_audio_buffer.append(audio=pcm)
            while True:
                event = json.loads(await c.recv_bytes())
                if event["type"] == "error":
                    return event["error"]

    return asyncio.run(asyncio.wait_for(session(), WAIT))


class StepLog(Observer):
    """Records each live step's start and end by stream (its x-request-id), in order, and the
    batcher's rows per batched decoder step."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.rows: list[int] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def span(self, name: str, **attributes: str | int | float | bool) -> Iterator:
        if name != "xattn.live_step":
            yield NO_SPAN
            return
        scope = current_request()
        who = scope.request_id if scope is not None else "?"
        with self._lock:
            self.log.append((who, "start"))
        try:
            yield NO_SPAN
        finally:
            with self._lock:
                self.log.append((who, "end"))

    def encoded(self, windows: int, seconds: float) -> None:
        pass

    def stepped(self, rows: int, seconds: float) -> None:
        self.rows.append(rows)


def test_rounds_are_fair_and_share_batches(jfk_pcm: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three streams, each sending a minute of audio in one message: always due, each waits
    between two of its steps for at most one step of each other stream. A stream sends its
    results before it asks for its next step; a round waits GATHER s for that, and a loaded
    machine can take longer (the stream then misses a round, by design): here rounds wait
    for every stream, so the test holds the rule, not the machine's speed."""
    monkeypatch.setattr(live_rounds, "GATHER", WAIT)
    streams = 3
    with BackgroundServer(
        ServerConfig(port=0, max_live_streams=streams), pipeline("tiny.en")
    ) as server:
        recorder = StepLog()
        batcher = server.engine.pipeline.context.batcher
        assert batcher is not None
        before, server.engine.observer = server.engine.observer, recorder
        watching, batcher.observer = batcher.observer, recorder
        names = [f"stream-{i}" for i in range(streams)]

        def run(name: str, offset: int) -> list:
            pcm = (jfk_pcm[offset:] + jfk_pcm[:offset]) * 6  # 66 s
            with grpc.insecure_channel(server.address) as channel:
                call = Stub(channel).StreamingRecognize(
                    iter([config(), Request(audio_content=pcm)]),
                    timeout=WAIT,
                    metadata=(("x-request-id", name),),
                )
                return list(call)

        out: dict[str, list] = {}
        threads = [
            threading.Thread(target=lambda n=n, i=i: out.update({n: run(n, i * 2 * RATE)}))
            for i, n in enumerate(names)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        server.engine.observer, batcher.observer = before, watching
    assert sorted(out) == names and all(r[-1].HasField("done") for r in out.values())
    log = recorder.log
    for name in names:
        mine = [i for i, (who, _) in enumerate(log) if who == name]
        assert len(mine) >= 2 * 3  # three steps at least (the finish among them)
        ends, starts = mine[1::2], mine[2::2]
        for end, start in zip(ends, starts, strict=False):  # a wait between two of its steps
            for other in names:  # its whole steps in the wait (one of the same round can
                seen = [what for who, what in log[end:start] if who == other]  # end in it)
                whole = sum(pair == ("start", "end") for pair in itertools.pairwise(seen))
                assert whole <= 1, (name, other, log[end : start + 1])
    assert max(recorder.rows) >= 2, "concurrent live steps never shared a batched step"
