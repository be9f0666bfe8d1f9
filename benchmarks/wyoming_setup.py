"""What benchmarks.wyoming runs on: its corpus, the peers' virtualenvs and the servers.

- The corpus: short voice commands spoken by espeak-ng ("turn on the kitchen light") and the
  English clips of ../shared/eval up to 12 s, as 16 kHz 16-bit mono WAV (what a Home
  Assistant satellite sends) with a .txt reference beside each: wyoming-bench's layout.
- The peers, each in a virtualenv of its own under ~/.cache/xattn-bench (never the project's):
  `wyoming-faster-whisper` (Home Assistant's standard Wyoming STT server) and `wyoming-bench`
  (a benchmark of Wyoming STT servers).
- The servers: `xattn-server --wyoming-port` (streamed or batch) and wyoming-faster-whisper
  (faster-whisper backend, the same CTranslate2 weights, its defaults), one at a time, each
  on a free loopback port, ready once a `describe` is answered with `info` (the peer loads
  its model at the first command: benchmarks.wyoming warms each up).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe

from benchmarks.replicas import Spawned, clean_env, free_port, wait_until
from benchmarks.wer import EVAL, clips, faster_whisper_dir
from xattn.model.audio.features import decode_audio

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache" / "xattn-bench"
PEER = "wyoming-faster-whisper==3.8.1"
BENCH = "wyoming-bench==2026.10.0"
MAX_CLIP_SECONDS = 12.0
COMMANDS = (
    "Turn on the kitchen light.",
    "Turn off the bedroom fan.",
    "Set a timer for ten minutes.",
    "What is the weather like tomorrow?",
    "Lock the front door.",
    "Set the thermostat to twenty one degrees.",
    "Play some jazz in the living room.",
    "Is the garage door open?",
    "Dim the hallway lights to fifty percent.",
    "Add milk to the shopping list.",
    "Close the blinds in the office.",
    "Start the vacuum cleaner.",
)
VOICES = ("en-us", "en-gb")  # every other command in each


@dataclass(frozen=True)
class Sample:
    id: str
    text: str
    pcm: bytes  # 16 kHz 16-bit mono
    kind: str  # "command" or "sentence"

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 32000


def _pcm(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes()


def _write(folder: Path, sample: Sample) -> None:
    with wave.open(str(folder / f"{sample.id}.wav"), "wb") as w:
        w.setframerate(16000)
        w.setsampwidth(2)
        w.setnchannels(1)
        w.writeframes(sample.pcm)
    (folder / f"{sample.id}.txt").write_text(sample.text + "\n")


def write_corpus(folder: Path, samples: list[Sample]) -> None:
    """`samples` as <id>.wav + <id>.txt in `folder` (wyoming-bench's layout), alone there."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.wav"), *folder.glob("*.txt")]:
        old.unlink()
    for sample in samples:
        _write(folder, sample)


def corpus(commands: int = len(COMMANDS), sentences: int = 11) -> list[Sample]:
    """The first `commands` commands (espeak-ng) and `sentences` English eval clips of at
    most 12 s."""
    from benchmarks.synth import speak

    out = []
    for i, text in enumerate(COMMANDS[:commands]):
        audio = speak(text, VOICES[i % len(VOICES)])
        out.append(Sample(f"command_{i:02d}", text, _pcm(audio), "command"))
    english = clips(EVAL, english_only=True, limit=None)
    short = [c for c in english if len(decode_audio(c.file)) / 16000 <= MAX_CLIP_SECONDS]
    for i, clip in enumerate(short[:sentences]):
        out.append(
            Sample(f"sentence_{i:02d}", clip.text, _pcm(decode_audio(clip.file)), "sentence")
        )
    return out


def venv(name: str, package: str) -> Path:
    """The python of CACHE/<name>, a virtualenv with `package` (made on first use)."""
    python = CACHE / name / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(CACHE / name)], check=True)
    probe = [str(python), "-m", "pip", "show", "-q", package.split("==")[0]]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", package], check=True)
    return python


def peer_python() -> Path:
    return venv("wyoming-peer", PEER)


def bench_binary() -> Path:
    return venv("wyoming-bench", BENCH).parent / "wyoming-bench"


async def _answers(port: int) -> bool:
    client = AsyncTcpClient("127.0.0.1", port)
    try:
        await client.connect()
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), 5)
        return event is not None and event.type == "info"
    except OSError:
        return False
    finally:
        await client.disconnect()


class Process(Spawned):
    """A Wyoming server process on a free loopback port, until stop() (SIGTERM, then kill)."""

    def __init__(self, threads: int) -> None:
        super().__init__("xattn-wyoming-")
        self.threads = threads
        self.port = free_port()

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 600.0) -> Process:
        self.spawn(self.command(), clean_env(OMP_NUM_THREADS=str(self.threads)), cwd=ROOT)
        wait_until(self._ready, f"{self.name} never answered describe", timeout, 0.5)
        return self

    def _ready(self) -> bool:
        self.alive()
        return asyncio.run(_answers(self.port))


class Xattn(Process):
    """xattn-server with every model of the run, the Wyoming face in `mode`."""

    def __init__(self, models: list[str], mode: str, threads: int) -> None:
        super().__init__(threads)
        self.models, self.mode = models, mode
        self.name = f"xattn ({mode})"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "xattn.service", "--port", "0", "--wyoming-port"]
        command += [str(self.port), "--wyoming-mode", self.mode, "--grace", "5"]
        for model in self.models:
            command += ["--model", model]
        return command

    def _ready(self) -> bool:  # every model loaded and warmed up
        served = self.log.read_text(errors="replace").count("xattn.service.server: serving ")
        return super()._ready() and served == len(self.models)


class Peer(Process):
    """wyoming-faster-whisper on one model's CTranslate2 weights: its defaults (beam 5 on
    x86, the model's own compute type), `compute` when given (int8), `threads` CPU threads."""

    def __init__(self, model: str, compute: str | None, threads: int) -> None:
        super().__init__(threads)
        self.model, self.compute = model, compute
        self.name = f"wyoming-faster-whisper ({compute or 'default'})"

    def command(self) -> list[str]:
        binary = peer_python().parent / "wyoming-faster-whisper"
        command = [str(binary), "--uri", f"tcp://127.0.0.1:{self.port}"]
        command += ["--model", str(faster_whisper_dir(self.model)), "--data-dir", str(self.folder)]
        command += ["--local-files-only", "--stt-library", "faster-whisper", "--language", "en"]
        command += ["--cpu-threads", str(self.threads)]
        if self.compute:
            command += ["--compute-type", self.compute]
        return command
