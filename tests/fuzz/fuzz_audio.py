"""Coverage-guided fuzzing (atheris, i.e. libFuzzer) of the audio decoding path.

    python tests/fuzz/fuzz_audio.py WORK_DIR tests/fuzz/corpus            # until stopped
    XATTN_FUZZ_SECONDS=600 python tests/fuzz/fuzz_audio.py WORK_DIR tests/fuzz/corpus
    python tests/fuzz/fuzz_audio.py CRASH_FILE                             # replay one input

New inputs go to WORK_DIR (the first folder); tests/fuzz/corpus holds the seeds (see
make_corpus.py). Any input that raises something other than AudioError, returns bad samples,
takes longer than SLOW_SECONDS, or pushes RSS past -rss_limit_mb (default 3072 here) is a
crash: libFuzzer writes it to crash-*/timeout-*/oom-* (see -artifact_prefix). Keep it as a
regression test by copying it into tests/fuzz/regressions/ (tests/test_fuzz.py replays that
folder on every run, and runs this fuzzer for XATTN_FUZZ_SECONDS, default 20).

Inputs starting with PCM_MAGIC go to pcm_to_audio (rate, encoding and channels drawn from the
next 8 bytes); all others to decode_audio(data, max_seconds=MAX_SECONDS). (Not a 0 byte: MP4
files start with one.)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

MAX_SECONDS = 30.0
PCM_MAGIC = b"PCM:"
SLOW_SECONDS = 10.0
PCM_ENCODINGS = ["int16", "float32", "int8", ""]


class Decoder:
    """decode_audio / pcm_to_audio and the checks on what they return."""

    def __init__(self) -> None:
        from xattn.model.audio import features as audio

        self.audio = audio

    def pcm_arguments(self, data: bytes) -> tuple[bytes, int, str, int]:
        """(pcm bytes, rate, encoding, channels) drawn from `data` (after PCM_MAGIC)."""
        n = len(PCM_MAGIC)
        head = data[n : n + 8].ljust(8, b"\0")
        rate = int.from_bytes(head[:4], "little", signed=True) % 500_000 - 10
        channels = head[4] % 40 - 1
        encoding = PCM_ENCODINGS[head[5] % len(PCM_ENCODINGS)]
        return data[n + 8 :], rate, encoding, channels

    def __call__(self, data: bytes) -> str:
        """'ok' or 'refused'; raises AssertionError (or what decoding raised) otherwise."""
        t0 = time.perf_counter()
        try:
            if data.startswith(PCM_MAGIC):
                out = self.audio.pcm_to_audio(*self.pcm_arguments(data))
            else:
                out = self.audio.decode_audio(data, max_seconds=MAX_SECONDS)
        except self.audio.AudioError:
            return "refused"
        finally:
            seconds = time.perf_counter() - t0
            assert seconds < SLOW_SECONDS, f"decoding took {seconds:.1f} s"
        check_output(out, None if data.startswith(PCM_MAGIC) else MAX_SECONDS)
        return "ok"


def check_output(out: object, max_seconds: float | None = None) -> None:
    """What every successful decode returns: non-empty finite 16 kHz mono float32 in [-1, 1]."""
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.ndim == 1
    assert out.size > 0 and bool(np.isfinite(out).all()) and float(np.abs(out).max()) <= 1.0
    if max_seconds is not None:
        assert out.size <= (max_seconds + 1) * 16000, f"{out.size} samples"


def main(argv: list[str]) -> int:
    import atheris

    with atheris.instrument_imports(include=["xattn.model.audio.features"]):
        decoder = Decoder()

    def test_one_input(data: bytes) -> None:
        decoder(data)

    args = list(argv)
    seconds = os.environ.get("XATTN_FUZZ_SECONDS")
    if seconds and not any(a.startswith("-max_total_time=") for a in args):
        args.append(f"-max_total_time={int(float(seconds))}")
    if not any(a.startswith("-rss_limit_mb=") for a in args):
        args.append("-rss_limit_mb=3072")  # torch alone is ~0.7 GB; a decompression bomb is more
    if not any(a.startswith("-timeout=") for a in args):
        args.append(f"-timeout={int(SLOW_SECONDS * 2)}")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
