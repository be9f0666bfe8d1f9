"""In-process transcription from the command line: `python -m xattn.model AUDIO`.

Prints each token as it is decoded with the frame (and time) its cross-attention peaks at,
averaged over the checkpoint's alignment heads, then the segments (and words with --words).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np

from xattn.model.audio.features import AudioError, decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import (
    FRAMES_PER_SECOND,
    Segment,
    TokenEvent,
    Transcript,
    WindowStart,
)
from xattn.model.pipeline import load_pipeline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xattn.model", description=__doc__)
    parser.add_argument("audio", help="a wav/flac/mp3/ogg file")
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base, or a path")
    parser.add_argument("--language", default=None)
    parser.add_argument("--words", action="store_true", help="word timestamps")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = sys.stdout.write

    try:
        audio = decode_audio(args.audio)
    except AudioError as e:
        sys.stderr.write(f"error: {args.audio}: {e}\n")
        return 2
    pipe = load_pipeline(args.model, args.device)
    heads = np.array(pipe.alignment_heads)  # [n_heads, 2]
    options = DecodeOptions(
        language=args.language, word_timestamps=args.words, return_attention=True
    )
    t0 = time.perf_counter()
    out(f"{'token':>16}  peak frame  time     window of {pipe.dims.n_audio_ctx} frames\n")
    for event in pipe.transcribe(audio, options):
        if isinstance(event, WindowStart):
            out(
                f"-- window {event.window} at {event.offset:.2f} s, "
                f"{event.num_frames} frames of audio, language {event.language}\n"
            )
        elif isinstance(event, TokenEvent):
            row = event.attention[heads[:, 0], heads[:, 1]].mean(0)  # [1500]
            peak = int(row.argmax())
            label = event.text if event.text else f"<{event.id}>"
            bar = "#" * int(40 * peak / len(row))
            out(f"{label!r:>16}  {peak:>10}  {peak / FRAMES_PER_SECOND:5.2f} s  {bar}\n")
        elif isinstance(event, Segment):
            out(f"[{event.start:6.2f} -> {event.end:6.2f}] {event.text}\n")
            for w in event.words:
                out(f"    {w.start:6.2f} {w.end:6.2f} {w.probability:.2f} {w.word}\n")
        elif isinstance(event, Transcript):
            elapsed = time.perf_counter() - t0
            out(f"\ntext: {event.text.strip()}\n")
            speed = f"{event.duration:.1f} s of audio in {elapsed:.2f} s"
            out(f"{speed} ({pipe.name}, {pipe.compute})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
