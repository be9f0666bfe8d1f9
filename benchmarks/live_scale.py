"""Many live voices on one host: 1-16 simultaneous live streams of real speech at real time,
through gRPC StreamingRecognize and the OpenAI Realtime WebSocket, beside WhisperLiveKit.

    python -m benchmarks.live_scale                       # levels 1 2 4 8 16, both doors, peer
    python -m benchmarks.live_scale --quick               # levels 1 2, short audio: a smoke test
    python -m benchmarks.live_scale --levels 1 4 --doors grpc --skip peer --seconds 30

One server in this process, `ServerConfig()` but for its ports (as benchmarks.load runs it);
the clients in a process of their own (benchmarks.live_scale_clients), so their CPU is not
the server's. Stream i feeds its own sequence of the ../shared/eval clips (the English ones
for an English-only model, the others for a multilingual one), starting at clip i (from 13
streams on, in reverse order), clips joined by 1 s of silence, until `--seconds` of audio.
Before the levels, on the idle server: each stream's offline transcript with DTW word
timestamps (benchmarks.streaming.reference_words: greedy), and each clip's offline default
(a Transcribe with the server's defaults). Per door and level (benchmarks.live_scale_report):
commit lag (each final word's arrival minus its end in the offline transcript, matched by
text and time: benchmarks.live_match), the finals' WER against the manifest references beside
the offline default's on the same clips (S/D/I and words), words never committed (deletions
against the offline transcript of the same audio), refusals and their retry hints, the
server's CPU seconds per audio second, its encoder passes and their floor (a 30 s window's
pass timed in a process of its own before each level, benchmarks.load.Encoder), its peak RSS.
The peer (benchmarks.live_peer) gets the same feeds at `--peer-levels`. benchmarks/README.md
says how each figure is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import results
from benchmarks.live_scale_clients import GAP_SECONDS, feed
from benchmarks.live_scale_report import Stream, level_row, where_lag_goes
from benchmarks.load import Encoder, show
from benchmarks.service import cpu_seconds, reset_peak, rss_mb
from benchmarks.streaming import RATE, reference_words
from benchmarks.wer import EVAL, Clip, clips
from benchmarks.workers import Workers
from xattn.clients.api import connect
from xattn.model.pipeline import LIVE_COMPUTES, resolve_live_precision
from xattn.service.background import BackgroundServer
from xattn.service.server import LIVE_WINDOWS, ServerConfig

DOORS = {"grpc": "gRPC", "realtime": "Realtime"}
SECTIONS = ("peer",)
Raw = dict[str, Any]


def eval_clips(model: str) -> list[Clip]:
    """The English clips for an English-only model, the other languages' for the rest."""
    english = model.endswith(".en")
    return [c for c in clips(EVAL, False, None) if (c.language == "en") == english]


def sequences(found: list[Clip], streams: int, seconds: float) -> list[list[Clip]]:
    """Each stream's clips: from clip i on (in reverse order from the len(found)-th stream
    on, so that no two streams of 2x that many feed the same sequence) until `seconds`."""
    out = []
    for i in range(streams):
        order = found if i < len(found) else found[::-1]
        group: list[Clip] = []
        total, k = 0.0, i % len(found)
        while total < seconds and len(group) < len(found):
            clip = order[k % len(order)]
            group.append(clip)
            total += len(feed([str(clip.file)])) / 2 / RATE + GAP_SECONDS
            k += 1
        out.append(group)
    return out


class EncoderCount:
    """The server's encoder calls (a forward hook on its encoder module): passes (windows,
    batch rows), mel frames in and seconds spent."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.passes = self.frames = 0
        self.seconds = 0.0
        self._began = threading.local()
        module.register_forward_pre_hook(self._before)
        module.register_forward_hook(self._after)

    def _before(self, _: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        mel = inputs[0]  # [B, n_mels, frames]
        self.passes += mel.shape[0] if mel.dim() == 3 else 1
        self.frames += mel.shape[0] * mel.shape[-1] if mel.dim() == 3 else mel.shape[-1]
        self._began.t = time.perf_counter()

    def _after(self, *_: object) -> None:
        self.seconds += time.perf_counter() - self._began.t

    def snapshot(self) -> tuple[int, int, float]:
        return self.passes, self.frames, self.seconds


def describe(address: str, groups: list[list[Clip]], model: str) -> list[Stream]:
    """Each stream's references: the manifest's texts, each clip's offline default and the
    whole feed's offline DTW words (on the idle server)."""
    offline: dict[Path, str] = {}
    with connect(address) as client:
        for clip in {c.file: c for g in groups for c in g}.values():
            language = None if model.endswith(".en") else clip.language
            offline[clip.file] = client.transcribe(clip.file, language=language).text
    out = []
    for group in groups:
        pcm = feed([str(c.file) for c in group])
        ends, t = [], 0.0
        for c in group:
            t += len(feed([str(c.file)])) / 2 / RATE
            ends.append(t)
            t += GAP_SECONDS
        out.append(
            Stream(
                clips=tuple(c.file.name for c in group),
                ends=tuple(ends),
                seconds=len(pcm) / 2 / RATE,
                reference=" ".join(c.text for c in group),
                offline=" ".join(offline[c.file] for c in group),
                words=tuple(reference_words(address, pcm)),
                language=group[0].language,
            )
        )
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", help="streams at once (1 2 4 8 16)")
    parser.add_argument("--doors", default="grpc,realtime", help="comma-separated: grpc,realtime")
    parser.add_argument("--model", default=ServerConfig.model, help="the server's model")
    parser.add_argument("--seconds", type=float, help="audio a stream, at least (60)")
    parser.add_argument("--peer-levels", type=int, nargs="+", help="the peer's levels (1 4 8)")
    parser.add_argument("--skip", default="", help=f"comma-separated: {', '.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="levels 1 2, short audio")
    parser.add_argument(
        "--live-compute", default="auto", choices=LIVE_COMPUTES, help="the server's (auto)"
    )
    parser.add_argument(
        "--live-window",
        default=ServerConfig.live_window,
        choices=LIVE_WINDOWS,
        help=f"the server's ({ServerConfig.live_window})",
    )
    parser.add_argument(
        "--live-beam-size",
        type=int,
        default=ServerConfig.live_beam_size,
        help=f"the server's ({ServerConfig.live_beam_size})",
    )
    parser.add_argument("--raw", type=Path, help="also write every stream's words here (JSON)")
    parser.add_argument(
        "--max-live-streams", type=int, default=0, help="the server's (0, its default: measured)"
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    full = {"levels": [1, 2, 4, 8, 16], "seconds": 60.0, "peer_levels": [1, 4, 8]}
    quick = {"levels": [1, 2], "seconds": 4.0, "peer_levels": [1]}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.doors = [DOORS[d.strip().lower()] for d in args.doors.split(",") if d.strip()]
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(SECTIONS):
        parser.error(f"--skip takes {', '.join(SECTIONS)}")
    return args


def run_ours(
    args: argparse.Namespace, groups: list[list[Clip]], side: Workers
) -> tuple[list[Stream], dict[str, list[Raw]], list[float], dict[str, Any]]:
    """Our server's levels: the streams' references, each door's raw levels (with the
    server's CPU, peak RSS and encoder calls), the encoder passes timed, the server's facts."""
    config = ServerConfig(  # the rest: the defaults
        port=0,
        http_port=0,
        model=args.model,
        max_live_streams=args.max_live_streams,
        live_compute=args.live_compute,
        live_window=args.live_window,
        live_beam_size=args.live_beam_size,
    )
    encoder = Encoder(side)
    encoder.probe(3)
    raw: dict[str, list[Raw]] = {door: [] for door in args.doors}
    with BackgroundServer(config) as server:
        pipe = server.engine.pipeline
        counted = EncoderCount(pipe.model.encoder)
        streams = describe(server.address, groups, args.model)
        spec = {"streams": [[str(c.file) for c in g] for g in groups], "levels": args.levels}
        spec |= {"gRPC": server.address, "Realtime": server.server.http_port}
        spec = {k: v for k, v in spec.items() if k not in DOORS.values() or k in args.doors}
        with Workers({"clients": ("benchmarks.live_scale_clients:cases", (spec,))}, 1) as c:
            for door in args.doors:
                for n in args.levels:
                    encoder.probe()
                    reset_peak("self")
                    cpu0, enc0 = cpu_seconds("self"), counted.snapshot()
                    level = json.loads(c.run(f"{door} {n}")[1])
                    enc1 = counted.snapshot()
                    level["cpu s"] = cpu_seconds("self") - cpu0
                    level["peak RSS MB"] = rss_mb("self")[1]
                    level["encoder passes"] = enc1[0] - enc0[0]
                    level["encoder frames"] = enc1[1] - enc0[1]
                    level["encoder s"] = enc1[2] - enc0[2]
                    raw[door].append(level)
                    print(f"  {door} x{n}: {level['wall s']:.0f} s", flush=True)
        about = {"model": pipe.name, "compute": pipe.compute, "live workers": config.live_workers}
        about["max live streams"] = server.engine.live_streams_for(pipe.name)
    encoder.probe(3)
    return streams, raw, encoder.times, about


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load_start = round(os.getloadavg()[0], 2)
    found = eval_clips(args.model)
    most = max([*args.levels, *([] if "peer" in args.skip else args.peer_levels)])
    groups = sequences(found, most, args.seconds)
    precision = resolve_live_precision(args.live_compute, "auto")  # the live steps' encoder
    side_args = (args.model, "auto", found[0].file.read_bytes(), precision)
    with Workers({"side": ("benchmarks.load:side_cases", side_args)}, torch.get_num_threads()) as s:
        ceilings = results.Ceilings(**json.loads(s.run("ceilings")[1]))
        streams, raw, times, about = run_ours(args, groups, s)
    encoder = sorted(times)[len(times) // 2]
    figures: dict[str, Any] = {}
    rows = [level_row(door, r, streams, encoder) for door in args.doors for r in raw[door]]
    waits = [where_lag_goes(door, r, streams) for door in args.doors for r in raw[door]]
    peer_note, peer_raw = "skipped (--skip peer)", []
    if "peer" not in args.skip:
        from benchmarks.live_peer import run_peer

        peer_raw, peer_note = run_peer(groups, args.peer_levels, args.model)
        rows += [level_row("WhisperLiveKit", r, streams, None) for r in peer_raw]
        waits += [where_lag_goes("WhisperLiveKit", r, streams) for r in peer_raw]
    if args.raw is not None:
        peer_levels = {"WhisperLiveKit": peer_raw} if "peer" not in args.skip else {}
        streams_json = [dataclasses.asdict(s) for s in streams]
        args.raw.write_text(json.dumps({"streams": streams_json, "levels": raw | peer_levels}))
    figures["live streams at real time"] = rows
    figures["where the lag goes: the longest waits"] = waits
    figures["encoder pass, 30 s window"] = {
        "median ms": round(encoder * 1000, 1),
        "passes timed": len(times),
        "min-max ms": f"{min(times) * 1000:.0f}-{max(times) * 1000:.0f}",
    }
    for title, value in figures.items():
        show(title, value)
    settings = {
        "model": about["model"],
        "compute": about["compute"],
        "live compute": f"{args.live_compute}: {precision or 'as the compute'}",
        "live window": args.live_window,
        "live beams": args.live_beam_size,
        "server": f"ServerConfig() but its ports: live_workers {about['live workers']}",
        "max live streams": about["max live streams"],
        "max live streams given": args.max_live_streams or "no (measured)",
        "doors": args.doors,
        "Realtime session": "turn_detection null, 24 kHz PCM16 appends of 100 ms",
        "clips": f"{len(found)} clips of ../shared/eval, {len(groups)} stream sequences",
        "audio a stream s": args.seconds,
        "peer": peer_note,
        "quick": args.quick,
        "load average at the start": load_start,
        "load average at the end": round(os.getloadavg()[0], 2),
        "torch threads": torch.get_num_threads(),
    }
    results.write_from(args, "live_scale", settings, figures, ceilings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
