"""Long-form transcription: real-time factor against faster-whisper, and cost per window.

    python -m benchmarks.longform [--minutes 10] [--threads 2] [--model tiny.en]
                                  [--compute auto] [--repeats 3] [--quick]

One process, torch at `--threads` threads. The long audio is made in memory from the shared
clips (../shared/audio/jfk.flac and multilingual.mp3, decoded with `decode_audio`,
alternating, 1 s of silence after each) repeated and cut at `--minutes` minutes. Then:

1. real-time factor (seconds of compute per second of audio) on the whole audio: ours
   (per-token attention rows on, consumed to the `Transcript`) beside faster-whisper float32
   and int8 on the same samples (same threads, beam 1, temperature 0 without fallback,
   language en, condition_on_previous_text on), as seconds, RTF and the ratio to each
   faster-whisper; plus windows, tokens, and how much of ours' text the others share;
2. growth: ours on the first 1, 5 and 20 windows' worth of audio (30, 150, 600 s): seconds
   per window decoded and ms per token, and their ratios to the 1-window input (flat = linear).

Every timing is the median of `--repeats` runs, the cases run round-robin (see
benchmarks/decode.py) so that noise from a shared machine falls on all of them alike.
`--quick`: 1 repeat, 3 minutes, 1, 2 and 5 windows: a smoke test. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import difflib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from benchmarks import results as results_json
from benchmarks.decode import contention, median, round_robin
from benchmarks.end_to_end import ct2_dir
from xattn.model.audio.features import SAMPLE_RATE, decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript, WindowStart
from xattn.model.net.whisper import COMPUTES
from xattn.model.pipeline import Pipeline, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
AUDIO = ROOT.parent / "shared" / "audio"
CLIPS = ("jfk.flac", "multilingual.mp3")
WINDOW_SECONDS = 30
GAP_SECONDS = 1.0
K = TypeVar("K")


@dataclass
class Result:
    """What one transcription produced (the timing is kept apart)."""

    text: str = ""
    windows: int = 0  # ours: WindowStart events; faster-whisper: windows with a segment
    tokens: int = 0  # ours: TokenEvents (timestamps, end-of-text included); fw: segment tokens


def long_audio(seconds: float) -> tuple[np.ndarray, str]:
    """The clips alternating, GAP_SECONDS of silence after each, cut at `seconds`; and how."""
    clips = [decode_audio(AUDIO / name) for name in CLIPS]
    gap = np.zeros(int(GAP_SECONDS * SAMPLE_RATE), dtype=np.float32)
    target = int(seconds * SAMPLE_RATE)
    parts: list[np.ndarray] = []
    total, count = 0, 0
    while total < target:
        clip = clips[count % len(clips)]
        parts += [clip, gap]
        total += len(clip) + len(gap)
        count += 1
    audio = np.ascontiguousarray(np.concatenate(parts)[:target])
    pairs = zip(CLIPS, clips, strict=True)
    lengths = ", ".join(f"{name} {len(c) / SAMPLE_RATE:.1f} s" for name, c in pairs)
    how = (
        f"{lengths}, alternating with {GAP_SECONDS:g} s of silence after each: {count} clips, "
        f"cut at {len(audio) / SAMPLE_RATE:.1f} s ({len(audio) / SAMPLE_RATE / 60:.1f} min)"
    )
    return audio, how


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


def agreement(a: str, b: str) -> float:
    """Share of matching words between two transcripts (difflib ratio over normalised words)."""
    return difflib.SequenceMatcher(None, words(a), words(b), autojunk=False).ratio()


def ours(pipe: Pipeline, audio: np.ndarray) -> Result:
    """Our pipeline with per-token attention rows, its events counted and dropped as they come."""
    opts = DecodeOptions(language="en", temperatures=(0.0,), return_attention=True)
    result = Result()
    for event in pipe.transcribe(audio, opts):
        if isinstance(event, TokenEvent):
            result.tokens += 1
        elif isinstance(event, WindowStart):
            result.windows += 1
        elif isinstance(event, Transcript):
            result.text = event.text
    return result


def faster(model: Any, audio: np.ndarray) -> Result:
    """faster-whisper's WhisperModel.transcribe, its lazy segment generator consumed."""
    segments, _ = model.transcribe(audio, beam_size=1, language="en", temperature=0.0)
    segments = list(segments)  # consuming the generator does the work
    return Result(
        text="".join(s.text for s in segments),
        windows=len({s.seek for s in segments}),  # the seek of the window a segment came from
        tokens=sum(len(s.tokens) for s in segments),
    )


def recorded(
    fn: Callable[[np.ndarray], Result], audio: np.ndarray, out: dict[K, Result], key: K
) -> Callable[[], None]:
    """A round_robin case: fn(audio), its Result left in out[key]."""

    def run() -> None:
        out[key] = fn(audio)

    return run


def rtf_section(
    pipe: Pipeline, audio: np.ndarray, model_name: str, threads: int, repeats: int
) -> list[dict[str, object]]:
    seconds = len(audio) / SAMPLE_RATE
    impls: dict[str, Callable[[np.ndarray], Result]] = {"ours +attention rows": partial(ours, pipe)}
    path = ct2_dir(model_name)
    if path is not None:
        from faster_whisper import WhisperModel

        for ct, label in (("float32", "fp32"), ("int8", "int8")):
            fw = WhisperModel(str(path), device="cpu", compute_type=ct, cpu_threads=threads)
            impls[f"faster-whisper {label}"] = partial(faster, fw)
    for fn in impls.values():  # warm-up on one window (the whole audio would cost a round)
        fn(audio[: WINDOW_SECONDS * SAMPLE_RATE])
    results: dict[str, Result] = {}
    cases = {name: recorded(fn, audio, results, name) for name, fn in impls.items()}
    secs = {name: median(ts) for name, ts in round_robin(cases, repeats, warmup=0).items()}
    print(f"\n1. real-time factor on {seconds:.1f} s (compute seconds per audio second)")
    others = [n for n in secs if n.startswith("faster")]
    cols = "".join(f" {'vs ' + n.removeprefix('faster-whisper '):>9}" for n in others)
    print(
        f"   {'':<22} {'seconds':>8} {'RTF':>7} {'x real time':>11}{cols} "
        f"{'windows':>7} {'tokens':>7} {'ms/token':>8}  words shared with ours"
    )
    base = results["ours +attention rows"].text
    rows: list[dict[str, object]] = []
    for name, s in secs.items():
        r = results[name]
        ratios = "".join(f" {s / secs[o]:8.2f}x" for o in others)
        shared = "-" if name.startswith("ours") else f"{agreement(base, r.text):.1%}"
        print(
            f"   {name:<22} {s:8.2f} {s / seconds:7.4f} {seconds / s:10.1f}x{ratios} "
            f"{r.windows:7d} {r.tokens:7d} {s / max(r.tokens, 1) * 1e3:8.2f}  {shared}"
        )
        row = {"case": name, "seconds": round(s, 2), "RTF": round(s / seconds, 4)}
        row |= {f"vs {o.removeprefix('faster-whisper ')}": round(s / secs[o], 2) for o in others}
        row |= {"windows": r.windows, "tokens": r.tokens}
        rows.append(
            row | {"ms/token": round(s / max(r.tokens, 1) * 1e3, 2), "words shared": shared}
        )
    print(f"   words: {', '.join(f'{n} {len(words(r.text))}' for n, r in results.items())}")
    print(f"   ours, last 200 characters: ...{base.strip()[-200:]}")
    return rows


def growth_section(
    pipe: Pipeline, audio: np.ndarray, sizes: list[int], repeats: int
) -> list[dict[str, object]]:
    fits = [n for n in sizes if n * WINDOW_SECONDS * SAMPLE_RATE <= len(audio)]
    if not fits:
        print(f"\n2. growth: skipped (the audio is shorter than {sizes[0]} windows)")
        return []
    results: dict[int, Result] = {}
    run = partial(ours, pipe)
    cases = {n: recorded(run, audio[: n * WINDOW_SECONDS * SAMPLE_RATE], results, n) for n in fits}
    times = round_robin(cases, repeats, warmup=0)  # already warm: section 1 ran this pipeline
    print("\n2. growth: ours +attention rows on the first N x 30 s of the audio")
    print(
        f"   {'input':>12} {'windows':>8} {'tokens':>7} {'seconds':>8} {'RTF':>7} "
        f"{'s/window':>9} {'ms/token':>9} {'per window vs 1st':>18} {'per token vs 1st':>17}"
    )
    first_w = first_t = 0.0
    rows: list[dict[str, object]] = []
    for n in fits:
        s, r = median(times[n]), results[n]
        per_w, per_t = s / max(r.windows, 1), s / max(r.tokens, 1) * 1e3
        first_w, first_t = first_w or per_w, first_t or per_t
        print(
            f"   {n * WINDOW_SECONDS:>10} s {r.windows:8d} {r.tokens:7d} {s:8.2f} "
            f"{s / (n * WINDOW_SECONDS):7.4f} {per_w:9.3f} {per_t:9.2f} "
            f"{per_w / first_w:17.2f}x {per_t / first_t:16.2f}x"
        )
        rows.append(
            {
                "input s": n * WINDOW_SECONDS,
                "windows": r.windows,
                "tokens": r.tokens,
                "seconds": round(s, 2),
                "s/window": round(per_w, 3),
                "ms/token": round(per_t, 2),
                "per window vs 1st": round(per_w / first_w, 2),
                "per token vs 1st": round(per_t / first_t, 2),
            }
        )
    if len(fits) < len(sizes):
        left = [n for n in sizes if n not in fits]
        print(f"   (left out: {left} windows, longer than the audio)")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, help="length of the long audio (10; 3 --quick)")
    parser.add_argument("--threads", type=int, default=2, help="torch and faster-whisper threads")
    parser.add_argument("--model", default="tiny.en", help="any name load_pipeline takes")
    parser.add_argument("--compute", default="auto", choices=(*COMPUTES, "auto"))
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case (median)")
    parser.add_argument("--windows", help="growth sizes, comma-separated (1,5,20; 1,2,5 --quick)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 3 min, 1/2/5 windows")
    results_json.add_arguments(parser)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    minutes = args.minutes or (3.0 if args.quick else 10.0)
    sizes = [int(n) for n in (args.windows or ("1,2,5" if args.quick else "1,5,20")).split(",")]
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    pipe = load_pipeline(args.model, compute=args.compute)
    audio, how = long_audio(minutes * 60)
    print(
        f"xattn long-form benchmark: {args.model}, compute {pipe.compute} (--compute "
        f"{args.compute}), torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"median of {repeats}"
    )
    print(f"audio: {how}")
    before = contention(args.threads)
    print(f"machine: {before}")
    rtf = rtf_section(pipe, audio, args.model, args.threads, repeats)
    growth = growth_section(pipe, audio, sizes, repeats)
    after = contention(args.threads)
    print(f"\nmachine: {after}")
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s")
    settings = {
        "model": args.model,
        "compute": pipe.compute,
        "threads": args.threads,
        "repeats": repeats,
        "audio": how,
        "audio seconds": round(len(audio) / SAMPLE_RATE, 1),
    }
    figures = {
        "machine before": before,
        f"real-time factor on {len(audio) / SAMPLE_RATE:.0f} s": rtf,
        "growth: ours +attention rows on the first N x 30 s": growth,
        "machine after": after,
    }
    results_json.write_from(args, "longform", settings, figures)


if __name__ == "__main__":
    main()
