"""Long audio side by side: ours sequential, with vad_filter, batched (N = 4, 8, 16) against
faster-whisper sequential, vad_filter=True and BatchedInferencePipeline (batch 8, fp32 and
int8): seconds, real-time factor, WER against the text the file was built from, peak RSS.
faster-whisper's batched pipeline decodes text only (its `without_timestamps=True` default);
`ours-b8-text` is ours batched the same way, beside `ours-b8` with timestamps.

    .venv/bin/python -m benchmarks.longform_vad                  # a 10-minute file
    .venv/bin/python -m benchmarks.longform_vad --minutes 3 --systems ours-seq,ours-b8,fw-b8

The file: the English clips of ../shared/eval and jfk.flac (read there, never copied), in a
fixed shuffled order, repeated until `--minutes`, with 1-8 s of silence or faint noise between
them (seeded); its reference text is their transcripts joined. Each system runs in a process of
its own (model loaded and warmed up on 5 s first; the RSS is that process's peak), greedy at
temperature 0 only, English, fp32 unless named int8. WER: openai-whisper's English normaliser
and jiwer (benchmarks.wer).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import results
from benchmarks.wer import errors, faster_whisper_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
JFK_TEXT = (
    "And so my fellow Americans ask not what your country can do for you, ask what you can "
    "do for your country."
)
SYSTEMS = (
    "ours-seq",
    "ours-vad",
    "ours-b4",
    "ours-b8",
    "ours-b16",
    "ours-b8-text",
    "fw-seq",
    "fw-vad",
    "fw-b8",
    "fw-b8-int8",
)
RATE = 16000


def build(minutes: float, seed: int = 0) -> tuple[np.ndarray, str]:
    """The long file and its reference text."""
    from xattn.model.audio import decode_audio

    rows = [json.loads(x) for x in (SHARED / "eval/manifest.jsonl").read_text().splitlines()]
    clips = [(SHARED / "eval" / r["file"], r["text"]) for r in rows if r["language"] == "en"]
    clips.append((SHARED / "audio/jfk.flac", JFK_TEXT))
    decoded = [(decode_audio(p), text) for p, text in clips]
    rng = np.random.default_rng(seed)
    parts, texts, total = [], [], 0
    while total < minutes * 60 * RATE:
        for i in rng.permutation(len(decoded)):
            audio, text = decoded[i]
            gap = int(rng.uniform(1.0, 8.0) * RATE)
            level = 0.0 if rng.random() < 0.5 else 0.003
            parts += [(rng.standard_normal(gap) * level).astype(np.float32), audio]
            texts.append(text)
            total += gap + len(audio)
            if total >= minutes * 60 * RATE:
                break
    return np.concatenate(parts), " ".join(texts)


def transcriber(system: str, threads: int):
    """(audio) -> text for `system`, loaded."""
    if system.startswith("ours"):
        import torch

        from xattn.model.decoding import DecodeOptions
        from xattn.model.pipeline import load_pipeline

        torch.set_num_threads(threads)
        pipe = load_pipeline("tiny.en")
        batch = int(system[6:].split("-")[0]) if system.startswith("ours-b") else None
        options = DecodeOptions(
            language="en",
            temperatures=(0.0,),
            vad_filter=system != "ours-seq",
            batch_size=batch,
            without_timestamps=system.endswith("-text"),
        )
        return lambda audio: list(pipe.transcribe(audio, options))[-1].text
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    compute = "int8" if system.endswith("int8") else "float32"
    model = WhisperModel(
        str(faster_whisper_dir("tiny.en")), compute_type=compute, cpu_threads=threads
    )
    if system.startswith("fw-b"):
        batched = BatchedInferencePipeline(model)
        size = int(system[4:].split("-")[0])

        def run(audio):
            segments, _ = batched.transcribe(
                audio, language="en", beam_size=1, temperature=0.0, batch_size=size
            )
            return "".join(s.text for s in segments)

        return run

    def run_seq(audio):
        segments, _ = model.transcribe(
            audio, language="en", beam_size=1, temperature=0.0, vad_filter=system == "fw-vad"
        )
        return "".join(s.text for s in segments)

    return run_seq


def one(system: str, minutes: float, threads: int) -> dict:
    """Run one system here; its figures."""
    audio, reference = build(minutes)
    run = transcriber(system, threads)
    run(audio[: 5 * RATE])  # warm-up
    t0 = time.perf_counter()
    text = run(audio)
    seconds = time.perf_counter() - t0
    wrong, n = errors(reference, text, "en")
    return {
        "system": system,
        "seconds": round(seconds, 2),
        "RTF": round(seconds / (len(audio) / RATE), 4),
        "WER %": round(100 * wrong / n, 2),
        "peak RSS MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one system, print its JSON
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.minutes, args.threads)))
        return
    rows = []
    for system in args.systems.split(","):
        cmd = [sys.executable, "-m", "benchmarks.longform_vad", "--one", system]
        cmd += ["--minutes", str(args.minutes), "--threads", str(args.threads)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['system']:12s} {r['seconds']:8.1f} s  RTF {r['RTF']:.3f}  "
            f"WER {r['WER %']:5.1f} %  RSS {r['peak RSS MB']:5d} MB",
            flush=True,
        )
    by = {r["system"]: r for r in rows}
    ratios = {}
    if "ours-seq" in by and "ours-b8" in by:
        ratios["ours sequential / ours batched 8"] = round(
            by["ours-seq"]["seconds"] / by["ours-b8"]["seconds"], 2
        )
    if "ours-seq" in by and "ours-b8-text" in by:
        ratios["ours sequential / ours batched 8 text-only"] = round(
            by["ours-seq"]["seconds"] / by["ours-b8-text"]["seconds"], 2
        )
    for ours in ("ours-b8", "ours-b8-text"):
        if "fw-b8" in by and ours in by:
            name = "batched 8 text-only" if ours.endswith("text") else "batched 8"
            ratios[f"ours {name} / faster-whisper batched 8 (fp32)"] = round(
                by[ours]["seconds"] / by["fw-b8"]["seconds"], 2
            )
    for k, v in ratios.items():
        print(f"{k}: {v}")
    if not args.no_json:
        settings = {"minutes": args.minutes, "threads": args.threads, "model": "tiny.en"}
        figures = {"long-form, VAD and batches": rows, "ratios": ratios}
        path = results.write(args.json, "longform_vad", settings, figures)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
