"""StreamingRecognize end to end: a real server on an ephemeral port, real channels, tiny.en.

jfk.flac (11 s) is sent as 100 ms int16 chunks at 4x real time. The live transcript is held
to the offline Transcribe text within one word (case and punctuation aside). How the audio is
cut into decode steps depends on the load; tests/test_streaming_model.py holds the policy to
the offline text over several cuts in-process (it gives the offline words on each of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from openai_ref import pipeline
from wording import LIVE_SLACK, word_distance, words_of

from xattn.model.audio.features import decode_audio
from xattn.service.background import BackgroundServer
from xattn.service.engine.rows import unpack
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
RATE = 16000
CHUNK = 3200  # bytes: 100 ms of 16 kHz int16 mono
IDLE_TIMEOUT = 1.5
MAX_LIVE_SECONDS = 12.0
Stub = transcriber_pb2_grpc.TranscriberStub
Request = pb.StreamingRecognizeRequest


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(
        port=0,
        workers=1,
        max_queue=1,  # two streams at once; a third is refused
        max_live_streams=4,  # by the queue's slots, not the live capacity
        live_idle_timeout=IDLE_TIMEOUT,
        live_max_seconds=MAX_LIVE_SECONDS,
    )
    with BackgroundServer(config, pipeline("tiny.en")) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: BackgroundServer) -> Iterator[Stub]:
    with grpc.insecure_channel(server.address) as channel:
        yield transcriber_pb2_grpc.TranscriberStub(channel)


@pytest.fixture(scope="module")
def jfk_pcm(jfk_path: Path) -> bytes:
    return (decode_audio(jfk_path) * 32767).astype("<i2").tobytes()


def config(**kw: object) -> Request:
    fields = {"encoding": pb.PCM_ENCODING_INT16, "sample_rate": RATE, "interim_results": True}
    return Request(config=pb.StreamingRecognitionConfig(**{**fields, **kw}))


def paced(first: Request, pcm: bytes, speed: float, sent: list[float]) -> Iterator[Request]:
    """`first`, then `pcm` in 100 ms chunks at `speed` x real time; `sent` gets the end time."""
    yield first
    t0 = time.monotonic()
    for at in range(0, len(pcm), CHUNK):
        time.sleep(max(0.0, t0 + (at + CHUNK) / (2 * RATE) / speed - time.monotonic()))
        yield Request(audio_content=pcm[at : at + CHUNK])
    sent.append(time.monotonic())


def fail(stub: Stub, requests: Iterable[Request]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.StreamingRecognize(iter(requests), timeout=60))
    return info.value


def serves(stub: Stub, pcm: bytes) -> None:
    """A good short stream still works."""
    responses = list(stub.StreamingRecognize(iter([config(), Request(audio_content=pcm)])))
    assert responses[-1].HasField("done")
    assert responses[-1].done.audio_seconds == pytest.approx(len(pcm) / 2 / RATE)


def test_live_stream_matches_offline(
    stub: Stub, server: BackgroundServer, jfk_pcm: bytes, jfk_path: Path
) -> None:
    offline = stub.Transcribe(pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes())))
    sent: list[float] = []
    arrivals: list[tuple[float, pb.StreamingRecognizeResponse]] = []
    for response in stub.StreamingRecognize(paced(config(), jfk_pcm, 4.0, sent), timeout=120):
        arrivals.append((time.monotonic(), response))
    responses = [r for _, r in arrivals]
    assert responses[-1].HasField("done") and all(r.HasField("result") for r in responses[:-1])
    done = responses[-1].done
    results = [r.result for r in responses[:-1]]
    finals = [r for r in results if r.is_final]
    text = "".join(r.text for r in finals)
    assert done.text == text and done.language == "en"
    assert done.audio_seconds == pytest.approx(11.0, abs=0.01)
    assert done.final_results == len(finals) and done.decode_steps >= 2
    assert word_distance(text, offline.transcript.text) <= LIVE_SLACK, (
        text,
        offline.transcript.text,
    )
    # finals are never revised: each final token once, in order, numbered 0, 1, 2 ...
    final_tokens = [t for r in finals for t in r.tokens]
    assert (
        [t.index for t in final_tokens]
        == list(range(len(final_tokens)))
        == list(range(done.tokens))
    )
    assert "".join(t.text for t in final_tokens) == text
    words = [w for r in finals for w in r.words]
    assert words_of("".join(w.word for w in words)) == words_of(text)
    assert all(a.start <= b.start for a, b in zip(words, words[1:], strict=False))
    assert 0 <= words[0].start and words[-1].end <= 11.1
    # an interim result, decided before the audio ended, precedes the last final
    interim = [r for r in results if not r.is_final]
    assert interim and interim[0].audio_seconds < 11.0
    assert all(0 <= r.stability <= 1 for r in interim)
    assert results.index(interim[0]) < results.index(finals[-1])
    # every row: [1, 1500] float16 summing to 1; the peak lies in the audio the window holds
    for r in results:
        for t in r.tokens:
            row = unpack(t.alignment)
            assert row.shape == (1, 1500) and t.alignment.data_type == pb.DATA_TYPE_FLOAT16
            assert abs(float(row.sum()) - 1.0) < 1e-3
            assert r.buffer_offset <= t.peak_time <= r.buffer_offset + 30.0
    assert server.engine.counters().in_flight == 0


def test_a_stream_of_five_beams(stub: Stub, jfk_pcm: bytes, jfk_path: Path) -> None:
    """policy.beam_size 5 (the server's default is greedy): the steps' decodes search five
    beams through the server's batched turns, and the finals read as a file's transcript."""
    offline = stub.Transcribe(pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes())))
    chunks = [jfk_pcm[at : at + 2 * RATE] for at in range(0, len(jfk_pcm), 2 * RATE)]  # 1 s
    first = config(policy=pb.LivePolicy(beam_size=5), interim_results=False)
    requests = [first, *(Request(audio_content=c) for c in chunks)]
    responses = list(stub.StreamingRecognize(iter(requests), timeout=120))
    done = responses[-1].done
    assert responses[-1].HasField("done") and done.decode_steps >= 1
    assert word_distance(done.text, offline.transcript.text) <= LIVE_SLACK, (
        done.text,
        offline.transcript.text,
    )


@pytest.mark.parametrize(
    ("requests", "code", "words"),
    [
        ([Request(audio_content=b"\0\0")], "INVALID_ARGUMENT", "config"),
        ([config(encoding=pb.PCM_ENCODING_UNSPECIFIED)], "INVALID_ARGUMENT", "encoding"),
        ([config(sample_rate=44100)], "INVALID_ARGUMENT", "16000"),
        ([config(), Request(audio_content=b"\0\0\0")], "INVALID_ARGUMENT", "whole samples"),
        ([config(), config()], "INVALID_ARGUMENT", "config"),
        ([config(language="xx")], "INVALID_ARGUMENT", "language"),
        ([config(policy=pb.LivePolicy(beam_size=17))], "INVALID_ARGUMENT", "beam_size"),
        ([config(), Request()], "INVALID_ARGUMENT", "audio_content"),
        (
            [config(), Request(audio_content=bytes(int(2 * RATE * (MAX_LIVE_SECONDS + 1))))],
            "OUT_OF_RANGE",
            "too long",
        ),
    ],
)
def test_errors_then_serves(
    stub: Stub, jfk_pcm: bytes, requests: list[Request], code: str, words: str
) -> None:
    error = fail(stub, requests)
    assert error.code().name == code, error.details()
    assert words in error.details()
    serves(stub, jfk_pcm[: 2 * RATE])


def test_idle_stream_ends_with_deadline_exceeded(stub: Stub, jfk_pcm: bytes) -> None:
    def quiet() -> Iterator[Request]:
        yield config()
        yield Request(audio_content=jfk_pcm[:CHUNK])
        time.sleep(IDLE_TIMEOUT + 1.5)  # then the client half-closes, too late

    t0 = time.monotonic()
    error = fail(stub, quiet())
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
    assert "idle" in error.details() and time.monotonic() - t0 < IDLE_TIMEOUT + 10
    serves(stub, jfk_pcm[: 2 * RATE])


def test_admission_and_cancel(stub: Stub, server: BackgroundServer, jfk_pcm: bytes) -> None:
    """Two streams hold the two slots (1 worker + 1 queued); a third is refused. Cancelling
    frees them."""
    stop = threading.Event()

    def open_stream() -> Iterator[Request]:
        yield config()
        while not stop.wait(0.2):
            yield Request(audio_content=jfk_pcm[:CHUNK])

    calls = [stub.StreamingRecognize(open_stream()) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while server.engine.counters().in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        error = fail(stub, [config()])
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    finally:
        before = server.engine.counters().cancelled
        for call in calls:
            call.cancel()
        stop.set()
    deadline = time.monotonic() + 30
    while (c := server.engine.counters()).in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.in_flight == 0 and c.cancelled == before + 2
    serves(stub, jfk_pcm[: 2 * RATE])


def test_cli_stream_json(server: BackgroundServer, stub: Stub, jfk_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xattn.clients.cli", "stream", str(jfk_path)]
        + ["--server", server.address, "--json", "--speed", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    offline = stub.Transcribe(pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes())))
    assert word_distance(result["text"], offline.transcript.text) <= LIVE_SLACK
    assert result["language"] == "en" and result["duration"] == pytest.approx(11.0, abs=0.01)
    tokens = result["tokens"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert "".join(s["text"] for s in result["segments"]) == result["text"]
    words = [w for s in result["segments"] for w in s["words"]]
    assert words_of("".join(w["word"] for w in words)) == words_of(result["text"])
    assert np.all(np.diff([w["start"] for w in words]) >= 0)


def test_a_full_server_refuses_a_live_stream_at_once(jfk_path: Path) -> None:
    """Through the client's channel (its service config retries RESOURCE_EXHAUSTED for the
    other methods): a live stream on a full server is refused on its first attempt, never
    held back and retried while its microphone keeps talking."""
    from xattn.clients.api import ServerError, connect
    from xattn.clients.pcm import PcmQueue
    from xattn.clients.streaming import live_config, read_pcm16, stream_chunks

    config = ServerConfig(port=0, workers=1, max_queue=0, live_idle_timeout=30.0)
    with BackgroundServer(config, pipeline("tiny.en")) as server, connect(server.address) as client:
        holding = PcmQueue()  # the first stream: admitted, then waits for audio
        holding.put(read_pcm16(jfk_path)[:32000])
        first = threading.Thread(target=lambda: list(stream_chunks(client, holding, live_config())))
        first.start()
        try:
            deadline = time.monotonic() + 60
            while server.engine.counters().live < 1:
                assert time.monotonic() < deadline, "the first stream was never admitted"
                time.sleep(0.05)
            with pytest.raises(ServerError) as refused:
                list(stream_chunks(client, iter([b"\0\0" * 1600]), live_config()))
            assert refused.value.code == "RESOURCE_EXHAUSTED"
            assert server.engine.counters().rejected == 1  # one attempt: not retried
        finally:
            holding.end()
            first.join(60)
