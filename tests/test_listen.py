"""`xattn listen`: the microphone path, against a real server (tiny.en, in-process).

The virtual input is an object with sounddevice's interface (query_devices, default.device,
InputStream with a callback thread), injected where `listen.run` takes the sounddevice
module: a 44.1 kHz stereo device that "hears" jfk.flac (decoded by PyAV) block by block,
then silence, until Ctrl-C (a real SIGINT to this process, handled as the CLI handles it).
It delivers its blocks at 4x real time to keep CI short. The no-device error goes through
the real sounddevice and PortAudio of this machine, which has no sound card.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import av
import grpc
import numpy as np
import pytest
from openai_ref import pipeline
from rich.console import Console
from wording import LIVE_SLACK, word_distance

from xattn.clients import listen
from xattn.clients.cli import build_parser, main
from xattn.clients.pcm import SourceError
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
RATE = 44100
SPEED = 4.0


def stereo_44k(path: Path) -> np.ndarray:
    """The clip as the virtual device's samples: [n, 2] int16 at 44.1 kHz."""
    resampler = av.AudioResampler(format="s16", layout="stereo", rate=RATE)
    with av.open(str(path)) as container:
        frames = [*container.decode(container.streams.audio[0]), None]
        parts = [f.to_ndarray() for frame in frames for f in resampler.resample(frame)]
    return np.concatenate(parts, axis=1).reshape(-1, 2)  # packed s16 [1, 2n] -> [n, 2]


class VirtualInput:
    """sounddevice's interface over one virtual 44.1 kHz stereo input device."""

    def __init__(self, samples: np.ndarray, interrupt_after: float | None) -> None:
        self.samples, self.interrupt_after = samples, interrupt_after
        self.default = SimpleNamespace(device=[1, -1])
        self.opened: dict[str, Any] = {}

    def query_devices(self) -> list[dict[str, Any]]:
        out = {"name": "virtual output", "max_input_channels": 0, "default_samplerate": 48000.0}
        mic = {"name": "virtual mic (jfk)", "max_input_channels": 2, "default_samplerate": RATE}
        return [out, mic]

    def InputStream(self, **kw: Any) -> VirtualStream:  # noqa: N802 (sounddevice's name)
        self.opened = kw
        return VirtualStream(self, kw)


class VirtualStream:
    def __init__(self, owner: VirtualInput, kw: dict[str, Any]) -> None:
        assert kw["samplerate"] == RATE and kw["channels"] == 2 and kw["dtype"] == "int16"
        self.device, self.kw = owner, kw
        self.running = threading.Event()

    def __enter__(self) -> VirtualStream:
        self.running.set()
        self.thread = threading.Thread(target=self._play, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running.clear()
        self.thread.join(5)

    def _play(self) -> None:
        block, samples = self.kw["blocksize"], self.device.samples
        t0, at = time.monotonic(), 0
        while self.running.is_set():
            data = samples[at : at + block]
            if len(data) < block:  # after the clip: silence
                data = np.zeros((block, 2), np.int16)
            self.kw["callback"](data, block, None, None)
            at += block
            heard = at / RATE
            after = self.device.interrupt_after
            if after is not None and heard >= after:
                self.device.interrupt_after = None
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
            time.sleep(max(0.0, t0 + heard / SPEED - time.monotonic()))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with BackgroundServer(ServerConfig(port=0, workers=1), pipeline("tiny.en")) as running:
        yield running.address


def test_listen_virtual_input_until_ctrl_c(
    server: str, jfk_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with grpc.insecure_channel(server) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        request = pb.TranscribeRequest(audio=pb.Audio(encoded=jfk_path.read_bytes()))
        offline = stub.Transcribe(request).transcript.text
    device = VirtualInput(stereo_44k(jfk_path), interrupt_after=12.0)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    args = build_parser().parse_args(["listen", "--server", server, "--json"])
    args.token = None
    assert listen.run(args, Console(), Console(stderr=True), sd=device) == 0
    assert device.opened["device"] == 1 and device.opened["blocksize"] == RATE // 20
    result = json.loads(capsys.readouterr().out)
    assert word_distance(result["text"], offline) <= LIVE_SLACK, (result["text"], offline)
    assert result["duration"] == pytest.approx(12.0, abs=0.1)
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_devices_are_listed_and_picked(capsys: pytest.CaptureFixture[str]) -> None:
    device = VirtualInput(np.zeros((0, 2), np.int16), None)
    args = build_parser().parse_args(["listen", "--list-devices"])
    assert listen.run(args, Console(width=120), Console(stderr=True), sd=device) == 0
    out = capsys.readouterr().out
    assert "virtual mic (jfk)" in out and "virtual output" not in out
    assert listen.pick_device(device, "1")["name"] == "virtual mic (jfk)"
    assert listen.pick_device(device, "JFK")["index"] == 1
    for wanted in ("0", "speaker"):
        with pytest.raises(SourceError, match="no input device matches"):
            listen.pick_device(device, wanted)


def test_no_device_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Real PortAudio on a machine without a sound card (or without PortAudio): exit 2 and
    what to do instead; no server is contacted."""
    try:
        sd = listen.sounddevice()
    except SourceError:
        pass  # no PortAudio: the same exit 2
    else:
        if listen.input_devices(sd):
            pytest.skip("this machine has an input device")
    assert main(["listen", "--server", "127.0.0.1:1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "no input device found" in err or "PortAudio library is missing" in err, err
    assert "| xattn stream -" in err
