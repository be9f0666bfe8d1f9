"""`xattn stream -`: raw PCM on standard input, from real pipes (sox, ffmpeg), to a real
server (tiny.en, in-process); the live words held to the offline Transcribe text within one
word (case and punctuation aside), as tests/test_live_service.py holds the file stream.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import requires_tool
from openai_ref import pipeline
from wording import LIVE_SLACK, word_distance, words_of

from xattn.clients.cli import main
from xattn.clients.pcm import PcmConverter, PcmFormat, PcmFormatError, PcmQueue
from xattn.clients.streaming import read_pcm16
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "xattn.clients.cli", "stream", "-"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with BackgroundServer(ServerConfig(port=0, workers=1), pipeline("tiny.en")) as running:
        yield running.address


@pytest.fixture(scope="module")
def offline_text(server: str, jfk_path: Path) -> str:
    with grpc.insecure_channel(server) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        audio = pb.Audio(encoded=jfk_path.read_bytes())
        return stub.Transcribe(pb.TranscribeRequest(audio=audio)).transcript.text


def piped(producer: list[str], flags: list[str], server: str) -> subprocess.CompletedProcess:
    """`producer | xattn stream - FLAGS --json`: the CLI's exit, stdout and stderr."""
    source = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        return subprocess.run(
            [*CLI, *flags, "--server", server, "--json"],
            stdin=source.stdout,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        source.stdout.close()  # type: ignore[union-attr]
        source.wait(10)


def test_sox_pipe_s16le_16k(server: str, offline_text: str, jfk_path: Path) -> None:
    sox = [requires_tool("sox"), "-q", str(jfk_path), "-t", "raw", "-r", "16000", "-c", "1"]
    done = piped([*sox, "-b", "16", "-e", "signed-integer", "-"], [], server)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert word_distance(result["text"], offline_text) <= LIVE_SLACK, (result["text"], offline_text)
    assert result["duration"] == pytest.approx(11.0, abs=0.01)
    tokens = result["tokens"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))


def test_ffmpeg_pipe_f32le_44k_stereo(server: str, offline_text: str, jfk_path: Path) -> None:
    """Another rate, channels and sample format: mixed down and resampled by the client."""
    ffmpeg = [requires_tool("ffmpeg"), "-nostdin", "-loglevel", "error", "-i", str(jfk_path)]
    ffmpeg += ["-f", "f32le", "-ar", "44100", "-ac", "2", "-"]
    flags = ["--rate", "44100", "--channels", "2", "--format", "f32le"]
    done = piped(ffmpeg, flags, server)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert word_distance(result["text"], offline_text) <= LIVE_SLACK, (result["text"], offline_text)
    assert result["duration"] == pytest.approx(11.0, abs=0.02)


def test_ctrl_c_ends_with_the_finals_so_far(server: str, offline_text: str, jfk_path: Path) -> None:
    """A source that does not end (a microphone): Ctrl-C half-closes, the finals of the audio
    sent so far come, exit 0."""
    pcm = read_pcm16(jfk_path)
    cli = subprocess.Popen(
        [*CLI, "--server", server, "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert b"streaming standard input" in cli.stderr.readline()  # type: ignore[union-attr]
        t0, speed, upto = time.monotonic(), 4.0, int(6.5 * 32000)  # "... ask not what" at 4x
        for at in range(0, upto, 3200):
            cli.stdin.write(pcm[at : at + 3200])  # type: ignore[union-attr]
            cli.stdin.flush()  # type: ignore[union-attr]
            time.sleep(max(0.0, t0 + (at + 3200) / 32000 / speed - time.monotonic()))
        cli.send_signal(signal.SIGINT)  # stdin stays open, as a microphone's would
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    assert cli.returncode == 0, err
    result = json.loads(out)
    heard, offline = words_of(result["text"]), words_of(offline_text)
    assert 3 <= len(heard) < len(offline) - 3, result["text"]
    assert word_distance(" ".join(heard), " ".join(offline[: len(heard)])) <= LIVE_SLACK
    assert result["duration"] == pytest.approx(6.5, abs=0.01)


def test_bad_format_and_inspect_are_usage_errors(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for flags, words in [
        (["--rate", "100"], "--rate must be"),
        (["--channels", "0"], "--channels must be"),
        (["--inspect"], "xattn live --serve"),
    ]:
        assert main(["stream", "-", *flags, "--server", server]) == 2
        assert words in " ".join(capsys.readouterr().err.split())


def test_converter_keeps_partial_frames_and_resamples() -> None:
    """Split anywhere (even inside a sample), the converted audio is the same; 48 kHz
    stereo float becomes 16 kHz mono int16 of the same tone."""
    t = np.arange(48000) / 48000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)  # [48000]
    stereo = np.stack([tone, tone], axis=1).astype("<f4").tobytes()  # [48000, 2]
    fmt = PcmFormat(48000, 2, "f32le")
    whole = PcmConverter(fmt)
    one = whole(stereo) + whole.flush()
    queue = PcmQueue(fmt)
    for at in range(0, len(stereo), 1001):
        queue.put(stereo[at : at + 1001])
    queue.end()
    assert b"".join(queue) == one
    out = np.frombuffer(one, "<i2") / 32767  # [~16000]
    assert abs(len(out) - 16000) <= 32
    spectrum = np.abs(np.fft.rfft(out[:16000]))  # 1 Hz bins
    assert abs(int(np.argmax(spectrum)) - 440) <= 1
    assert np.sqrt(np.mean(out[1000:15000] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)
    with pytest.raises(PcmFormatError):
        PcmFormat(16000, 1, "u8")
