"""The Wyoming face (service/wyoming) through the `wyoming` library's own client against a
real server on loopback, tiny.en: describe/info, batch transcripts equal to gRPC Transcribe's,
streamed ones (transcript-chunks before audio-stop at real time; their concatenation is the
transcript), every width, a spread of rates and channel counts, many clients at once.

Order, not time, is asserted: at real time a transcript-chunk is awaited before audio-stop is
sent. The streamed path's text depends on how the audio is cut into decode steps, which
depends on the load when it is paced: paced, it is held to the batch text within a few
words; sent as one chunk, the cuts are fixed and it equals gRPC StreamingRecognize's exactly.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import torchaudio.functional as AF
from openai_ref import pipeline
from wording import word_distance
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming_client import TIMEOUT, Answer, Reader, command, connect, read

from xattn.service.__main__ import config_from_args, parse_args
from xattn.service.background import BackgroundServer
from xattn.service.engine.live import live_settings
from xattn.service.server import ServerConfig
from xattn.service.wyoming.audio import StreamConverter, pcm_format
from xattn.service.wyoming.handler import WyomingSettings
from xattn.service.wyoming.server import WyomingServer, bind
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "samples" / "hello.wav"  # 16 kHz 16-bit mono, 8.6 s


def hello_pcm() -> bytes:
    with wave.open(str(HELLO)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (16000, 2, 1)
        return w.readframes(w.getnframes())


@pytest.fixture(scope="module")
def bg() -> Iterator[BackgroundServer]:
    """gRPC and the Wyoming face (streamed) on one engine. The queue-wait bound is raised:
    while live streams run, the engine's wait estimate counts each as a file still loading
    and their encoder time as file windows', which on a busy machine refuses the batch
    commands of test_many_clients_at_once (admission is not what this module tests)."""
    config = ServerConfig(port=0, wyoming_port=0, workers=2, max_queue_wait=600, max_live_streams=8)
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        yield server


@pytest.fixture(scope="module")
def port(bg: BackgroundServer) -> int:
    return bg.server.wyoming_port


@pytest.fixture(scope="module")
def batch_port(bg: BackgroundServer) -> Iterator[int]:
    """A second Wyoming face on the same engine, in batch mode."""

    async def start() -> WyomingServer:
        settings = WyomingSettings(streaming=False, live=live_settings(bg.engine.limits))
        face = WyomingServer(bg.engine, settings, bind("127.0.0.1", 0))
        await face.start()
        return face

    face = bg.call(start())
    yield face.port
    bg.call(face.stop())


def grpc_transcribe(bg: BackgroundServer, pcm: pb.Pcm, **options: object) -> pb.Transcript:
    with grpc.insecure_channel(bg.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        request = pb.TranscribeRequest(
            audio=pb.Audio(pcm=pcm), options=pb.TranscriptionOptions(**options)
        )
        return stub.Transcribe(request, timeout=300).transcript


def grpc_live(bg: BackgroundServer, samples: np.ndarray) -> tuple[list[str], str]:
    """StreamingRecognize of 16 kHz float32 `samples` as one audio_content, with the Wyoming
    face's policy for commands: finals, text."""
    policy = pb.LivePolicy(first_context=WyomingSettings().first_context)
    config = pb.StreamingRecognitionConfig(
        encoding=pb.PCM_ENCODING_FLOAT32, sample_rate=16000, policy=policy
    )
    requests = [
        pb.StreamingRecognizeRequest(config=config),
        pb.StreamingRecognizeRequest(audio_content=samples.astype("<f4").tobytes()),
    ]
    with grpc.insecure_channel(bg.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        responses = list(stub.StreamingRecognize(iter(requests), timeout=300))
    finals = [r.result.text for r in responses if r.HasField("result") and r.result.is_final]
    return [f for f in finals if f], responses[-1].done.text


async def describe(port: int) -> Event:
    client = await connect(port)
    await client.write_event(Describe().event())
    event = await read(client)
    await client.disconnect()
    assert event is not None
    return event


def test_describe_lists_the_models_and_whether_transcripts_stream(
    port: int, batch_port: int
) -> None:
    streamed = Info.from_event(asyncio.run(describe(port)))
    batch = Info.from_event(asyncio.run(describe(batch_port)))
    (program,) = streamed.asr
    assert program.name == "xattn" and program.installed and program.version
    assert [(m.name, m.languages, m.installed) for m in program.models] == [
        ("tiny.en", ["en"], True)
    ]
    assert program.supports_transcript_streaming is True
    assert batch.asr[0].supports_transcript_streaming is False


def test_batch_transcript_equals_grpc_transcribe(bg: BackgroundServer, batch_port: int) -> None:
    pcm = hello_pcm()
    answer = asyncio.run(command(batch_port, pcm, streamed=False))
    assert answer.types == ["transcript"]
    expected = grpc_transcribe(bg, pb.Pcm(data=pcm, sample_rate=16000, encoding=1, channels=1))
    assert answer.text == expected.text and "speech recognition" in expected.text.lower()
    assert answer.events[0].data["language"] == "en"


def test_batch_24_bit_stereo_flac_equals_grpc_transcribe_of_the_file(
    bg: BackgroundServer, batch_port: int, jfk_path: Path
) -> None:
    import soundfile as sf

    samples, rate = sf.read(jfk_path, dtype="int32")  # [n, 2], 24-bit in the top bytes
    assert (rate, samples.shape[1]) == (44100, 2)
    packed = (samples.astype("<i4").view(np.uint8).reshape(-1, 4)[:, 1:]).tobytes()  # int24
    answer = asyncio.run(command(batch_port, packed, rate, 3, 2, streamed=False))
    with grpc.insecure_channel(bg.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        audio = pb.Audio(encoded=jfk_path.read_bytes())
        expected = stub.Transcribe(pb.TranscribeRequest(audio=audio), timeout=300).transcript
    assert answer.text == expected.text and "ask not" in expected.text.lower()


def test_names_and_terms_prompt_the_batch_transcript(bg: BackgroundServer, batch_port: int) -> None:
    """transcript_terms, then transcript_names (kept last: Whisper keeps a long prompt's
    end), as Transcribe's initial_prompt; a region code names its language."""
    pcm = hello_pcm()
    ask = Transcribe(
        language="en-US", transcript_names=["Hester Prynne"], transcript_terms=["cross-attention"]
    )
    answer = asyncio.run(command(batch_port, pcm, transcribe=ask, streamed=False))
    expected = grpc_transcribe(
        bg,
        pb.Pcm(data=pcm, sample_rate=16000, encoding=1, channels=1),
        language="en",
        initial_prompt="cross-attention, Hester Prynne",
    )
    assert answer.text == expected.text


def test_streamed_chunks_arrive_while_the_audio_is_fed_at_real_time(
    bg: BackgroundServer, port: int
) -> None:
    pcm, step = hello_pcm(), 1600 * 2  # 100 ms chunks

    async def run() -> tuple[int, Answer]:
        client = await connect(port)
        reader = Reader(client)
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(16000, 2, 1).event())
        t0 = time.perf_counter()
        for i in range(0, len(pcm), step):  # at real time, as a satellite sends it
            await client.write_event(AudioChunk(16000, 2, 1, pcm[i : i + step]).event())
            await asyncio.sleep(max(0.0, t0 + (i + step) / 32000 - time.perf_counter()))
        await asyncio.wait_for(reader.first_chunk.wait(), TIMEOUT)
        before_stop = len(reader.answer.chunks)
        await client.write_event(AudioStop().event())
        answer = await reader.task
        await client.disconnect()
        return before_stop, answer

    before_stop, answer = asyncio.run(run())
    assert answer.error is None, answer.error
    assert before_stop >= 1  # words went out before audio-stop was sent
    assert answer.types[0] == "transcript-start"
    assert answer.types[-2:] == ["transcript", "transcript-stop"]
    assert set(answer.types[1:-2]) == {"transcript-chunk"}
    assert "".join(answer.chunks) == answer.text
    batch = grpc_transcribe(bg, pb.Pcm(data=pcm, sample_rate=16000, encoding=1, channels=1))
    assert heard_alike(answer.text, batch.text), (answer.text, batch.text)


def test_streamed_in_one_chunk_equals_grpc_streaming_recognize(
    bg: BackgroundServer, port: int
) -> None:
    """The same live stream, the same cuts (all the audio in one feed, then finish): the
    same finals, and the transcript is their concatenation."""
    pcm = hello_pcm()
    answer = asyncio.run(command(port, pcm, per_chunk=None))
    finals, text = grpc_live(bg, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0)
    assert answer.chunks == finals and answer.text == text == "".join(finals)
    assert answer.events[-2].data["language"] == "en"


def heard_alike(live: str, batch: str) -> bool:
    """A live transcript against the batch one of the same audio: its cuts depend on when its
    steps ran (on a busy machine a step sees more audio at once, or a word late), so it is held
    to at most a third of the batch's words wrong, which a wrong format or lost audio breaks."""
    return word_distance(live, batch) <= len(batch.split()) // 3


def quantize(x: np.ndarray, width: int) -> bytes:
    """Samples in [-1, 1) as Wyoming's `width` (1: unsigned 8-bit; 2-4 signed LE)."""
    if width == 1:
        return (np.round(x * 127) + 128).astype(np.uint8).tobytes()
    scale = float(2 ** (8 * width - 1) - 1)
    ints = np.round(x * scale).astype("<i4")
    if width == 4:
        return ints.tobytes()
    return ints.view(np.uint8).reshape(-1, 4)[:, :width].tobytes()  # the low bytes


def dequantize(data: bytes, width: int) -> np.ndarray:
    """What the samples mean, as float32 (the reference for the engine's reading)."""
    if width == 1:
        return (np.frombuffer(data, np.uint8).astype(np.float32) - 128) / 128
    b = np.frombuffer(data, np.uint8).reshape(-1, width)
    ints = np.zeros(len(b), np.int64)
    for k in range(width):
        ints |= b[:, k].astype(np.int64) << (8 * k)
    ints = np.where(ints >= 2 ** (8 * width - 1), ints - 2 ** (8 * width), ints)
    return (ints.astype(np.float32) / np.float32(2 ** (8 * width - 1))).astype(np.float32)


def hello_at(rate: int, channels: int) -> np.ndarray:
    """hello.wav at `rate`, interleaved: the left channel, and the right at half its level."""
    x = np.frombuffer(hello_pcm(), "<i2").astype(np.float32) / 32768.0
    if rate != 16000:
        x = AF.resample(torch.from_numpy(x), 16000, rate).numpy()
    x = np.clip(x * 0.9, -1, 1)
    return np.stack([x, x * 0.5][:channels], axis=1).reshape(-1)  # [n * channels]


FORMATS = [(8000, 1, 1), (11025, 1, 2), (16000, 2, 2), (22050, 2, 1), (44100, 3, 2)]
FORMATS += [(48000, 4, 1), (32000, 3, 1)]


@pytest.mark.parametrize(("rate", "width", "channels"), FORMATS)
def test_every_width_and_a_spread_of_rates_and_channels_in_batch(
    bg: BackgroundServer, batch_port: int, rate: int, width: int, channels: int
) -> None:
    """The command's audio means to the engine what gRPC Transcribe's float32 Pcm of the
    same samples means: the same transcript, exactly."""
    data = quantize(hello_at(rate, channels), width)
    answer = asyncio.run(command(batch_port, data, rate, width, channels, streamed=False))
    samples = dequantize(data, width).astype("<f4").tobytes()
    expected = grpc_transcribe(
        bg, pb.Pcm(data=samples, sample_rate=rate, encoding=2, channels=channels)
    )
    assert answer.text == expected.text and "speech recognition" in expected.text.lower()


@pytest.mark.parametrize(("rate", "width", "channels"), [(44100, 3, 2), (8000, 1, 1)])
def test_streamed_conversion_resamples_as_the_whole_signal(
    bg: BackgroundServer, port: int, rate: int, width: int, channels: int
) -> None:
    """Chunks converted as they arrive (StreamConverter) equal the whole signal mixed down and
    resampled at once (torchaudio) to float rounding, and a streamed command built on them
    gets its words through (its live cuts depend on timing; the 8-bit 8 kHz one reads poorly
    in batch too)."""
    data = quantize(hello_at(rate, channels), width)
    mono = dequantize(data, width).reshape(-1, channels).mean(axis=1, dtype=np.float64)
    whole = AF.resample(torch.from_numpy(mono.astype(np.float32)), rate, 16000).numpy()
    converter = StreamConverter(pcm_format(rate, width, channels))
    step = 1000 * width * channels  # 1000 samples a chunk, as the command below sends them
    pieces = [converter.feed(data[i : i + step]) for i in range(0, len(data), step)]
    streamed = np.frombuffer(b"".join([*pieces, converter.flush()]), "<f4")
    assert abs(len(streamed) - len(whole)) <= 1
    n = min(len(streamed), len(whole))
    np.testing.assert_allclose(streamed[:n], np.clip(whole[:n], -1, 1), atol=2e-4)
    answer = asyncio.run(command(port, data, rate, width, channels, per_chunk=1000))
    assert answer.error is None and "".join(answer.chunks) == answer.text
    assert "model" in answer.text.lower(), answer.text  # words came through the stream


def test_many_clients_at_once(bg: BackgroundServer, port: int, batch_port: int) -> None:
    """Eight commands at once, six streamed and two batch, on one engine: each gets its own
    transcript, the one it gets alone."""
    pcm = hello_pcm()
    alone_streamed = asyncio.run(command(port, pcm, per_chunk=None)).text
    alone_batch = asyncio.run(command(batch_port, pcm, streamed=False)).text

    async def together() -> list[Answer]:
        streamed = [command(port, pcm, per_chunk=None) for _ in range(6)]
        batch = [command(batch_port, pcm, streamed=False) for _ in range(2)]
        return list(await asyncio.gather(*streamed, *batch))

    answers = asyncio.run(together())
    assert [a.error for a in answers] == [None] * 8
    assert [a.text for a in answers] == [alone_streamed] * 6 + [alone_batch] * 2
    assert bg.engine.counters().in_flight == 0


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_args(parse_args(["--wyoming-port", "10300", "--wyoming-zeroconf"]))
    assert (config.wyoming_port, config.wyoming_zeroconf, config.wyoming_streaming) == (
        10300,
        "xattn",
        True,
    )
    monkeypatch.setenv("XATTN_WYOMING_PORT", "0")
    monkeypatch.setenv("XATTN_WYOMING_MODE", "batch")
    monkeypatch.setenv("XATTN_WYOMING_ZEROCONF", "kitchen")
    config = config_from_args(parse_args([]))
    assert (config.wyoming_port, config.wyoming_streaming, config.wyoming_zeroconf) == (
        None,
        False,
        "kitchen",
    )
    with pytest.raises(SystemExit):
        parse_args(["--wyoming-mode", "fast"])


def test_the_process_serves_wyoming_beside_grpc(tmp_path: Path) -> None:
    """xattn-server --wyoming-port: info, a transcript, SIGTERM drains and exits 0."""
    with socket.socket() as s:  # a free port (0 turns the face off on the command line)
        s.bind(("127.0.0.1", 0))
        wyoming = s.getsockname()[1]
    files = tmp_path / "port", tmp_path / "wyoming-port"
    command_line = [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file"]
    command_line += [str(files[0]), "--wyoming-port", str(wyoming), "--wyoming-port-file"]
    command_line += [str(files[1]), "--workers", "1", "--wyoming-mode", "batch"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XATTN_")}
    proc = subprocess.Popen(
        command_line, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not files[1].exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no Wyoming port file after 120 s"
            time.sleep(0.05)
        assert int(files[1].read_text()) == wyoming
        while (info := asyncio.run(describe(wyoming))).type != "info":  # the model loads
            assert info.data["code"] == "not_ready", info
            assert time.monotonic() < deadline, "the model did not load in 120 s"
            time.sleep(0.2)
        answer = asyncio.run(command(wyoming, hello_pcm(), streamed=False))
        assert "speech recognition" in answer.text.lower()
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, output
    assert f"Wyoming on tcp://127.0.0.1:{wyoming} (batch transcripts)" in output


def test_wyoming_commands_are_reported_in_the_metrics() -> None:
    """The face reports each command (face "wyoming", method "transcribe"): a streamed and a
    batch transcript as ok, an unknown model as model_not_found, with the engine's model."""
    from benchmarks.scrape import families, value

    config = ServerConfig(port=0, wyoming_port=0, metrics_port=0, workers=2, max_queue_wait=600)
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        port, pcm = server.server.wyoming_port, hello_pcm()[: 16000 * 2 * 2]  # 2 s
        ok = asyncio.run(command(port, pcm))
        assert ok.types[-1] == "transcript-stop"
        bad = asyncio.run(command(port, pcm, transcribe=Transcribe(name="no-such-model")))
        assert bad.types == ["error"] and bad.events[0].data["code"] == "model_not_found"
        found = families(f"http://{server.metrics_address}/metrics")
    labels = {"face": "wyoming", "method": "transcribe"}
    assert value(found, "xattn_requests_total", **labels, model="tiny.en", code="ok") == 1
    assert value(found, "xattn_requests_total", **labels, code="model_not_found") == 1
    assert value(found, "xattn_request_duration_seconds_count", **labels) == 2
