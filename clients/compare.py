"""`xattn compare AUDIO --model A --model B`: one audio, two transcriptions, one page.

The two sides are two of the server's models, or one model with two beam sizes (greedy vs
beam: `--beam 1 --beam 5`). The page (clients/render/compare_html.py) shows both alignments
one above the other on the same time axis, the transcripts aligned word by word with their
differences marked, and each side's DTW word boxes.
"""

from __future__ import annotations

from pathlib import Path

from xattn.clients.commands import BAD_FILE, OK, Fail, check_outputs, open_client
from xattn.clients.comparison import Side, SideSpec, align_words, differences, side_specs
from xattn.clients.options import Options
from xattn.clients.render.compare_html import compare_page


def transcribe_side(client, audio: bytes, spec: SideSpec, language: str | None) -> Side:
    """One side's transcription: word timestamps and every head's rows (for the views)."""
    options = Options(beam_size=spec.beam_size) if spec.beam_size is not None else None
    result = client.transcribe(
        audio, language=language, words=True, alignment="mean", options=options, model=spec.model
    )
    return Side(spec.label, result)


def write_compare(a: Side, b: Side, out: str | Path, audio: bytes, audio_name: str) -> Path:
    out = Path(out)
    out.write_text(compare_page(a, b, audio, audio_name), "utf-8")
    return out


def add_arguments(p) -> None:
    """`xattn compare`'s own flags (the common ones come from clients/cli.py)."""
    p.add_argument(
        "--model",
        action="append",
        default=[],
        help="a model of the server (GetModelInfo lists them); give two, or one with two --beam",
    )
    p.add_argument(
        "--beam",
        action="append",
        type=int,
        default=[],
        help="beam size of a side (1: greedy); two compare searches, one applies to both",
    )
    p.add_argument("--html", metavar="FILE", help="default: AUDIO's name + .compare.html")


def run(args, console, err) -> int:
    """Transcribe AUDIO on both sides, write the page, print the differing words."""
    from rich.table import Table

    try:
        specs = side_specs(args.model, args.beam)
    except ValueError as e:
        raise Fail(BAD_FILE, str(e)) from e
    check_outputs(args.html)
    audio, client = open_client(args)
    with client:
        a, b = (transcribe_side(client, audio, s, args.language) for s in specs)
    name = Path(args.audio).name
    out = write_compare(a, b, args.html or f"{Path(args.audio).stem}.compare.html", audio, name)
    pairs = align_words(a.words, b.words)
    table = Table("A · " + a.label, "B · " + b.label, "at (s)", title="words that differ")
    for p in pairs:
        if not p.same:
            at = (p.a or p.b).start if (p.a or p.b) else 0.0
            wa, wb = (w.word.strip() if w else "—" for w in (p.a, p.b))
            table.add_row(wa, wb, f"{at:.2f}")
    if table.rows:
        console.print(table)
    console.print(f"{differences(pairs)} of {len(pairs)} words differ; wrote {out}")
    return OK
