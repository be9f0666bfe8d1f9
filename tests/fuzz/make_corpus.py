"""Write the fuzzers' seed corpus: tiny real files of each container the server decodes.

    python tests/fuzz/make_corpus.py [FOLDER]    # default: tests/fuzz/corpus

Each is 0.25 s (or less) of a tone with a little noise (deterministic), a few KB: WAV (16-bit;
float stereo), FLAC, Ogg Vorbis and Opus (libsndfile), MP3 and M4A/AAC (FFmpeg through PyAV).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import av
import numpy as np
import soundfile as sf

RATE = 16000


def signal(seconds: float = 0.25, rate: int = RATE, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    tone = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.01 * rng.standard_normal(len(t))
    return np.repeat(tone[:, None], channels, axis=1).astype(np.float32)  # [n, channels]


def soundfile_bytes(
    fmt: str, subtype: str, rate: int = RATE, channels: int = 1, seconds: float = 0.25
) -> bytes:
    buffer = io.BytesIO()
    samples = signal(seconds, rate, channels)
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def pyav_bytes(container: str, codec: str, rate: int) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        samples = signal(rate=rate)[:, 0]
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def corpus() -> dict[str, bytes]:
    return {
        "tone.wav": soundfile_bytes("WAV", "PCM_16"),
        "tone-float-stereo-22k.wav": soundfile_bytes("WAV", "FLOAT", 22050, 2, 0.05),
        "tone-8k.flac": soundfile_bytes("FLAC", "PCM_16", 8000),
        "tone.ogg": soundfile_bytes("OGG", "VORBIS"),
        "tone-opus.ogg": soundfile_bytes("OGG", "OPUS", 48000),
        "tone.mp3": pyav_bytes("mp3", "libmp3lame", 22050),
        "tone.m4a": pyav_bytes("ipod", "aac", 16000),
        "tone-pcm.raw": pcm_bytes(),
    }


def pcm_bytes(rate: int = 44100, channels: int = 2) -> bytes:
    """An input for fuzz_audio.py's raw PCM path: magic, 8 bytes of format, int16 samples."""
    from fuzz_audio import PCM_ENCODINGS, PCM_MAGIC

    head = (rate + 10).to_bytes(4, "little") + bytes([channels + 1, PCM_ENCODINGS.index("int16")])
    samples = (signal(0.05, rate, channels) * 32767).astype("<i2")
    return PCM_MAGIC + head.ljust(8, b"\0") + samples.tobytes()


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in corpus().items():
        (folder / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
