"""Encoded audio decoded in worker processes (xattn.service.engine.decoders): the same samples and
errors as in the server's own process, and a worker that dies (a native crash, simulated by a
real SIGSEGV) or hangs costs its one request, never the server or the requests beside it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile
from openai_ref import pipeline

from xattn.model.audio.containers import decode_native
from xattn.model.audio.features import AudioError, AudioTooLongError, decode_audio, to_16k
from xattn.service.background import BackgroundServer
from xattn.service.engine.decoders import DecoderProcesses
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc


@pytest.fixture
def decoders() -> Iterator[DecoderProcesses]:
    d = DecoderProcesses(1, timeout=60.0)
    d.start()
    try:
        yield d
    finally:
        d.close()


def stereo_44k(tmp_path: Path) -> bytes:
    """2 s of two different tones, stereo 44.1 kHz 24-bit WAV (resampled and mixed)."""
    t = np.arange(2 * 44100) / 44100
    frames = np.stack([0.3 * np.sin(2 * np.pi * 220 * t), 0.2 * np.sin(2 * np.pi * 330 * t)], 1)
    path = tmp_path / "tones.wav"
    soundfile.write(path, frames, 44100, subtype="PCM_24")
    return path.read_bytes()


def short_wav(tmp_path: Path) -> bytes:
    """1 s of a tone, 16 kHz 16-bit mono WAV: 32 KB, which a socket's buffer holds whole, so
    that a stopped worker has it to decode (a worker that dies before it has the input is
    replaced, and the decode goes to the new one)."""
    path = tmp_path / "tone.wav"
    soundfile.write(path, 0.3 * np.sin(np.arange(16000) / 5.0), 16000, subtype="PCM_16")
    return path.read_bytes()


def test_same_samples_and_errors_as_in_process(
    decoders: DecoderProcesses, jfk_path: Path, multilingual_path: Path, tmp_path: Path
) -> None:
    for data in (jfk_path.read_bytes(), multilingual_path.read_bytes(), stereo_44k(tmp_path)):
        mono, rate = decoders.decode(data)
        here, here_rate = decode_native(data)
        assert rate == here_rate and np.array_equal(mono, here)
        ours = to_16k(mono, rate)
        assert ours.dtype == np.float32 and np.array_equal(ours, decode_audio(data))
    for data, limit in ((b"not audio" * 50, None), (jfk_path, 5)):
        data = data.read_bytes() if isinstance(data, Path) else data
        with pytest.raises(AudioError) as here:
            decode_audio(data, max_seconds=limit)
        with pytest.raises(AudioError) as there:
            decoders.decode(data, limit)
        assert type(there.value) is type(here.value) and str(there.value) == str(here.value)
    assert isinstance(there.value, AudioTooLongError)
    assert decoders.crashes == 0


def while_stopped(
    decoders: DecoderProcesses, action: Callable[[], object], then: Callable[[int], None]
) -> object:
    """Run `action` (a decode) on a thread while the idle workers are stopped (SIGSTOP: the
    one it takes cannot finish); once that worker has the decode's input (the pool's `busy`:
    sent whole, so that its death is this input's), let the others go and do `then(its pid)`.
    What `action` returned or raised."""
    idle = decoders.pids()
    assert idle
    for pid in idle:
        os.kill(pid, signal.SIGSTOP)
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(_try(action)))
    thread.start()
    deadline = time.monotonic() + 60
    while not set(idle) & set(decoders.busy()):  # a state the pool reports, not a delay
        assert thread.is_alive() and time.monotonic() < deadline, out
        time.sleep(0.01)
    (taken,) = set(idle) & set(decoders.busy())
    for pid in decoders.pids():
        os.kill(pid, signal.SIGCONT)
    then(taken)
    thread.join(120)
    return out[0]


def _try(fn: Callable[..., object], *args: object) -> object:
    try:
        return fn(*args)
    except Exception as e:
        return e


def crash(pid: int) -> None:
    os.kill(pid, signal.SIGSEGV)
    os.kill(pid, signal.SIGCONT)


def test_a_crash_is_the_requests_alone(decoders: DecoderProcesses, tmp_path: Path) -> None:
    data = short_wav(tmp_path)
    error = while_stopped(decoders, lambda: decoders.decode(data), crash)
    assert isinstance(error, AudioError)
    assert "the decoder crashed on this input (SIGSEGV)" in str(error)
    assert "convert it to WAV or FLAC, or send PCM" in str(error)
    assert decoders.crashes == 1
    assert np.array_equal(to_16k(*decoders.decode(data)), decode_audio(data))  # a new worker


def test_a_hung_decode_is_killed(tmp_path: Path) -> None:
    d = DecoderProcesses(1, timeout=1.0)
    d.start()
    try:
        data = short_wav(tmp_path)
        error = while_stopped(d, lambda: d.decode(data), lambda pid: None)
        assert isinstance(error, AudioError) and "took longer than 1 s" in str(error)
        assert np.array_equal(to_16k(*d.decode(data)), decode_audio(data))
    finally:
        d.close()


def test_the_server_outlives_its_decoder(
    jfk_path: Path, multilingual_path: Path, tmp_path: Path
) -> None:
    """A Transcribe whose decoder crashes gets INVALID_ARGUMENT saying so; a request decoding
    beside it (the second worker) and the ones after it are served."""
    config = ServerConfig(port=0, workers=1, max_queue=4, decode_processes=2)
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        decoders = server.engine.decoders
        assert decoders is not None
        with grpc.insecure_channel(server.address) as channel:
            stub = transcriber_pb2_grpc.TranscriberStub(channel)

            def transcribe(data: bytes) -> pb.TranscribeResponse:
                options = pb.TranscriptionOptions(beam_size=1, temperatures=[0.0])
                request = pb.TranscribeRequest(audio=pb.Audio(encoded=data), options=options)
                return stub.Transcribe(request, timeout=120)

            jfk = jfk_path.read_bytes()
            assert "ask not" in transcribe(jfk).transcript.text  # a worker is running now
            beside: list[object] = []

            def crash_with_one_beside(pid: int) -> None:
                beside.append(_try(transcribe, multilingual_path.read_bytes()))
                crash(pid)

            tone = short_wav(tmp_path)
            error = while_stopped(decoders, lambda: transcribe(tone), crash_with_one_beside)
            assert isinstance(error, grpc.RpcError)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "the decoder crashed on this input (SIGSEGV)" in error.details()
            assert isinstance(beside[0], pb.TranscribeResponse), beside
            assert beside[0].transcript.text.strip()
            assert "ask not" in transcribe(jfk).transcript.text
            assert decoders.crashes == 1
