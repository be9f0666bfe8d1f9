"""`xattn transcribe FILE...`: the whisper command's options and output files.

    xattn transcribe a.mp3 b.flac -o out/ -f srt --words --task translate --initial-prompt ...

Each file is transcribed in turn (the live attention view on a terminal); with
`--output-dir` / `--output-format` its results are written as the `whisper` command writes
them (`out/a.srt` ...; xattn.clients.writers). Options left unset keep the server's defaults
(openai-whisper's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console

from xattn.clients.api import OFF, Options, read_audio
from xattn.clients.commands import (
    BAD_FILE,
    OK,
    Fail,
    all_heads,
    check_outputs,
    connect_client,
    live_view,
    run_stream,
)
from xattn.clients.options import Threshold
from xattn.clients.writers import FORMATS, SubtitleOptions, write_result


def _threshold(text: str) -> Threshold:
    """A number, or none/off (the check is not made)."""
    if text.strip().lower() in ("none", "off"):
        return OFF
    return float(text)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(t) for t in text.split(",") if t.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(t) for t in text.split(",") if t.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The output and decoding flags of `xattn transcribe` (whisper's, with dashes)."""
    out = p.add_argument_group("output files (as the whisper command writes them)")
    out.add_argument(
        "-o", "--output-dir", help="write the result files into this folder (with -f alone: .)"
    )
    out.add_argument(
        "-f",
        "--output-format",
        choices=(*FORMATS, "all"),
        help="the files' format (default with -o: all)",
    )
    out.add_argument("--max-line-width", type=int, metavar="N", help="characters per line")
    out.add_argument("--max-line-count", type=int, metavar="N", help="lines per subtitle")
    out.add_argument("--max-words-per-line", type=int, metavar="N", help="words per line")
    out.add_argument(
        "--highlight-words", action="store_true", help="underline each word as it is spoken"
    )
    d = p.add_argument_group("decoding (openai-whisper's and faster-whisper's options)")
    d.add_argument("--task", choices=("transcribe", "translate"), help="translate: into English")
    d.add_argument("--temperature", type=float, metavar="T", help="first temperature (0)")
    d.add_argument(
        "--temperature-increment-on-fallback",
        type=_threshold,
        default=0.2,
        metavar="X",
        help="step of the fallback temperatures up to 1.0 (none: T only; default 0.2)",
    )
    d.add_argument("--initial-prompt", metavar="TEXT", help="prompt of the first window")
    d.add_argument(
        "--no-condition-on-previous-text",
        dest="condition_on_previous_text",
        action="store_false",
        default=None,
        help="do not prompt each window with the previous text",
    )
    d.add_argument("--prefix", metavar="TEXT", help="the first window's text starts with it")
    d.add_argument("--hotwords", metavar="TEXT", help="hint phrases (faster-whisper's)")
    d.add_argument(
        "--suppress-tokens",
        type=_ints,
        metavar="IDS",
        help="comma-separated token ids never sampled; -1: the checkpoint's list (default -1)",
    )
    d.add_argument(
        "--no-suppress-blank",
        dest="suppress_blank",
        action="store_false",
        default=None,
        help="allow a blank as a window's first token",
    )
    d.add_argument("--without-timestamps", action="store_true", help="text only, no timestamps")
    d.add_argument(
        "--max-initial-timestamp", type=float, metavar="S", help="default 1.0; 0: no limit"
    )
    for name, default in (
        ("compression-ratio-threshold", "2.4"),
        ("logprob-threshold", "-1.0"),
        ("no-speech-threshold", "0.6"),
    ):
        d.add_argument(
            f"--{name}", type=_threshold, metavar="X", help=f"default {default}; none: off"
        )
    d.add_argument(
        "--hallucination-silence-threshold",
        type=float,
        metavar="S",
        help="with --words: skip silences longer than S before likely hallucinations",
    )
    d.add_argument(
        "--clip-timestamps",
        type=_floats,
        default=(),
        metavar="S,E,...",
        help="start,end,start,end,... seconds to transcribe (default: all)",
    )
    d.add_argument("--prepend-punctuations", metavar="CHARS", help="joined to the next word")
    d.add_argument("--append-punctuations", metavar="CHARS", help="joined to the previous word")
    v = p.add_argument_group("voice activity detection and batched long-form")
    v.add_argument(
        "--vad", dest="vad_filter", action="store_true", help="decode only the speech (Silero)"
    )
    v.add_argument("--vad-threshold", type=float, metavar="P", help="speech probability (0.5)")
    v.add_argument(
        "--vad-min-silence-ms",
        dest="vad_min_silence_duration_ms",
        type=int,
        metavar="MS",
        help="silence that ends a speech span (2000)",
    )
    v.add_argument("--vad-speech-pad-ms", type=int, metavar="MS", help="padding on each side (400)")
    v.add_argument(
        "--batch-size", type=int, metavar="N", help="decode N windows at once (default: one)"
    )


def temperatures(args: argparse.Namespace) -> tuple[float, ...]:
    """whisper's schedule: T, T + X, ... up to 1.0 (empty: the server's default)."""
    if args.temperature is None:
        return ()
    step = args.temperature_increment_on_fallback
    if step == OFF or step is None:
        return (args.temperature,)
    return tuple(float(t) for t in np.arange(args.temperature, 1.0 + 1e-6, step))


def options(args: argparse.Namespace) -> Options:
    """The Options the flags set (the search flags too: xattn.clients.cli)."""
    names = {f.name for f in dataclasses.fields(Options)}
    values = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return Options(**values)


def subtitle_options(args: argparse.Namespace) -> SubtitleOptions:
    return SubtitleOptions(
        max_line_width=args.max_line_width,
        max_line_count=args.max_line_count,
        max_words_per_line=args.max_words_per_line,
        highlight_words=args.highlight_words,
    )


def run(args: argparse.Namespace, console: Console, err: Console) -> int:
    """Transcribe every AUDIO; the exit status."""
    files = list(args.audio)
    if len(files) > 1 and (args.png or args.html or args.json):
        raise Fail(BAD_FILE, "--png, --html and --json take one AUDIO")
    check_outputs(args.png, args.html)
    output_dir = args.output_dir or ("." if args.output_format else None)
    if output_dir is not None and not Path(output_dir).is_dir():
        raise Fail(BAD_FILE, f"cannot write to {output_dir}: no such folder")
    audios = [read_audio(path) for path in files]  # every file is read before the first call
    client = connect_client(args)
    notes = err if args.json else console
    request = dict(
        language=args.language,
        words=args.words,
        temperatures=temperatures(args),
        options=options(args),
    )
    with client:
        heads = all_heads(client) if args.html else None
        for path, audio in zip(files, audios, strict=True):
            events = client.stream_transcribe(
                audio, alignment="all" if heads else "mean", **request
            )
            view = None if args.json else live_view(client, heads, audio, path)
            result = run_stream(events, console, view)
            if output_dir is not None:
                fmt = args.output_format or "all"
                for written in write_result(result, path, output_dir, fmt, subtitle_options(args)):
                    notes.print(f"wrote {written}", highlight=False, soft_wrap=True)
            if args.png:
                from xattn.clients.render.png import write_png

                for written in write_png(result, args.png):
                    notes.print(f"wrote {written}")
            if args.html:
                from xattn.clients.render.html import write_html

                notes.print(f"wrote {write_html(result, args.html, audio, Path(path).name)}")
            if args.json:
                sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) + "\n")
                sys.stdout.flush()
    return OK
