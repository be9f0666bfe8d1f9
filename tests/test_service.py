"""The gRPC service end to end: a real server on an ephemeral port, real channels, tiny.en.

Token accounting, used below: a token event is streamed for every token the decoder
chooses. For each window, the accepted attempt's tokens are its segments' tokens in order
(timestamp tokens included, as openai-whisper keeps them: a boundary <|t|><|t|> pair gives
one to each segment) followed by the one end-of-text token that ends the attempt. Tokens of
a rejected attempt are followed by a window_discarded event. jfk.flac is one window, two
segments of 16 and 10 tokens, so 27 token events.
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import grpc
import numpy as np
import pytest
import soundfile as sf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from xattn.model.audio.features import decode_audio
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.engine.engine import Counters, Engine
from xattn.service.engine.rows import unpack
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

JFK_TEXT = (
    " And so my fellow Americans ask not what your country can do for you"
    " ask what you can do for your country"
)
MAX_AUDIO_SECONDS = 60.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
GREEDY = pb.TranscriptionOptions(temperatures=[0.0], beam_size=1)
T = TypeVar("T")
Stub = transcriber_pb2_grpc.TranscriberStub
Responses = list[pb.StreamTranscribeResponse]


@pytest.fixture(scope="session")
def pipeline() -> Pipeline:
    return load_pipeline("tiny.en")


@pytest.fixture(scope="module")
def server(pipeline: Pipeline) -> Iterator[BackgroundServer]:
    config = ServerConfig(port=0, workers=2, max_queue=16, max_audio_seconds=MAX_AUDIO_SECONDS)
    with BackgroundServer(config, pipeline) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server: BackgroundServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> Stub:
    return transcriber_pb2_grpc.TranscriberStub(channel)


@pytest.fixture(scope="module")
def jfk_audio(jfk_path: Path) -> pb.Audio:
    return pb.Audio(encoded=jfk_path.read_bytes())


@pytest.fixture(scope="module")
def short_pcm(jfk_path: Path) -> pb.Audio:
    """The first 2 s of jfk as 16 kHz int16 PCM: a quick good request."""
    samples = decode_audio(jfk_path.read_bytes())[:32000]
    data = (samples * 32767).astype("<i2").tobytes()
    return pb.Audio(pcm=pb.Pcm(data=data, sample_rate=16000, encoding=pb.PCM_ENCODING_INT16))


@pytest.fixture(scope="module")
def jfk_stream(stub: Stub, jfk_audio: pb.Audio) -> Responses:
    """One greedy StreamTranscribe of jfk: mean over the alignment heads, float16 (the
    service's default beam search: test_beam.py)."""
    request = pb.StreamTranscribeRequest(
        audio=jfk_audio, options=pb.TranscriptionOptions(beam_size=1)
    )
    return list(stub.StreamTranscribe(request, timeout=60))


@pytest.fixture(scope="module")
def jfk_unary(stub: Stub, jfk_audio: pb.Audio) -> pb.TranscribeResponse:
    """Transcribe of jfk with word timestamps and every head's rows as float32."""
    request = pb.TranscribeRequest(
        audio=jfk_audio,
        options=pb.TranscriptionOptions(word_timestamps=True, beam_size=1),
        alignment=pb.AlignmentOptions(
            mode=pb.ALIGNMENT_MODE_ALL_HEADS, data_type=pb.DATA_TYPE_FLOAT32
        ),
    )
    return stub.Transcribe(request, timeout=60)


def events(responses: Responses, kind: str) -> list:
    return [getattr(r, kind) for r in responses if r.WhichOneof("event") == kind]


def test_model_info(stub: Stub, pipeline: Pipeline) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.model_name == "tiny.en"
    assert info.dims.n_audio_ctx == 1500 and info.dims.n_mels == 80
    assert info.dims.n_text_layer == pipeline.dims.n_text_layer
    assert [(h.layer, h.head) for h in info.alignment_heads] == list(pipeline.alignment_heads)
    assert list(info.languages) == ["en"] and not info.multilingual
    assert info.alignment_frames_per_second == 50
    assert info.limits.max_audio_seconds == MAX_AUDIO_SECONDS
    assert info.limits.max_receive_message_bytes >= 58_000_000  # 30 min of 16 kHz int16 wav
    assert info.compute_type == "fp32" and info.device == "cpu"


def test_stream_tokens_rows_and_text(jfk_stream: Responses) -> None:
    kinds = [r.WhichOneof("event") for r in jfk_stream]
    assert kinds[0] == "window_start" and kinds[-1] == "done" and kinds.count("done") == 1
    assert "window_discarded" not in kinds
    tokens = events(jfk_stream, "token")
    done = jfk_stream[-1].done
    segments = done.transcript.segments
    assert [t.index for t in tokens] == list(range(len(tokens)))
    # every token before its window's segments, all before done
    assert max(i for i, k in enumerate(kinds) if k == "token") < kinds.index("segment")
    ids = [t.id for t in tokens]
    assert ids == [i for s in segments for i in s.tokens] + [50256]  # + end-of-text
    assert len(tokens) == sum(len(s.tokens) for s in segments) + 1 == 27
    assert tokens[-1].kind == pb.TOKEN_KIND_END_OF_TEXT
    assert tokens[0].kind == pb.TOKEN_KIND_TIMESTAMP and tokens[0].timestamp == 0.0
    assert "".join(t.text for t in tokens) == done.transcript.text == JFK_TEXT
    for t in tokens:
        assert list(t.alignment.shape) == [1, 1500]
        assert t.alignment.data_type == pb.DATA_TYPE_FLOAT16
        assert len(t.alignment.data) == 2 * 1500
        assert abs(float(unpack(t.alignment).sum()) - 1.0) < 1e-3
    assert events(jfk_stream, "segment") == list(segments)
    timings = done.timings
    assert timings.encode_seconds > 0 and timings.decode_seconds > 0
    assert timings.total_seconds >= timings.encode_seconds + timings.decode_seconds


def test_transcribe_matches_stream(
    jfk_unary: pb.TranscribeResponse, jfk_stream: Responses, pipeline: Pipeline
) -> None:
    stream_done = jfk_stream[-1].done.transcript
    assert jfk_unary.transcript.text == stream_done.text == JFK_TEXT
    assert [list(s.tokens) for s in jfk_unary.transcript.segments] == [
        list(s.tokens) for s in stream_done.segments
    ]
    (window,) = jfk_unary.windows
    tokens = events(jfk_stream, "token")
    assert list(window.token_ids) == [t.id for t in tokens]
    assert list(window.token_indices) == [t.index for t in tokens]
    assert window.num_frames == 550 and window.offset == 0.0
    matrix = unpack(window.matrix)  # [tokens, layers * heads, 1500]
    assert matrix.shape == (27, 24, 1500)
    np.testing.assert_allclose(matrix.sum(axis=-1), 1.0, atol=1e-5)
    picked = [layer * 6 + head for layer, head in pipeline.alignment_heads]
    mean = matrix[:, picked].mean(axis=1)  # what the stream's float16 rows hold
    streamed = np.stack([unpack(t.alignment)[0] for t in tokens])
    np.testing.assert_allclose(streamed, mean, atol=1e-3)


def test_word_timestamps(jfk_unary: pb.TranscribeResponse) -> None:
    for segment in jfk_unary.transcript.segments:
        words = segment.words
        assert words and "".join(w.word for w in words) == segment.text
        assert all(segment.start <= w.start <= w.end <= segment.end + 0.01 for w in words)
        assert all(0.0 <= w.probability <= 1.0 for w in words)
        assert all(a.end <= b.start + 1e-6 for a, b in zip(words, words[1:], strict=False))
    words = {w.word.strip(): w for s in jfk_unary.transcript.segments for w in s.words}
    assert 1.5 < words["Americans"].start < 2.1  # openai-whisper: 1.8 s


def test_eight_concurrent_streams(
    stub: Stub, jfk_audio: pb.Audio, jfk_unary: pb.TranscribeResponse, server: BackgroundServer
) -> None:
    all_heads = unpack(jfk_unary.windows[0].matrix)
    heads = [pb.AttentionHead(layer=3, head=1), pb.AttentionHead(layer=2, head=5)]
    requests = [
        pb.StreamTranscribeRequest(audio=jfk_audio, options=GREEDY),
        pb.StreamTranscribeRequest(
            audio=jfk_audio,
            alignment=pb.AlignmentOptions(heads=heads, data_type=pb.DATA_TYPE_FLOAT32),
            options=GREEDY,
        ),
        pb.StreamTranscribeRequest(
            audio=jfk_audio,
            alignment=pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_NONE),
            options=GREEDY,
        ),
    ]
    jobs = [requests[i % 3] for i in range(8)]
    batcher = server.engine.pipeline.context.batcher  # 2 workers: their steps are batched
    assert batcher is not None
    before = dataclasses.replace(batcher.stats)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: list(stub.StreamTranscribe(r, timeout=120)), jobs))
    assert len(results) == 8
    steps, batches = (batcher.stats.steps - before.steps, batcher.stats.batches - before.batches)
    assert steps == 8 * 26 and batches < steps  # 26 steps after each prompt, some shared
    for request, responses in zip(jobs, results, strict=True):
        tokens = events(responses, "token")
        assert responses[-1].done.transcript.text == JFK_TEXT
        assert "".join(t.text for t in tokens) == JFK_TEXT and len(tokens) == 27
        if request.alignment.heads:  # (3, 1), (2, 5) as float32: exactly those heads
            rows = np.stack([unpack(t.alignment) for t in tokens])  # [27, 2, 1500]
            np.testing.assert_allclose(rows, all_heads[:, [3 * 6 + 1, 2 * 6 + 5]], atol=1e-5)
        elif request.alignment.mode == pb.ALIGNMENT_MODE_NONE:
            assert not any(t.HasField("alignment") for t in tokens)
    assert server.engine.counters().in_flight == 0


def wait_idle(engine: Engine, timeout: float = 30.0) -> Counters:
    """The engine's counters once nothing is in flight."""
    deadline = time.monotonic() + timeout
    while (counters := engine.counters()).in_flight:
        assert time.monotonic() < deadline, f"still in flight: {counters}"
        time.sleep(0.02)
    return counters


def test_cancel_stops_the_work(stub: Stub, jfk_audio: pb.Audio, server: BackgroundServer) -> None:
    before = wait_idle(server.engine)
    request = pb.StreamTranscribeRequest(audio=jfk_audio, options=GREEDY)
    call = stub.StreamTranscribe(request, timeout=60)
    tokens = 0
    for response in call:
        tokens += response.WhichOneof("event") == "token"
        if tokens == 3:
            break
    call.cancel()
    after = wait_idle(server.engine)
    assert after.cancelled == before.cancelled + 1 and after.finished == before.finished
    assert after.tokens_decoded - before.tokens_decoded <= 13  # of 27 in a full run


def test_deadline_then_healthy(
    stub: Stub,
    channel: grpc.Channel,
    jfk_audio: pb.Audio,
    short_pcm: pb.Audio,
    server: BackgroundServer,
) -> None:
    before = wait_idle(server.engine)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=jfk_audio), timeout=0.05))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = wait_idle(server.engine)
    assert after.finished == before.finished and after.failed == before.failed
    assert after.tokens_decoded - before.tokens_decoded <= 3
    check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    good = stub.Transcribe(pb.TranscribeRequest(audio=short_pcm, options=GREEDY), timeout=30)
    assert good.transcript.text.strip()


def wav_bytes(seconds: float, rate: int = 8000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="WAV")
    return buffer.getvalue()


def pcm(data: bytes, encoding: int = pb.PCM_ENCODING_INT16) -> pb.Audio:
    return pb.Audio(pcm=pb.Pcm(data=data, sample_rate=16000, encoding=encoding))


NAN_PCM = np.array([0.0, np.nan, 0.1] * 1000, dtype="<f4").tobytes()
INVALID, TOO_LONG = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE
BAD_REQUESTS = {  # name: (audio or None for jfk, options, alignment, status, words in the message)
    "undecodable": (pb.Audio(encoded=b"not audio " * 50), None, None, INVALID, "cannot decode"),
    "empty file": (pb.Audio(encoded=b""), None, None, INVALID, "empty"),
    "no audio": (pb.Audio(), None, None, INVALID, "no audio"),
    "non-finite": (pcm(NAN_PCM, pb.PCM_ENCODING_FLOAT32), None, None, INVALID, "non-finite"),
    "pcm encoding unset": (pcm(b"\0\0" * 1000, 0), None, None, INVALID, "encoding"),
    "pcm too long": (pcm(bytes(2 * 16000 * 61)), None, None, TOO_LONG, "too long"),
    "file too long": (pb.Audio(encoded=wav_bytes(61)), None, None, TOO_LONG, "too long"),
    "unknown language": (None, pb.TranscriptionOptions(language="xx"), None, INVALID, "'xx'"),
    "negative temperature": (
        None,
        pb.TranscriptionOptions(temperatures=[0.0, -0.5]),
        None,
        INVALID,
        "temperature",
    ),
    "translate on tiny.en": (
        None,
        pb.TranscriptionOptions(task=pb.TASK_TRANSLATE),
        None,
        INVALID,
        "translate",
    ),
    "missing head": (
        None,
        None,
        pb.AlignmentOptions(heads=[pb.AttentionHead(layer=4, head=0)]),
        INVALID,
        "does not exist",
    ),
    # openai-whisper's and faster-whisper's options (model/decode/options.py): the field is named
    "suppress_tokens id": (
        None,
        pb.TranscriptionOptions(suppress_tokens=pb.TokenIds(ids=[-1, 60000])),
        None,
        INVALID,
        "suppress_tokens: 60000",
    ),
    "no_speech_threshold": (
        None,
        pb.TranscriptionOptions(no_speech_threshold=pb.Threshold(value=1.5)),
        None,
        INVALID,
        "no_speech_threshold must be in [0, 1]",
    ),
    "hallucination without words": (
        None,
        pb.TranscriptionOptions(hallucination_silence_threshold=2.0),
        None,
        INVALID,
        "hallucination_silence_threshold needs word_timestamps",
    ),
    "clip_timestamps": (
        None,
        pb.TranscriptionOptions(clip_timestamps=[4.0, 2.0]),
        None,
        INVALID,
        "clip_timestamps[1]",
    ),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_request_then_good(
    name: str, stub: Stub, jfk_audio: pb.Audio, short_pcm: pb.Audio, server: BackgroundServer
) -> None:
    audio, options, alignment, code, words = BAD_REQUESTS[name]
    fields = {"audio": audio or jfk_audio, "options": options, "alignment": alignment}
    for rpc, request in (
        (stub.Transcribe, pb.TranscribeRequest(**fields)),
        (
            lambda r, timeout: list(stub.StreamTranscribe(r, timeout=timeout)),
            pb.StreamTranscribeRequest(**fields),
        ),
    ):
        with pytest.raises(grpc.RpcError) as err:
            rpc(request, timeout=30)
        assert err.value.code() == code, err.value.details()
        assert words in err.value.details()
    good = stub.Transcribe(pb.TranscribeRequest(audio=short_pcm, options=GREEDY), timeout=30)
    assert good.transcript.text.strip()
    assert wait_idle(server.engine).failed == 0


def test_overload_is_resource_exhausted_with_retry_hint(
    pipeline: Pipeline, jfk_audio: pb.Audio
) -> None:
    error_details_pb2 = pytest.importorskip("google.rpc.error_details_pb2")  # grpcio-status
    status_pb2 = pytest.importorskip("google.rpc.status_pb2")
    small = BackgroundServer(ServerConfig(port=0, workers=1, max_queue=0), pipeline)
    try:
        with grpc.insecure_channel(small.address) as ch:
            stub = transcriber_pb2_grpc.TranscriberStub(ch)
            running = stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=jfk_audio), timeout=60)
            assert next(running).WhichOneof("event") == "window_start"  # admitted, running
            with pytest.raises(grpc.RpcError) as err:
                stub.Transcribe(pb.TranscribeRequest(audio=jfk_audio), timeout=10)
            running.cancel()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(err.value.trailing_metadata())
        assert int(trailing["retry-after-ms"]) > 0
        status = status_pb2.Status.FromString(trailing["grpc-status-details-bin"])
        retry = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(retry) and retry.retry_delay.ToMilliseconds() > 0
        assert wait_idle(small.engine).rejected == 1
        assert trailing["grpc-retry-pushback-ms"] == trailing["retry-after-ms"]
    finally:
        small.stop()


def test_builtin_grpc_retries_follow_the_pushback(pipeline: Pipeline, jfk_audio: pb.Audio) -> None:
    """A client whose service config retries RESOURCE_EXHAUSTED waits as told and gets in."""
    import json
    import threading

    policy = {
        "maxAttempts": 5,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
    }
    config = {
        "methodConfig": [{"name": [{"service": "xattn.v1.Transcriber"}], "retryPolicy": policy}]
    }
    options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    small = BackgroundServer(ServerConfig(port=0, workers=1, max_queue=0), pipeline)
    try:
        with grpc.insecure_channel(small.address, options=options) as ch:
            stub = transcriber_pb2_grpc.TranscriberStub(ch)
            running = stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=jfk_audio), timeout=60)
            assert next(running).WhichOneof("event") == "window_start"  # the only slot is taken
            drain = threading.Thread(target=lambda: list(running))
            drain.start()
            short = pb.Audio(pcm=pb.Pcm(data=bytes(16000), sample_rate=16000, encoding=1))
            reply = stub.Transcribe(pb.TranscribeRequest(audio=short), timeout=60)
            drain.join(60)
        assert reply.transcript is not None
        counters = wait_idle(small.engine)
        assert counters.rejected >= 1 and counters.finished == 2  # refused, retried, served
    finally:
        small.stop()
