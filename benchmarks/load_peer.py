"""The peer of benchmarks.load: `faster-whisper-server` from PyPI, in a virtualenv of its own.

    python = peer_python(VENV)              # created and installed on first use; None: cannot
    with PeerServer(python, model_dir, beam=5) as peer:
        peer.port, peer.pid                 # its OpenAI-style API on 127.0.0.1:port

faster-whisper-server 0.0.3 (andyjjrt/faster-whisper-server) is a FastAPI app around
faster-whisper's WhisperModel: `python -m faster_whisper_server --config FILE --host H --port
P`; the YAML config (JSON is YAML) names each model, its `path` (a CTranslate2 directory: the
same tiny.en folder faster-whisper reads in benchmarks/longform_vad.py), its WhisperModel
options (`device`, `compute_type`, `cpu_threads`) and its transcribe options (`beam_size`,
`best_of`). A request is `POST /v1/audio/transcriptions` with the form fields `file`,
`model_name` (a config name), `response_format` (json or verbose_json), `language`, `prompt`
and `temperature`: no beam size, no `stream`, so the decoding is chosen per model entry (one
server per decoding here, so each one's RSS holds one model) and there is no time to the
first token. The model loads on the first request; `GET /health` answers before that. Its
endpoint is `async def` and runs the transcription on the event loop: requests run one at a
time, the others wait in the socket's queue (it never refuses one).

The virtualenv is never the project's: it is made under ~/.cache/xattn-bench/peer-venv with
the `venv` module and pip, faster-whisper and ctranslate2 pinned to the versions the project's
own environment has (the same engine as benchmarks.decode's faster-whisper rows).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

from benchmarks.replicas import Spawned, clean_env, free_port, wait_until
from benchmarks.service import rss_mb

log = logging.getLogger(__name__)

PACKAGE = "faster-whisper-server==0.0.3"
VENV = Path.home() / ".cache" / "xattn-bench" / "peer-venv"
MODEL = "tiny.en"  # the peer's name for its one model (form field model_name)
PINNED = ("faster-whisper", "ctranslate2")  # at the project's versions, when it has them


def _installed(python: Path, modules: tuple[str, ...]) -> bool:
    probe = [str(python), "-c", f"import {', '.join(modules)}"]
    return python.is_file() and subprocess.run(probe, capture_output=True).returncode == 0


def peer_python(
    venv: Path = VENV,
    timeout: float = 1200.0,
    package: str = PACKAGE,
    modules: tuple[str, ...] = ("faster_whisper_server", "faster_whisper"),
    pinned: tuple[str, ...] = PINNED,
) -> tuple[Path | None, str]:
    """The peer venv's python, creating the venv and installing `package` first if needed
    (`pinned`: at the project's versions, where it has them) until `modules` import; (None,
    why) when that fails."""
    python = venv / "bin" / "python"
    if _installed(python, modules):
        return python, f"{package} in {venv}"
    pins = []
    for name in pinned:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(python), "-m", "pip", "install", "-q", package, *pins],
    ]
    log.info("installing the peer: %s", " ".join(steps[1][3:]))
    for step in steps:
        try:
            out = subprocess.run(step, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{' '.join(step[:4])}: {e}"
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
            return None, f"{' '.join(step[:4])} failed: {' / '.join(tail)}"
    if not _installed(python, modules):
        return None, f"{package} installed in {venv} but does not import"
    return python, f"{package} in {venv} (installed now)"


def peer_config(model_dir: Path, beam: int, threads: int) -> dict:
    """The peer's config: one model, fp32 on `threads` CPU threads, beam `beam` (best-of the
    same; 1 is greedy), faster-whisper's other defaults (the temperature fallback included)."""
    return {
        "models": [
            {
                "name": MODEL,
                "path": str(model_dir),
                "model_options": {
                    "device": "cpu",
                    "compute_type": "float32",
                    "cpu_threads": threads,
                },
                "transcribe_options": {"beam_size": beam, "best_of": beam},
            }
        ]
    }


class PeerServer(Spawned):
    """One faster-whisper-server process on a free loopback port, until stop() (SIGTERM, then
    SIGKILL after 30 s)."""

    name = "faster-whisper-server"

    def __init__(self, python: Path, model_dir: Path, beam: int, threads: int = 2) -> None:
        super().__init__("xattn-peer-")
        self.python, self.config = python, peer_config(model_dir, beam, threads)

    def start(self, timeout: float = 120.0) -> PeerServer:
        config = self.folder / "config.yaml"
        config.write_text(json.dumps(self.config, indent=1))
        self.port = free_port()
        command = [str(self.python), "-m", "faster_whisper_server", "--config", str(config)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        threads = str(self.config["models"][0]["model_options"]["cpu_threads"])
        self.spawn(command, clean_env(OMP_NUM_THREADS=threads))  # uvicorn logs every request
        wait_until(self._healthy, f"faster-whisper-server on port {self.port}", timeout, 0.2)
        return self

    def _healthy(self) -> bool:
        self.alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def rss(self) -> tuple[float, float]:
        """Its resident memory now and at its peak (since reset_peak), MB."""
        return rss_mb(self.pid)
