"""Long audio side by side, over the long-form set (benchmarks.longform_set): ours sequential,
with vad_filter and batched 8 (greedy and beam 5) against faster-whisper sequential,
vad_filter=True and BatchedInferencePipeline (batch 8, greedy and beam 5): per file and in
total, WER with its substitutions, deletions and insertions, and seconds.

    .venv/bin/python -m benchmarks.longform_vad                       # the set, 5 min a file
    .venv/bin/python -m benchmarks.longform_vad --files pauses --systems ours-b8,fw-b8

Settings: every system fp32, the file's language given, temperature fallback 0.0-1.0 (but
faster-whisper's batched pipeline, which decodes at the first temperature only), condition on
previous text; "beam 5" is beam 5 at temperature 0 and best-of 5 above; greedy is beam 1.
faster-whisper's batched pipeline decodes without timestamps (its default); ours with them.
Each system runs in a process of its own per model (loaded, then warmed up on 5 s); the files
one after another; seconds are each file's wall time. The time goal's pair (ours batched 8 and
faster-whisper batched 8, greedy) runs `--repeat` rounds, taking turns, a fresh process each
round: a file's seconds are the median of its rounds (`seconds each` lists them; one run of
faster-whisper's pipeline took 5.5 s on a file and the next 9.1 s), its WER the first round's.
`fw-b8-cal` is faster-whisper's batched 8 with the VAD threshold ours calibrates to the file
(xattn.model.audio.vad.calibrated; run only on files where it differs from the default): the
same speech decoded, so its seconds are the time goal's at equal work. WER: openai-whisper's
normalisers and jiwer (benchmarks.wer), scored per file against the text it was built from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jiwer

from benchmarks import results
from benchmarks.longform_set import RECIPES, build
from benchmarks.wer import faster_whisper_dir, normalise

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = (  # in the order they run: the goals' three first
    "ours-b8",
    "fw-b8",
    "ours-seq",
    "ours-b8-beam5",
    "fw-b8-beam5",
    "ours-vad",
    "fw-vad",
    "fw-seq",
    "fw-b8-cal",
)
REPEATED = ("ours-b8", "fw-b8")  # the time goal's pair: --repeat rounds, taking turns
RATE = 16000


def counts(reference: str, hypothesis: str, language: str) -> dict[str, int]:
    """Reference words and the substitutions, deletions and insertions after normalising."""
    out = jiwer.process_words(normalise(reference, language), normalise(hypothesis, language))
    return {
        "words": out.substitutions + out.deletions + out.hits,
        "S": out.substitutions,
        "D": out.deletions,
        "I": out.insertions,
    }


def wer(c: dict[str, int]) -> float:
    return round(100 * (c["S"] + c["D"] + c["I"]) / max(c["words"], 1), 2)


def transcriber(system: str, model: str, threads: int):
    """(audio, language) -> text for `system` with `model`, loaded."""
    beam = 5 if system in ("ours-seq", "ours-vad", "fw-seq", "fw-vad") else 1
    beam = 5 if system.endswith("beam5") else beam
    batch = 8 if "-b8" in system else None
    if system.startswith("ours"):
        import torch

        from xattn.model.decode.decoding import DecodeOptions
        from xattn.model.pipeline import load_pipeline

        torch.set_num_threads(threads)
        pipe = load_pipeline(model)

        def run_ours(audio, language):
            options = DecodeOptions(
                language=language,
                beam_size=beam,
                best_of=beam,
                vad_filter=system != "ours-seq",
                batch_size=batch,
            )
            return list(pipe.transcribe(audio, options))[-1].text

        return run_ours
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    fw = WhisperModel(str(faster_whisper_dir(model)), compute_type="float32", cpu_threads=threads)
    if batch:
        pipeline = BatchedInferencePipeline(fw)

        def run_batched(audio, language, threshold=None):
            vad = None if threshold is None else {"threshold": threshold}
            segments, _ = pipeline.transcribe(
                audio, language=language, beam_size=beam, batch_size=batch, vad_parameters=vad
            )
            return "".join(s.text for s in segments)

        return run_batched

    def run_seq(audio, language):
        segments, _ = fw.transcribe(
            audio, language=language, beam_size=beam, best_of=beam, vad_filter=system == "fw-vad"
        )
        return "".join(s.text for s in segments)

    return run_seq


def calibrated_threshold(audio) -> float | None:
    """The VAD threshold ours uses for batched chunks of `audio` where its calibration moves it
    (xattn.model.audio.vad.calibrated), else None."""
    from xattn.model.audio.vad import calibrated, speech_probs
    from xattn.model.transcribe.batched import CHUNK_VAD

    threshold = calibrated(speech_probs(audio), CHUNK_VAD).threshold
    return None if threshold == CHUNK_VAD.threshold else threshold


def one(system: str, model: str, names: list[str], minutes: float, threads: int) -> list[dict]:
    """Run `system` with `model` over the files `names` here; a row per file (fw-b8-cal: only
    the files whose calibrated threshold differs, found before the timing)."""
    files = [build(n, minutes) for n in names]
    extra: dict[str, dict] = {f.name: {} for f in files}
    if system == "fw-b8-cal":
        found = {f.name: calibrated_threshold(f.audio) for f in files}
        files = [f for f in files if found[f.name] is not None]
        extra = {f.name: {"threshold": found[f.name]} for f in files}
    if not files:
        return []
    run = transcriber(system, model, threads)
    run(files[0].audio[: 5 * RATE], files[0].language)  # warm-up
    rows = []
    for f in files:
        t0 = time.perf_counter()
        text = run(f.audio, f.language, **extra[f.name])
        seconds = time.perf_counter() - t0
        c = counts(f.reference, text, f.language)
        rows.append({"file": f.name, "system": system, "seconds": round(seconds, 2)} | c)
        rows[-1]["WER %"] = wer(c)
        print(json.dumps(rows[-1] | {"text": text}), file=sys.stderr, flush=True)
    return rows


def rounds(runs: list[list[dict]]) -> list[dict]:
    """One row per file and system from several rounds of the same runs: the first round's,
    its seconds the median of the rounds' (`seconds each`: every round's)."""
    if len(runs) == 1:
        return runs[0]
    out = []
    for first, *others in zip(*runs, strict=True):
        each = [first["seconds"], *(r["seconds"] for r in others)]
        out.append(first | {"seconds": round(statistics.median(each), 2), "seconds each": each})
    return out


def totals(rows: list[dict]) -> dict[str, dict]:
    """Per system, over every file: seconds, words, S, D, I, WER (fw-b8-cal, which runs on
    some files only, left out)."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["system"] == "fw-b8-cal":
            continue
        t = out.setdefault(r["system"], {"seconds": 0.0, "words": 0, "S": 0, "D": 0, "I": 0})
        for k in ("words", "S", "D", "I"):
            t[k] += r[k]
        t["seconds"] = round(t["seconds"] + r["seconds"], 2)
    for t in out.values():
        t["WER %"] = wer(t)
    return out


def goals(by: dict[tuple[str, str], dict], files: list[str]) -> dict[str, dict]:
    """The issue's goals for ours batched 8 (greedy), per file and in total."""
    out = {}
    for f in files:
        need = [(f, s) for s in ("ours-b8", "ours-seq", "fw-b8")]
        if not all(k in by for k in need):
            continue
        b8, seq, fw = (by[k] for k in need)
        out[f] = {
            "b8 WER ≤ seq + 1 pp": b8["WER %"] <= seq["WER %"] + 1.0,
            "b8 WER ≤ fw-b8": b8["WER %"] <= fw["WER %"],
            "b8 D ≤ fw-b8 D": b8["D"] <= fw["D"],
            "b8 s / fw-b8 s": round(b8["seconds"] / fw["seconds"], 2),
            "time ≤ 0.7×": b8["seconds"] <= 0.7 * fw["seconds"],
        }
        if (f, "fw-b8-cal") in by:  # the same speech decoded by both
            out[f]["b8 s / fw-b8-cal s"] = round(b8["seconds"] / by[f, "fw-b8-cal"]["seconds"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="each file's length")
    parser.add_argument("--files", default=",".join(RECIPES))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of ours-b8 and fw-b8 (median seconds)"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # SYSTEM:MODEL:FILE,FILE -> JSON
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.one:
        system, model, names = args.one.split(":")
        print(json.dumps(one(system, model, names.split(","), args.minutes, args.threads)))
        return
    names = args.files.split(",")
    models: dict[str, list[str]] = {}
    for n in names:
        models.setdefault(RECIPES[n][1], []).append(n)
    for n in names:
        build(n, args.minutes)  # cached before any timing
    import torch

    torch.set_num_threads(args.threads)
    measured = None if args.no_json else results.ceilings()  # once, before the runs
    settings = {
        "minutes a file": args.minutes,
        "threads": args.threads,
        "files": names,
        "rounds of ours-b8 and fw-b8": args.repeat,
    }
    rows: list[dict] = []
    path = None if args.no_json else args.json
    systems = args.systems.split(",")
    repeated = [s for s in systems if s in REPEATED]
    for system in [s for s in systems if s not in repeated[1:]]:
        # the pair takes turns, round after round, where the first of it stands in the list
        turns = [[s] * args.repeat for s in repeated] if system in repeated else [[system]]
        for model, group in models.items():
            runs: dict[str, list[list[dict]]] = {s: [] for s in sum(turns, [])}
            for round_ in zip(*turns, strict=True):
                for name in round_:
                    runs[name].append(run_one(name, model, group, args))
            for each in runs.values():
                for r in rounds(each):
                    rows.append(r)
                    print(
                        f"{r['file']:8s} {r['system']:14s} {r['seconds']:7.1f} s  WER "
                        f"{r['WER %']:6.2f} %  S {r['S']:3d} D {r['D']:3d} I {r['I']:3d}",
                        flush=True,
                    )
        # written after every system (the same file): a long run keeps what it measured
        path = results.write(path, "longform_vad", settings, figures(rows, names), measured)
    for k, v in figures(rows, names)["goals, ours batched 8 (greedy)"].items():
        print(k, v)
    if path is not None:
        print(f"wrote {path}")


def run_one(system: str, model: str, names: list[str], args: argparse.Namespace) -> list[dict]:
    """`one` in a process of its own (the model loaded there): its rows."""
    cmd = [sys.executable, "-m", "benchmarks.longform_vad"]
    cmd += ["--one", f"{system}:{model}:{','.join(names)}"]
    cmd += ["--minutes", str(args.minutes), "--threads", str(args.threads)]
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def figures(rows: list[dict], names: list[str]) -> dict:
    """The run's figure groups: rows per file, totals per system, the goals."""
    rows = sorted(rows, key=lambda r: (names.index(r["file"]), SYSTEMS.index(r["system"])))
    total = totals(rows)
    by = {(r["file"], r["system"]): r for r in rows}
    by |= {("total", s): t for s, t in total.items()}
    met = goals(by, [*names, "total"])
    return {"per file": rows, "in total": total, "goals, ours batched 8 (greedy)": met}


if __name__ == "__main__":
    main()
