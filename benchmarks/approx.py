"""How far the approximate compute paths stray from fp32: measured, printed, never asserted.

    python -m benchmarks.approx [--models tiny.en base] [--computes bf16-encoder ...]

On speech generated for the purpose (benchmarks/synth.py; no test audio) each path's
transcription with word timestamps is compared with fp32's: whether the tokens are identical
(and where they first differ), whether the text is, and the largest word-time difference over
the words both share in order. `int8-logits` is printed beside them as the exact control.
Where the CPU has no native bf16 the bf16 paths run emulated (slowly) with the same numerics.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import results
from benchmarks.synth import concat, noise, silence, speak, varied_clip
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript
from xattn.model.pipeline import compute_note, load_pipeline


def clips() -> dict[str, np.ndarray]:
    return {
        "silence, speech, noise (12 s)": concat(
            silence(3.0),
            speak("We will meet at the station at seven in the evening.", "en-us"),
            noise(4.0, 0.05, seed=3),
        ),
        "varied, two windows (55 s)": varied_clip(),
    }


def transcribe(model: str, compute: str, audio: np.ndarray) -> tuple[list[int], list, float]:
    pipe = load_pipeline(model, compute=compute)
    t0 = time.perf_counter()
    tokens, words = [], []
    for event in pipe.transcribe(audio, DecodeOptions(word_timestamps=True)):
        if isinstance(event, TokenEvent):
            tokens.append(event.id)
        elif isinstance(event, Transcript):
            words = [(w.word, w.start, w.end) for s in event.segments for w in s.words]
    return tokens, words, time.perf_counter() - t0


def compare(exact: tuple, other: tuple) -> dict[str, object]:
    (a, wa, _), (b, wb, seconds) = exact, other
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    shared = 0
    worst = 0.0
    for x, y in zip(wa, wb, strict=False):
        if x[0] != y[0]:
            break
        shared += 1
        worst = max(worst, abs(x[1] - y[1]), abs(x[2] - y[2]))
    return {
        "tokens identical": first is None,
        "first differing token": "-" if first is None else first,
        "words in step": f"{shared}/{len(wa)}",
        "max word-time difference (s)": round(worst, 3),
        "seconds": round(seconds, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument(
        "--computes",
        nargs="+",
        default=["bf16-encoder", "bf16-encoder+int8-logits", "int8-encoder", "int8-logits"],
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    rows = []
    for clip, audio in clips().items():
        for model in args.models:
            exact = transcribe(model, "fp32", audio)
            for compute in args.computes:
                row = {"clip": clip, "model": model, "compute": compute}
                row |= compare(exact, transcribe(model, compute, audio))
                row["exact by design"] = compute_note(compute)[0]
                rows.append(row)
                print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    results.write_from(args, "approx", vars(args) | {"json": None}, {"against fp32": rows})


if __name__ == "__main__":
    main()
