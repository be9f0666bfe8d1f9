"""Speech made on the spot for tests and benchmarks: espeak-ng voices, sox effects, silence
and noise, at 16 kHz mono float32. Deterministic (the noise is seeded); nothing downloaded.

    clip = concat(speak("Hello there.", "en-us"), silence(3), noise(2, 0.02),
                  effect(speak("Guten Tag.", "de"), "sinc", "300-3400"))
"""

from __future__ import annotations

import subprocess

import numpy as np

from xattn.model.audio.features import SAMPLE_RATE, decode_audio


def speak(text: str, voice: str = "en-us", words_per_minute: int = 160) -> np.ndarray:
    """espeak-ng's rendering of `text` with `voice` (`espeak-ng --voices` lists them)."""
    wav = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    return decode_audio(wav)


def effect(audio: np.ndarray, *chain: str) -> np.ndarray:
    """`audio` through a sox effect chain, e.g. ("sinc", "300-3400") or ("speed", "1.3")."""
    raw = np.clip(audio, -1, 1).astype(np.float32).tobytes()
    fmt = ["-t", "raw", "-r", str(SAMPLE_RATE), "-e", "floating-point", "-b", "32", "-c", "1"]
    out = subprocess.run(
        ["sox", *fmt, "-", *fmt, "-", *chain, "rate", str(SAMPLE_RATE)],
        input=raw,
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(out, dtype=np.float32).copy()


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE), dtype=np.float32)


def noise(seconds: float, level: float, seed: int = 0) -> np.ndarray:
    """White noise of standard deviation `level`."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(round(seconds * SAMPLE_RATE)) * level).astype(np.float32)


def concat(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate(parts).astype(np.float32)


def varied_clip() -> np.ndarray:
    """~75 s: leading silence, English in several voices, a telephone band, a speed change,
    noise, a long pause, German and French, trailing noise."""
    return concat(
        silence(2.5),
        speak("The quick brown fox jumps over the lazy dog, then rests by the river.", "en-us"),
        silence(1.0),
        effect(
            speak("Please call me back at your earliest convenience, thank you.", "en-gb"),
            *("sinc", "300-3400"),
        ),
        noise(2.0, 0.02, seed=1),
        effect(speak("Numbers like forty two and nineteen eighty four.", "en-us"), "speed", "1.3"),
        silence(8.0),
        speak("Guten Morgen, wie geht es Ihnen heute?", "de"),
        silence(1.5),
        speak("Bonjour, je voudrais un café, s'il vous plaît.", "fr"),
        silence(1.0),
        effect(
            speak("A slower sentence about the weather in spring.", "en-us", 120), "speed", "0.85"
        ),
        silence(12.0),
        speak("And this is the very last sentence of the clip.", "en-us"),
        noise(3.0, 0.05, seed=2),
    )
