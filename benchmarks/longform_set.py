"""The long-form evaluation set: files of several minutes, built at run time from the real
clips of ../shared/eval (read there, never copied) and audio made here (espeak-ng speech,
numpy noise, tones and a telephone channel), each with the text it was built from.

    .venv/bin/python -m benchmarks.longform_set            # build (cached), list the files

Files (`--minutes` each, 5 by default; seeded, so the same on every run):

- `pauses`: the English clips and jfk in shuffled rounds, pauses of 0.5 to 30 s between them
  (log-uniform), faint white or brown noise in a third of the pauses.
- `no-gap`: the English clips joined with no gap at all, and two synthetic speakers (espeak-ng,
  a male and a female voice) taking turns with them, 0 to 0.3 s apart: speaker changes.
- `tones`: clips with music-like tones (chords of decaying harmonics, a new chord every
  0.25-0.6 s) in most pauses of 1-10 s, and a quiet chord under some clips.
- `phone`: clips with 0.5-8 s pauses through a telephone channel: 8 kHz, 300-3400 Hz, mu-law,
  line noise; back to 16 kHz for the models.
- `spanish` (for base, language es): espeak-ng Spanish and the real Spanish clip, 0.3-5 s
  apart, noise in some pauses.

The audio is cached as .npy under the temp folder (xattn-longform-set), keyed by the builder's
version, the file and the minutes. The synthetic files need espeak-ng (`EspeakMissing` names it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.longform_text import ENGLISH, SPANISH

RATE = 16000
VERSION = 1  # bump when a file's recipe changes (the cache key)
SHARED = Path(__file__).resolve().parents[2] / "shared"
JFK_TEXT = (
    "And so my fellow Americans ask not what your country can do for you, ask what you can "
    "do for your country."
)
CACHE = Path(tempfile.gettempdir()) / "xattn-longform-set"


class EspeakMissing(RuntimeError):
    """A synthetic file asked for without espeak-ng on PATH."""


@dataclass(frozen=True, eq=False)
class LongFile:
    """One file of the set: 16 kHz mono audio and the text it was built from."""

    name: str
    language: str
    model: str  # the model it is scored with
    audio: np.ndarray = field(repr=False)
    reference: str = field(repr=False)

    @property
    def seconds(self) -> float:
        return len(self.audio) / RATE


Clip = tuple[np.ndarray, str]


def real_clips(language: str = "en") -> list[Clip]:
    """The shared eval clips of `language` (and jfk for English), decoded to 16 kHz."""
    from xattn.model.audio import decode_audio

    rows = [json.loads(x) for x in (SHARED / "eval/manifest.jsonl").read_text().splitlines()]
    found = [
        (decode_audio(SHARED / "eval" / r["file"]), r["text"])
        for r in rows
        if r["language"] == language
    ]
    if language == "en":
        found.append((decode_audio(SHARED / "audio/jfk.flac"), JFK_TEXT))
    return found


def espeak(text: str, voice: str, speed: int = 165) -> np.ndarray:
    """`text` spoken by espeak-ng's `voice`, 16 kHz float32."""
    from xattn.model.audio import decode_audio

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise EspeakMissing("the long-form set's synthetic speech needs espeak-ng")
    wav = subprocess.run(
        [exe, "-v", voice, "-s", str(speed), "--stdout", "--", text],
        capture_output=True,
        check=True,
    ).stdout
    audio = decode_audio(wav)
    return (0.5 * audio / max(float(np.abs(audio).max()), 1e-6)).astype(np.float32)


def noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Faint white or brown noise, n samples."""
    level = rng.uniform(0.002, 0.01)
    x = rng.standard_normal(n)
    if rng.random() < 0.5:  # brown: integrated, its drift removed, scaled back
        x = np.cumsum(x)
        x -= np.linspace(x[0], x[-1], n) if n > 1 else x
        x /= max(float(np.std(x)), 1e-9)
    return (level * x).astype(np.float32)


def tones(rng: np.random.Generator, n: int, level: float) -> np.ndarray:
    """Music-like: a chord of three notes with decaying harmonics, a new one every 0.25-0.6 s."""
    out = np.zeros(n, dtype=np.float64)
    pos = 0
    while pos < n:
        length = min(int(rng.uniform(0.25, 0.6) * RATE), n - pos)
        t = np.arange(length) / RATE
        root = 220.0 * 2 ** (rng.integers(-5, 8) / 12)
        chord = np.zeros(length)
        for step in (0, 4, 7):
            f = root * 2 ** (step / 12)
            for h in (1, 2, 3):
                chord += np.sin(2 * np.pi * f * h * t) / h
        envelope = np.exp(-3.0 * t) * np.minimum(1.0, t / 0.01)
        out[pos : pos + length] = chord * envelope
        pos += length
    peak = max(float(np.abs(out).max()), 1e-9)
    return (level * out / peak).astype(np.float32)


def telephone(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A telephone line: 8 kHz, 300-3400 Hz, mu-law 8 bit, faint hiss; back at 16 kHz."""
    from xattn.model.audio import to_16k

    spectrum = np.fft.rfft(audio)
    freqs = np.fft.rfftfreq(len(audio), 1 / RATE)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    narrow = np.fft.irfft(spectrum, len(audio))[::2]  # band-limited below 4 kHz: decimate
    narrow = narrow + 0.002 * rng.standard_normal(len(narrow))
    mu = 255.0
    x = np.clip(narrow, -1, 1)
    code = np.round(np.sign(x) * np.log1p(mu * np.abs(x)) / np.log1p(mu) * 127) / 127
    line = np.sign(code) * np.expm1(np.abs(code) * np.log1p(mu)) / mu
    return to_16k(line.astype(np.float32), 8000)


def rounds(clips: list[Clip], rng: np.random.Generator) -> Iterator[Clip]:
    """The clips in shuffled order, round after round, forever."""
    while True:
        for i in rng.permutation(len(clips)):
            yield clips[i]


def assemble(
    source: Iterator[Clip],
    minutes: float,
    gap: Callable[[], np.ndarray],
    under: Callable[[int], np.ndarray] | None = None,
) -> tuple[np.ndarray, str]:
    """Clips from `source`, each after `gap()`, until `minutes`; (audio, joined text). `under`:
    what to add beneath a clip (or zeros)."""
    parts, texts, total = [], [], 0
    while total < minutes * 60 * RATE:
        audio, text = next(source)
        pause = gap()
        if under is not None:
            audio = audio + under(len(audio))
        parts += [pause, audio.astype(np.float32)]
        texts.append(text)
        total += len(pause) + len(audio)
    return np.concatenate(parts), " ".join(texts)


def silence(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float32)


def build_pauses(minutes: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    def gap() -> np.ndarray:
        n = int(np.exp(rng.uniform(np.log(0.5), np.log(30.0))) * RATE)
        return noise(rng, n) if rng.random() < 1 / 3 else silence(n)

    return assemble(rounds(real_clips(), rng), minutes, gap)


def build_no_gap(minutes: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    real = rounds(real_clips(), rng)
    voices = ("en-us", "en-gb+f3")
    synthetic = iter(
        (espeak(s, voices[i % 2], int(rng.integers(150, 180))), s)
        for i, s in enumerate(ENGLISH * 4)
    )

    def turns() -> Iterator[Clip]:
        while True:
            yield next(real)
            yield next(synthetic)
            yield next(synthetic)

    def gap() -> np.ndarray:
        return silence(0 if rng.random() < 0.6 else int(rng.uniform(0.0, 0.3) * RATE))

    return assemble(turns(), minutes, gap)


def build_tones(minutes: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    def gap() -> np.ndarray:
        n = int(rng.uniform(1.0, 10.0) * RATE)
        return tones(rng, n, rng.uniform(0.05, 0.15)) if rng.random() < 0.75 else silence(n)

    def under(n: int) -> np.ndarray:
        return tones(rng, n, 0.02) if rng.random() < 0.3 else silence(n)

    return assemble(rounds(real_clips(), rng), minutes, gap, under)


def build_phone(minutes: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    def gap() -> np.ndarray:
        n = int(rng.uniform(0.5, 8.0) * RATE)
        return noise(rng, n) if rng.random() < 0.3 else silence(n)

    audio, text = assemble(rounds(real_clips(), rng), minutes, gap)
    return telephone(audio, rng), text


def build_spanish(minutes: float, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    real = rounds(real_clips("es"), rng)
    voices = ("es", "es-419")
    synthetic = iter(
        (espeak(s, voices[i % 2], int(rng.integers(150, 175))), s)
        for i, s in enumerate(SPANISH * 6)
    )

    def source() -> Iterator[Clip]:
        while True:
            for _ in range(4):
                yield next(synthetic)
            yield next(real)

    def gap() -> np.ndarray:
        n = int(rng.uniform(0.3, 5.0) * RATE)
        return noise(rng, n) if rng.random() < 0.3 else silence(n)

    return assemble(source(), minutes, gap)


RECIPES = {  # name: (language, model, builder)
    "pauses": ("en", "tiny.en", build_pauses),
    "no-gap": ("en", "tiny.en", build_no_gap),
    "tones": ("en", "tiny.en", build_tones),
    "phone": ("en", "tiny.en", build_phone),
    "spanish": ("es", "base", build_spanish),
}


def build(name: str, minutes: float = 5.0, seed: int = 0) -> LongFile:
    """File `name` of the set (cached under the temp folder)."""
    language, model, recipe = RECIPES[name]
    key = CACHE / f"v{VERSION}-{name}-{minutes:g}-{seed}"
    audio_path, text_path = key.with_suffix(".npy"), key.with_suffix(".txt")
    if audio_path.is_file() and text_path.is_file():
        audio, text = np.load(audio_path), text_path.read_text()
    else:
        rng = np.random.default_rng([seed, list(RECIPES).index(name)])
        audio, text = recipe(minutes, rng)
        audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
        CACHE.mkdir(parents=True, exist_ok=True)
        np.save(audio_path, audio)
        text_path.write_text(text)
    return LongFile(name, language, model, audio, text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--files", default=",".join(RECIPES))
    args = parser.parse_args(argv)
    for name in args.files.split(","):
        f = build(name, args.minutes)
        words = len(f.reference.split())
        print(f"{f.name:8s} {f.language} {f.model:8s} {f.seconds / 60:5.1f} min {words:5d} words")


if __name__ == "__main__":
    main()
