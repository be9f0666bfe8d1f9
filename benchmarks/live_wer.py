"""Live finals' WER, lag and cost per lever, beside the offline default of the same audio.

    python -m benchmarks.live_wer                          # tiny.en and base, every lever
    python -m benchmarks.live_wer --models tiny.en --levers full margin-2 --jobs 2

Each clip is fed in-process to a LiveTranscriber in chunks of --chunk seconds, as if in real
time but without waiting: lag is on the stream's clock (audio received when a word became
final, minus the word's DTW end). Sets: the English clips of ../shared/eval (their
references) and generated speech (espeak-ng voices with pauses and noise, benchmarks.synth;
deterministic, made at run time). Per lever and model: errors/words of the finals (and of the
offline default transcript, `Pipeline.transcribe` with beam 5 as the server's; with --greedy
also greedy), median and p90 lag, steps, encoder frames and seconds a step, decoder steps.
Levers are LiveOptions fields over its defaults (greedy steps, as the server's: `full`);
`full+beam-5` is the server's --live-beam-size 5. Cost is measured with
whatever else runs on the machine: the load average is recorded; frames are exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from benchmarks import results
from benchmarks.wer import EVAL, Clip, clips, counts

if TYPE_CHECKING:
    from xattn.model.live.types import LiveOptions

# lever -> LiveOptions fields (over LiveOptions' defaults at the time of the run, which are
# stated as the "live default" setting)
CUTS = {"max_jump": 1.0, "tokens_per_second": 8.0, "max_repeats": 2}
NOCUTS = {"max_jump": None, "tokens_per_second": None, "max_repeats": None}
LEVERS: dict[str, dict[str, object]] = {
    "full": {"encode_margin": None, **NOCUTS},
    "full+cuts": {"encode_margin": None, **CUTS},
    "full-bf16": {"encode_margin": None, "precision": "bf16"},
    "full-int8": {"encode_margin": None, "precision": "int8"},
    "margin-1": {"encode_margin": 1.0, **CUTS},
    "margin-2": {"encode_margin": 2.0, **CUTS},
    "margin-3": {"encode_margin": 3.0, **CUTS},
    "margin-2+gate": {"encode_margin": 2.0, **CUTS, "gate_db": -50.0},
    "margin-2-nocuts": {"encode_margin": 2.0, **NOCUTS},
    "margin-2-floor-15": {"encode_margin": 2.0, "encode_floor": 15.0, **NOCUTS},
    "margin-2-floor-20": {"encode_margin": 2.0, "encode_floor": 20.0, **NOCUTS},
    # Realtime's server_vad: speech ends after this many ms of silence (its default, 500)
    "full+vad-500": {"encode_margin": None, **NOCUTS, "vad_silence_ms": 500},
    # the commit rule: first words wait for context, a wider margin, no agreement shortcut
    "full+first-1.5": {"encode_margin": None, **NOCUTS, "first_context": 1.5},
    "full+margin-1.0": {"encode_margin": None, **NOCUTS, "commit_margin": 1.0},
    "full-agree": {"encode_margin": None, **NOCUTS, "agreement": False},
    "full+beam-5": {"encode_margin": None, **NOCUTS, "beam_size": 5},
    "full+beam-2": {"encode_margin": None, **NOCUTS, "beam_size": 2},
    # the server's short window (--live-window short) with its bf16 encoder, and a buffer
    # kept short (it slides past max_buffer s): a step's window stays near the 10 s floor
    "short-bf16": {"encode_margin": 2.0, **NOCUTS, "precision": "bf16"},
    "short-bf16-buffer-8": {"encode_margin": 2.0, **NOCUTS, "precision": "bf16", "max_buffer": 8.0},
    "short-bf16-buffer-12": {
        "encode_margin": 2.0,
        **NOCUTS,
        "precision": "bf16",
        "max_buffer": 12.0,
    },
    "full+beam-5+first-1.5": {
        "encode_margin": None,
        **NOCUTS,
        "beam_size": 5,
        "first_context": 1.5,
    },
}
OFFLINE = {"offline": 5, "offline-greedy": 1}  # offline rows: beams (beam 5 is the default)
DEFAULT_LEVERS = ("full", "margin-2", "margin-2-nocuts")
GENERATED = (  # (text, voice, words a minute, pause after s, noise level)
    ("The meeting starts at nine, so please bring the quarterly report.", "en-us", 160, 1.5, 0),
    ("Turn left at the second light and park behind the old library.", "en-gb", 150, 0.8, 0.01),
    ("She sold three bicycles, two kettles and a painting of the harbour.", "en-us", 175, 2.5, 0),
    ("Could you check whether the backup finished before midnight?", "en-gb", 165, 0.6, 0.02),
    ("Our train was delayed by forty minutes because of a signal failure.", "en-us", 140, 3, 0),
    ("Remember to water the tomatoes and feed the cat on Sunday morning.", "en-us", 170, 1, 0.01),
    (
        "The library closes early on Fridays during the summer holidays.",
        "en-gb-scotland",
        150,
        1.2,
        0,
    ),
    (
        "Please send the invoice to the accounts team by the end of the week.",
        "en-us",
        185,
        0.7,
        0.01,
    ),
    ("My sister moved to a small village near the coast last spring.", "en-gb-x-rp", 160, 2, 0),
    (
        "The doctor said I should rest for three days and drink plenty of water.",
        "en-us",
        150,
        1.5,
        0.02,
    ),
    ("We watched the match on television and our team won by two goals.", "en-029", 160, 0.8, 0),
    (
        "Turn the oven down to one hundred and eighty degrees after twenty minutes.",
        "en-gb",
        170,
        1,
        0.01,
    ),
    (
        "He forgot his umbrella on the bus and walked home in the rain.",
        "en-gb-x-gbclan",
        155,
        2.5,
        0,
    ),
    ("Can you tell me how far it is to the nearest petrol station?", "en-us", 165, 0.6, 0.02),
    (
        "The children built a sandcastle and decorated it with shells and seaweed.",
        "en-gb",
        145,
        1.8,
        0,
    ),
    ("Our new neighbours have two dogs and a very noisy parrot.", "en-us", 175, 1, 0.01),
    (
        "The museum opens at ten and the guided tour starts at half past eleven.",
        "en-gb-scotland",
        160,
        3,
        0,
    ),
    ("I would like a large coffee with milk and a slice of lemon cake.", "en-us", 155, 0.9, 0.02),
    (
        "The bridge will be closed for repairs until the middle of next month.",
        "en-gb-x-rp",
        170,
        1.4,
        0.01,
    ),
    ("She practises the piano for an hour every evening after dinner.", "en-029", 150, 2, 0),
    ("Write down the phone number before you forget it again.", "en-us", 180, 0.7, 0),
    (
        "The garden looks much better since we planted the roses and the lavender.",
        "en-gb",
        160,
        1.2,
        0.02,
    ),
    (
        "Our flight to Lisbon leaves on Tuesday morning at a quarter to seven.",
        "en-us",
        165,
        2.2,
        0.01,
    ),
    (
        "The kettle is broken, so we boiled the water in a saucepan instead.",
        "en-gb-x-gbclan",
        150,
        1,
        0,
    ),
)


@dataclass
class Tally:
    """One lever's (or offline's) figures over a set of clips."""

    texts: list[str] = field(default_factory=list)
    clip_errors: list[int] = field(default_factory=list)
    sub: int = 0
    dele: int = 0
    ins: int = 0
    words: int = 0
    lags: list[float] = field(default_factory=list)
    steps: int = 0
    skipped: int = 0
    encoder_frames: int = 0
    decoder_steps: int = 0
    encode_seconds: float = 0.0
    step_seconds: float = 0.0
    audio_seconds: float = 0.0

    def add(self, clip: Clip, text: str) -> None:
        s, d, i, n = counts(clip.text, text, clip.language)
        self.texts.append(text)
        self.clip_errors.append(s + d + i)
        self.sub, self.dele, self.ins, self.words = (
            self.sub + s,
            self.dele + d,
            self.ins + i,
            self.words + n,
        )

    def row(self, model: str, lever: str, corpus: str) -> dict[str, object]:
        errors = self.sub + self.dele + self.ins
        q = statistics.quantiles(self.lags, n=10) if len(self.lags) > 1 else [0.0] * 9
        steps = max(1, self.steps)
        return {
            "model": model,
            "set": corpus,
            "lever": lever,
            "WER %": round(100 * errors / max(1, self.words), 1),
            "errors/words (S/D/I)": f"{errors}/{self.words} ({self.sub}/{self.dele}/{self.ins})",
            "lag median s": round(statistics.median(self.lags), 2) if self.lags else None,
            "lag p90 s": round(q[8], 2) if self.lags else None,
            "steps": self.steps,
            "skipped steps": self.skipped,
            "encoder frames a step": round(self.encoder_frames / steps),
            "encoder ms a step": round(1000 * self.encode_seconds / steps),
            "decoder steps a step": round(self.decoder_steps / steps, 1),
            "step ms": round(1000 * self.step_seconds / steps),
            "audio s": round(self.audio_seconds, 1),
            "_errors": errors,
            "_words": self.words,
            "_texts": self.texts,
            "_clip_errors": self.clip_errors,
        }


def paired_delta(errors: list[int], base: list[int], words: int, draws: int = 4000) -> str:
    """`errors` minus `base` (per clip, the same clips) in pp of WER, with the 95 % interval of
    a paired bootstrap over clips: "+1.2 (-0.9, +3.4)". An interval wider than a difference
    says the set cannot tell the two apart at that size."""
    diff = np.asarray(errors) - np.asarray(base)  # [clips]
    picks = np.random.default_rng(0).integers(0, len(diff), (draws, len(diff)))  # [draws, clips]
    low, high = np.percentile(diff[picks].sum(axis=1), [2.5, 97.5]) * 100 / words
    return f"{100 * diff.sum() / words:+.1f} ({low:+.1f}, {high:+.1f})"


def compare(rows: list[dict]) -> None:
    """Each row's paired difference from the full-window live row and from offline, where the
    run has them (same model and set)."""
    by = {(r["model"], r["set"], r["lever"]): r for r in rows}
    for r in rows:
        for other, column in (("full", "vs full pp (95 % CI)"), ("offline", "vs offline pp")):
            base = by.get((r["model"], r["set"], other))
            if base is not None and base is not r and r["lever"] != "offline":
                r[column] = paired_delta(r["_clip_errors"], base["_clip_errors"], r["_words"])


def generated() -> list[tuple[Clip, np.ndarray]]:
    """The generated set: each sentence with its pause and noise, one clip each (noise seeded)."""
    from benchmarks.synth import concat, noise, silence, speak

    out = []
    for k, (text, voice, wpm, pause, level) in enumerate(GENERATED):
        speech = speak(text, voice, wpm)
        if level:
            speech = speech + noise(len(speech) / 16000, level, seed=k)[: len(speech)]
        audio = concat(silence(0.5), speech, silence(pause))
        out.append((Clip(EVAL / f"generated-{k}", text, "en"), audio))
    return out


def data_sets(limit: int | None) -> dict[str, list[tuple[Clip, np.ndarray]]]:
    from xattn.model.audio.features import decode_audio

    shared = [(c, decode_audio(str(c.file))) for c in clips(EVAL, True, limit)]
    return {"shared eval (en)": shared, "generated (espeak-ng)": generated()[:limit]}


def live_options(lever: str) -> LiveOptions:
    """The lever's LiveOptions (`vad_silence_ms`: live VAD whose speech ends after that
    much silence)."""
    from xattn.model.live.types import LiveOptions
    from xattn.model.live.vad_stream import LIVE_VAD

    fields = dict(LEVERS[lever])
    silence = fields.pop("vad_silence_ms", None)
    if silence is not None:
        fields["vad"] = dataclasses.replace(LIVE_VAD, min_silence_duration_ms=silence)
    return LiveOptions(**fields)  # type: ignore[arg-type]


def run_job(model: str, lever: str, chunk: float, limit: int | None, threads: int) -> list[dict]:
    """One model and lever (or "offline") over every set, in this process."""
    import torch

    from xattn.model.decode.decoding import DecodeOptions
    from xattn.model.decode.results import Transcript
    from xattn.model.live.transcriber import LiveTranscriber
    from xattn.model.pipeline import load_pipeline

    torch.set_num_threads(threads)
    pipe = load_pipeline(model)
    rows = []
    for corpus, data in data_sets(limit).items():
        tally = Tally()
        for clip, audio in data:
            tally.audio_seconds += len(audio) / 16000
            if lever in OFFLINE:
                t0 = time.perf_counter()
                beams = OFFLINE[lever]
                events = pipe.transcribe(
                    audio, DecodeOptions(language="en", beam_size=beams, best_of=beams)
                )
                tally.add(clip, next(e for e in events if isinstance(e, Transcript)).text)
                tally.step_seconds += time.perf_counter() - t0
                continue
            live = LiveTranscriber(pipe.context, pipe.alignment_heads, live_options(lever))
            finals, n = [], int(chunk * 16000)
            for at in range(0, len(audio), n):
                finals += [
                    r for r in live.feed(audio[at : at + n]) if getattr(r, "is_final", False)
                ]
            finals += live.finish()
            tally.add(clip, "".join(r.text for r in finals))
            tally.lags += [r.audio_seconds - w.end for r in finals for w in r.words]
            s = live.stats
            tally.steps += s.steps
            tally.skipped += s.skipped_steps
            tally.encoder_frames += s.encoder_frames
            tally.decoder_steps += s.decoder_steps
            tally.encode_seconds += s.encode_seconds
            tally.step_seconds += s.step_seconds
        rows.append(tally.row(model, lever, corpus))
        print(f"{model} {lever} {corpus}: {rows[-1]['errors/words (S/D/I)']}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--levers", nargs="+", default=list(DEFAULT_LEVERS), choices=list(LEVERS))
    parser.add_argument("--chunk", type=float, default=0.5, help="seconds of audio a feed")
    parser.add_argument("--limit", type=int, default=None, help="clips of each set")
    parser.add_argument("--jobs", type=int, default=1, help="processes (model x lever each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads a process")
    parser.add_argument("--greedy", action="store_true", help="also the offline greedy row")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    from xattn.model.live.types import LiveOptions
    from xattn.service.engine.limits import Limits, live_defaults

    load_before = [round(x, 2) for x in os.getloadavg()]
    offline = ["offline", "offline-greedy"] if args.greedy else ["offline"]
    jobs = [(m, lv) for m in args.models for lv in [*offline, *args.levers]]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [
            pool.submit(run_job, m, lv, args.chunk, args.limit, args.threads) for m, lv in jobs
        ]
        rows = [r for f in futures for r in f.result()]
    compare(rows)
    raw = {  # each row's texts and counts (settings named _...: raw data, not rendered)
        f"{r['model']} {r['lever']} {r['set']}": {
            k: r.pop(k) for k in [k for k in r if k[0] == "_"]
        }
        for r in rows
    }
    settings = {
        "_raw": raw,
        "models": args.models,
        "chunk s": args.chunk,
        "levers": {lv: LEVERS[lv] for lv in args.levers},
        "live default": repr(LiveOptions()),
        "server's live default": repr(live_defaults(Limits())),
        "offline": "Pipeline.transcribe as the server by default: beam 5, best of 5 (convert.py)",
        "processes": args.jobs,
        "torch threads a process": args.threads,
        "load average before (1, 5, 15 min)": load_before,
        "load average after (1, 5, 15 min)": [round(x, 2) for x in os.getloadavg()],
    }
    results.write_from(args, "live_wer", settings, {"live finals per lever": rows})


if __name__ == "__main__":
    main()
