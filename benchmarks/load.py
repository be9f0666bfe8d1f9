"""Load on one host: our server with its defaults under 1-32 concurrent clients over gRPC and
HTTP, beside faster-whisper-server; live streams; a long file among short ones.

    python -m benchmarks.load            # the whole run (about 15-25 min on 2 cores)
    python -m benchmarks.load --quick    # levels 1 and 2, a request or two each: a smoke test
    python -m benchmarks.load --skip peer,mixed --levels 1 4 --workers 2

One server in this process, `ServerConfig()` but for its ports (gRPC and the HTTP face; the
model, compute, workers and queue are the defaults; `--workers N` passes one on, to
compare); the clients in a process of their own (benchmarks.load_clients), sending the
English clips of ../shared/eval (read there) in turn, back to back:

1. encoder-bound limit: a 30 s window through the encoder in a process of its own (median
   of passes before, between and after the sections), windows per request, the limit, the
   encoder's GFLOP/s against the fp32 matmul ceiling and the memory bandwidth;
2. load: per level, beam 5 (nothing set) and greedy, gRPC StreamTranscribe and HTTP (json
   and stream=true in turn): req/s, audio s/s, share of the limit, p50/p99/mean latency from
   the first attempt, time to the first text, refusals, peak RSS, and the floors;
3. the peer, faster-whisper-server (benchmarks.load_peer), under the same clients over its
   HTTP API, and its texts against ours per clip;
4. live: benchmarks.streaming's streams and commit lag, 1 alone and `--live-streams` at once;
5. mixed: short-clip clients alone, then beside one long file (benchmarks.longform_set).
What each number means: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks import results
from benchmarks.decode import decode_floor, encoder_flops
from benchmarks.grpc_load import percentile
from benchmarks.load_clients import DECODINGS, busy_rate, case_name, ended_within, summary
from benchmarks.load_peer import MODEL, VENV, PeerServer, peer_python
from benchmarks.longform_set import RATE, build
from benchmarks.render import table
from benchmarks.service import in_process_cases, reset_peak, rss_mb
from benchmarks.wer import EVAL, errors, faster_whisper_dir, normalise
from benchmarks.workers import Workers
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig

WINDOW = 30.0  # seconds of audio an encoder pass covers
SECTIONS = ("peer", "live", "mixed")
PEER = "faster-whisper-server"
Row = dict[str, Any]
DecodeFloor = Callable[[float, float, int], float]  # windows, steps, rows -> seconds


def english_clips() -> list[tuple[Path, float]]:
    """(path, seconds) of the English clips of ../shared/eval, in the manifest's order."""
    rows = [json.loads(line) for line in (EVAL / "manifest.jsonl").read_text().splitlines()]
    return [(EVAL / r["file"], float(r["seconds"])) for r in rows if r["language"] == "en"]


def windows(seconds: float) -> int:
    return max(1, math.ceil(seconds / WINDOW))


def side_cases(
    model: str, compute: str, clip: bytes, precision: str | None = None
) -> dict[str, Callable[[], str]]:
    """For benchmarks.workers: one 30 s encoder pass (benchmarks.service's; at `precision`,
    None: the compute's) and the ceilings."""
    encoder = in_process_cases(model, compute, clip, precision)["encoder"]
    ceilings = lambda: json.dumps(dataclasses.asdict(results.ceilings()))  # noqa: E731
    return {"encoder": encoder, "ceilings": ceilings}


class Encoder:
    """The side process's encoder passes, timed at several points of the run (while no
    request is in flight): on a shared host the run's conditions change, and the limit and
    floors are read against the median of all of them."""

    def __init__(self, side: Workers) -> None:
        self.side = side
        self.times: list[float] = []
        side.run("encoder")  # untimed

    def probe(self, repeats: int = 1) -> None:
        self.times += [self.side.run("encoder")[0] for _ in range(repeats)]

    @property
    def seconds(self) -> float:
        return statistics.median(self.times)


def long_file(minutes: float, folder: Path) -> tuple[Path, float]:
    """longform_set's `pauses` file as 16-bit WAV under `folder` (temporary)."""
    import soundfile

    f = build("pauses", minutes)
    path = folder / "long.wav"
    soundfile.write(path, f.audio, RATE, subtype="PCM_16")
    return path, f.seconds


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


class Levels:
    """Every level run (its raw samples and the server's peak RSS) and the texts per clip;
    their rows once the encoder's time is known."""

    def __init__(self, seconds: list[float], probe: Callable[[], None]) -> None:
        self.seconds, self.probe = seconds, probe  # probe(): an encoder pass between levels
        self.wins = [windows(s) for s in seconds]
        self.runs: list[tuple[str, str, str, Row, float]] = []
        self.texts: dict[tuple[str, str], dict[int, str]] = {}  # (server, decoding): clip: text

    def run(
        self,
        clients: Workers,
        server: str,
        faces: list[str],
        levels: list[int],
        pid: int | str,
        decodings: tuple[str, ...] = tuple(DECODINGS),
        counted: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """Every level of `clients` for `faces`, the peak RSS of process `pid` during each;
        `counted()`: the windows the server has encoded and the tokens it has decoded so far
        (ours: its counters)."""
        for decoding in decodings:
            for face in faces:
                for level in levels:
                    self.probe()
                    reset_peak(pid)
                    before = counted() if counted is not None else None
                    raw = json.loads(clients.run(case_name(face, decoding, level))[1])
                    if before is not None and counted is not None:
                        after = counted()
                        raw["windows encoded"] = after[0] - before[0]
                        raw["tokens decoded"] = after[1] - before[1]
                    self.runs.append((server, face, decoding, raw, rss_mb(pid)[1]))
                    for x in raw["sent"]:
                        if x["text"] is not None:
                            texts = self.texts.setdefault((server, decoding), {})
                            texts.setdefault(x["clip"], x["text"])
                    s = summary(raw["sent"], raw["wall"])
                    note = f", errors: {s['errors']}" if s["errors"] else ""
                    p50 = rounded(s["p50"])
                    print(f"  {server} {face} {decoding} x{level}: {s['rps']:.2f} req/s, p50 "
                          f"{p50} s, refused {s['refused']}{note}", flush=True)  # fmt: skip

    def rows(self, encoder: float, server: str, floor: DecodeFloor | None = None) -> list[Row]:
        """`floor(windows, steps, rows)`: a request's decoding at the ceilings (decode_floor)."""
        return [self.row(*run, encoder, floor) for run in self.runs if run[0] == server]

    def alone(self, server: str, face: str, decoding: str) -> dict[int, float]:
        """Each clip's median latency at the fewest clients (1) of this server, face and
        decoding: what `slowdown` divides by."""
        runs = [r for r in self.runs if r[:3] == (server, face, decoding)]
        if not runs:
            return {}
        raw = min(runs, key=lambda r: r[3]["clients"])[3]
        by_clip: dict[int, list[float]] = {}
        for x in raw["sent"]:
            if x["error"] is None:
                by_clip.setdefault(x["clip"], []).append(x["latency"])
        return {c: statistics.median(v) for c, v in by_clip.items()}

    def slowdown(self, sent: list[Row], alone: dict[int, float]) -> tuple[float, float] | None:
        """p50 and p99 of each request's latency over its clip's latency alone."""
        ratios = [x["latency"] / alone[x["clip"]] for x in sent if x["error"] is None and
                  alone.get(x["clip"])]  # fmt: skip
        return (percentile(ratios, 50), percentile(ratios, 99)) if ratios else None

    def row(
        self,
        server: str,
        face: str,
        decoding: str,
        raw: Row,
        peak: float,
        encoder: float,
        floor: DecodeFloor | None = None,
    ) -> Row:
        sent, wall, clients = raw["sent"], raw["wall"], raw["clients"]
        s = summary(sent, wall)
        ok = [x for x in sent if x["error"] is None]
        passes = sum(self.wins[x["clip"]] for x in ok)
        busy = raw.get("busy")  # while every client was sending (load_clients.run_level)
        busy_passes = sum(self.wins[x["clip"]] for x in ended_within(sent, busy)) if busy else 0
        mean_windows = statistics.mean(self.wins[x["clip"]] for x in sent)
        encoded, tokens = raw.get("windows encoded"), raw.get("tokens decoded")
        slow = self.slowdown(sent, self.alone(server, face, decoding))
        best = None  # the share of the limit that this work allows at the ceilings
        if floor is not None and encoded and tokens is not None and ok:
            windows, steps = encoded / len(ok), (tokens + encoded) / len(ok)  # an EOT a window
            least = windows * encoder + floor(windows, steps, 5 if decoding == "beam 5" else 1)
            best = passes / len(ok) * encoder / least
        return {
            "server": server,
            "face": face,
            "decoding": decoding,
            "clients": clients,
            "requests": s["requests"],
            "refused": s["refused"],
            "failed": s["failed"],
            "req/s": round(s["rps"], 2),
            "audio s/s": round(sum(self.seconds[x["clip"]] for x in ok) / wall, 1),
            "of limit": f"{passes * encoder / wall:.0%}",
            "req/s, all sending": round(busy_rate(sent, busy), 2) if busy else None,
            "of limit, all sending": f"{busy_passes * encoder / busy:.0%}" if busy else None,
            "windows encoded a request": round(encoded / len(ok), 2) if encoded and ok else None,
            "of limit (windows encoded)": f"{encoded * encoder / wall:.0%}" if encoded else None,
            "tokens a request": round(tokens / len(ok), 1) if tokens is not None and ok else None,
            "of limit at most (floor)": f"{best:.0%}" if best is not None else None,
            "p50 s": rounded(s["p50"]),
            "p99 s": rounded(s["p99"]),
            "p99 / p50": rounded(s["p99"] / s["p50"]) if s["p50"] else None,
            "slowdown p50 / p99": f"{slow[0]:.2f} / {slow[1]:.2f}" if slow else None,
            "mean s": rounded(s["mean"]),
            "mean floor s": round(clients * mean_windows * encoder, 2),
            "first text p50 s": rounded(s["ttft"]),
            "first floor s": round(encoder, 2) if s["ttft"] is not None else None,
            "peak RSS MB": round(peak),
        }


def compare(ours: dict[int, str], theirs: dict[int, str], names: list[str]) -> Row:
    """The clips both transcribed: how many texts are the same after normalising, and the
    peer's word error rate against ours (benchmarks.wer)."""
    common = sorted(set(ours) & set(theirs))
    same = [c for c in common if normalise(ours[c], "en") == normalise(theirs[c], "en")]
    counted = [errors(ours[c], theirs[c], "en") for c in common if normalise(ours[c], "en")]
    wrong, words = sum(e for e, _ in counted), sum(n for _, n in counted)
    return {
        "clips": len(common),
        "same text": len(same),
        "WER % of theirs against ours": round(100 * wrong / max(words, 1), 2),
        "differ": ", ".join(Path(names[c]).stem for c in common if c not in same) or None,
    }


def live_rows(raw: Row, encoder: float) -> list[Row]:
    rows = []
    for runs in (raw["alone"], raw["together"]):
        delays = sorted(d for r in runs for d in r["delays"])
        steps = sum(r["steps"] for r in runs)
        rows.append(
            {
                "streams": len(runs),
                "audio s each": round(statistics.mean(r["audio s"] for r in runs), 1),
                "commit lag median s": round(statistics.median(delays), 2) if delays else None,
                "p90 s": round(percentile(delays, 90), 2) if delays else None,
                "matched words": f"{sum(r['matched'] for r in runs)}/"
                f"{sum(r['words'] for r in runs)}",
                "encoder ms/step": round(1000 * sum(r["encode s"] for r in runs) / max(steps, 1)),
                "floor ms/step": round(1000 * encoder),
                "encoder s a round (floor)": round(len(runs) * encoder, 2),
            }
        )
    return rows


def mixed_figures(raw: Row, long_seconds: float, encoder: float) -> Row:
    alone = summary(raw["alone"]["sent"], raw["alone"]["wall"])
    beside = summary(raw["beside"], raw["wall"])
    long = raw["long"]
    ratio = beside["p50"] / alone["p50"] if alone["p50"] and beside["p50"] else None
    return {
        "short clients": raw["alone"]["clients"],
        "short p50 alone s": rounded(alone["p50"]),
        "short p50 beside the long file s": rounded(beside["p50"]),
        "ratio": rounded(ratio),
        "short requests alone / beside": f"{alone['requests']} / {beside['requests']}",
        "short refusals beside": beside["refused"],
        "long file audio s": round(long_seconds, 1),
        "long file latency s": rounded(long["latency"], 1),
        "long file floor s (windows x encoder)": round(windows(long_seconds) * encoder, 1),
        "long file error": long["error"],
    }


def share(cell: str | None) -> float | None:
    """'42%' -> 0.42."""
    return float(cell.rstrip("%")) / 100 if cell else None


def goal_rows(figures: dict[str, Any], least: int = 8) -> list[Row]:
    """Issue 38's goals against this run's rows, one row a goal and level: at `least` clients
    and more, ours' share of the encoder-bound limit (beam 5: 65 %, greedy: 80 %), requests/s
    over the peer's at the same level and decoding (4x), p99 over p50 (2x); four live streams'
    median commit lag (1.2 s); the short clips beside the long file (1.5x)."""
    out: list[Row] = []
    peer = {(r["decoding"], r["clients"]): r for r in figures.get(f"load: {PEER}", [])}
    for r in figures["load: ours"]:
        if r["clients"] < least:
            continue
        case = f"{r['face']} {r['decoding']} x{r['clients']}"
        bound = 0.65 if r["decoding"] == "beam 5" else 0.80
        most = r.get("of limit at most (floor)")  # what this work allows at the ceilings
        for column in ("of limit", "of limit, all sending"):
            if r.get(column):
                what = f"{column} >= {bound:.0%}"
                measured = f"{r[column]} (at most {most})" if most else r[column]
                out.append(goal(case, what, measured, share(r[column]), bound))
        theirs = peer.get((r["decoding"], r["clients"]))
        pairs = (("req/s", "of limit"), ("req/s, all sending", "of limit, all sending"))
        for column, limit in pairs:
            if theirs and theirs.get(column) and r.get(column):
                x = r[column] / theirs[column]
                what = ">= 4x the peer's " + column
                four = share(theirs.get(limit))  # 4x the peer, as a share of the limit
                measured = f"{x:.2f}x" + (f" (4x: {4 * four:.0%} of the limit)" if four else "")
                out.append(goal(case, what, measured, x, 4.0))
        spread = r.get("p99 / p50")
        if spread is not None:
            out.append(goal(case, "p99 <= 2x p50", f"{spread}x", 2.0, spread))
    for r in figures.get("live streams at real time", [])[1:]:
        lag = r["commit lag median s"]
        name = f"live x{r['streams']}"
        out.append(goal(name, "median commit lag <= 1.2 s", f"{lag} s", 1.2, lag))
    mixed = figures.get("mixed load (beam 5, gRPC)")
    if mixed and mixed["ratio"] is not None:
        ratio = mixed["ratio"]
        out.append(goal("mixed", "short p50 beside / alone <= 1.5", f"{ratio}x", 1.5, ratio))
    return out


def goal(case: str, what: str, measured: str, value: float | None, bound: float | None) -> Row:
    """A goal's row: met when value >= bound (pass them the other way round for at-most)."""
    met = None if value is None or bound is None else value >= bound
    return {"case": case, "goal": what, "measured": measured, "met": met}


def show(title: str, value: list[Row] | Row) -> None:
    rows = value if isinstance(value, list) else [value]
    print(f"\n## {title}\n")
    print("\n".join(table(list(rows[0]), ([r.get(k) for k in rows[0]] for r in rows))))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", help="clients (1 4 8 16 32)")
    parser.add_argument("--requests", type=int, help="requests per client a level (2)")
    parser.add_argument("--min-requests", type=int, help="at least this many a level (24)")
    parser.add_argument("--workers", type=int, help="the server's --workers (its default)")
    parser.add_argument("--skip", default="", help=f"comma-separated: {', '.join(SECTIONS)}")
    parser.add_argument("--peer-venv", type=Path, default=VENV, help="the peer's virtualenv")
    parser.add_argument("--live-streams", type=int, help="streams at once (4)")
    parser.add_argument("--live-seconds", type=float, help="audio a stream, at least (40)")
    parser.add_argument("--long-minutes", type=float, help="the mixed load's long file (10)")
    parser.add_argument("--mixed-clients", type=int, help="short-clip clients (8)")
    parser.add_argument("--quick", action="store_true", help="a few requests, short sections")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    full = {"levels": [1, 4, 8, 16, 32], "requests": 2, "min_requests": 24, "live_streams": 4,
            "live_seconds": 40.0, "long_minutes": 10.0, "mixed_clients": 8}  # fmt: skip
    quick = {"levels": [1, 2], "requests": 1, "min_requests": 3, "live_streams": 2,
             "live_seconds": 8.0, "long_minutes": 1.0, "mixed_clients": 2}  # fmt: skip
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(SECTIONS):
        parser.error(f"--skip takes {', '.join(SECTIONS)}")
    return args


def live_groups(clips: list[tuple[Path, float]], streams: int, seconds: float) -> list[list[str]]:
    """Per stream, clips in turn from a different start until `seconds` of audio."""
    groups = []
    for i in range(streams):
        group, total, k = [], 0.0, i * max(1, len(clips) // streams)
        while total < seconds:
            path, s = clips[k % len(clips)]
            group, total, k = [*group, str(path)], total + s + 1.0, k + 1
        groups.append(group)
    return groups


def run_ours(
    args: argparse.Namespace, config: ServerConfig, spec: dict[str, Any], levels: Levels
) -> tuple[dict[str, Any], Row]:
    """Our server's levels, live streams and mixed load (raw), and its description."""
    raw: dict[str, Any] = {}
    with BackgroundServer(config) as server:  # loads the model on a thread that then ends
        pipe = server.engine.pipeline
        spec = spec | {"gRPC": server.address, "HTTP": server.server.http_port}
        with Workers({"clients": ("benchmarks.load_clients:cases", (spec,))}, 1) as clients:

            def counted() -> tuple[int, int]:
                c = server.engine.counters()
                return c.windows, c.tokens_decoded

            faces = ["gRPC", "HTTP"]
            levels.run(clients, "ours", faces, args.levels, "self", counted=counted)
            for name in ("live", "mixed"):
                if name in spec:
                    print(f"  {name} ...", flush=True)
                    levels.probe()
                    raw[name] = json.loads(clients.run(name)[1])
        about = {
            "model": pipe.name,
            "compute": pipe.compute,
            "dims": pipe.dims,
            "counters": dataclasses.asdict(server.engine.counters()),
        }
    return raw, about


def run_peer(python: Path, spec: dict[str, Any], levels: Levels, args: argparse.Namespace) -> None:
    """faster-whisper-server's levels: a server per decoding, the same clients."""
    for decoding in DECODINGS:
        beam = 1 if decoding == "greedy" else 5
        with PeerServer(python, faster_whisper_dir("tiny.en"), beam) as peer:
            peer_spec = {"clips": spec["clips"], "levels": spec["levels"], "HTTP": peer.port}
            peer_spec |= {"peer": MODEL, "decodings": [decoding]}
            with Workers({"c": ("benchmarks.load_clients:cases", (peer_spec,))}, 1) as c:
                levels.run(c, PEER, ["HTTP"], args.levels, peer.pid, (decoding,))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    load_start = round(os.getloadavg()[0], 2)
    clips = english_clips()
    paths, seconds = [str(p) for p, _ in clips], [s for _, s in clips]
    per_level = [(c, max(args.requests, math.ceil(args.min_requests / c))) for c in args.levels]
    overrides = {"workers": args.workers} if args.workers else {}
    config = ServerConfig(port=0, http_port=0, **overrides)  # the rest: the defaults
    python, peer_note = None, "skipped (--skip peer)"
    if "peer" not in args.skip:
        python, peer_note = peer_python(args.peer_venv)
        peer_note = peer_note if python is not None else f"skipped: {peer_note}"
    print(f"peer: {peer_note}", flush=True)
    spec: dict[str, Any] = {"clips": paths, "levels": per_level, "decodings": list(DECODINGS)}
    if "live" not in args.skip:
        spec["live"] = {"streams": live_groups(clips, args.live_streams, args.live_seconds)}
        spec["live"]["speed"] = 1.0
    long_seconds = 0.0
    side_args = (config.model, config.compute, clips[0][0].read_bytes())
    with (
        tempfile.TemporaryDirectory(prefix="xattn-load-") as folder,
        Workers(
            {"side": ("benchmarks.load:side_cases", side_args)}, torch.get_num_threads()
        ) as side,
    ):
        if "mixed" not in args.skip:
            with ThreadPoolExecutor(1) as passing:  # its torch (resampling) off this thread
                long_path, long_seconds = passing.submit(
                    long_file, args.long_minutes, Path(folder)
                ).result()
            each = max(args.requests, math.ceil(args.min_requests / args.mixed_clients))
            spec["mixed"] = {"long": str(long_path), "clients": args.mixed_clients, "each": each}
        encoder = Encoder(side)
        encoder.probe(5)  # before our server, after it and before each level of both servers
        ceilings = results.Ceilings(**json.loads(side.run("ceilings")[1]))
        levels = Levels(seconds, encoder.probe)
        raw, about = run_ours(args, config, spec, levels)
        encoder.probe(5)
        if python is not None:
            run_peer(python, spec, levels, args)
    times, enc = encoder.times, encoder.seconds
    figures = {"encoder-bound limit": limit_figures(about["dims"], times, seconds, ceilings)}
    figures["load: ours"] = levels.rows(enc, "ours", partial(decode_floor, about["dims"], ceilings))
    if python is not None:
        figures[f"load: {PEER}"] = levels.rows(enc, PEER)
        figures[f"ours and {PEER}: texts per clip (HTTP)"] = [
            {"decoding": d}
            | compare(levels.texts.get(("ours", d), {}), levels.texts.get((PEER, d), {}), paths)
            for d in DECODINGS
        ]
    if "live" in raw:
        figures["live streams at real time"] = live_rows(raw["live"], enc)
    if "mixed" in raw:
        figures["mixed load (beam 5, gRPC)"] = mixed_figures(raw["mixed"], long_seconds, enc)
    figures["goals (issue 38)"] = goal_rows(figures)
    figures["our server's counters"] = about["counters"]
    for title, value in figures.items():
        show(title, value)
    settings = {
        "model": about["model"],
        "compute": about["compute"],
        "server": f"ServerConfig() but its ports: workers {config.workers}"
        f"{' (given)' if overrides else ' (default)'}, max_queue {config.max_queue}",
        "clips": f"{len(clips)} English clips of ../shared/eval, {sum(seconds):.0f} s",
        "requests a level": {c: c * each for c, each in per_level},
        "peer": peer_note,
        "live streams": args.live_streams if "live" in raw else None,
        "long file minutes": args.long_minutes if "mixed" in raw else None,
        "quick": args.quick,
        "load average at the start": load_start,
        "torch threads": torch.get_num_threads(),
    }
    results.write_from(args, "load", settings, figures, ceilings)
    return 0


def limit_figures(dims: Any, times: list[float], seconds: list[float], c: results.Ceilings) -> Row:
    """The encoder-bound limit, the encoder's GFLOP/s against the ceilings."""
    encoder = statistics.median(times)
    flops = sum(encoder_flops(dims).values())
    mean_windows = statistics.mean(windows(s) for s in seconds)
    return {
        "encoder ms per 30 s window (median)": round(encoder * 1e3, 1),
        "passes timed": len(times),
        "min-max ms": f"{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f}",
        "windows per request (mean over the clips)": round(mean_windows, 3),
        "limit req/s": round(1 / (encoder * mean_windows), 2),
        "limit audio s/s": round(statistics.mean(seconds) / (encoder * mean_windows), 1),
        "encoder GFLOP": round(flops / 1e9, 2),
        "encoder GFLOP/s": round(flops / encoder / 1e9, 1),
        "of the fp32 matmul ceiling": f"{flops / encoder / 1e9 / c.fp32_gflops:.0%}",
        "fp32 matmul GFLOP/s": c.fp32_gflops,
        "memory GB/s": c.memory_gbps,
    }


if __name__ == "__main__":
    sys.exit(main())
