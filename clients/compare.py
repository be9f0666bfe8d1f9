"""`xattn compare AUDIO --model A --model B`: one audio, two transcriptions, one page.

The two sides are two of the server's models, or one model with two beam sizes (greedy vs
beam: `--beam 1 --beam 5`). The page (clients/render/compare_html.py) shows both alignments
one above the other on the same time axis, the transcripts aligned word by word with their
differences marked, and each side's DTW word boxes.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xattn.clients.data import Result, Word
from xattn.clients.options import Options


@dataclass(frozen=True)
class SideSpec:
    """What one side asks the server for."""

    model: str = ""  # "" = the server's default model
    beam_size: int | None = None  # None: the server's default search; 1: greedy

    @property
    def label(self) -> str:
        search = (
            ""
            if self.beam_size is None
            else (" · greedy" if self.beam_size == 1 else f" · beam {self.beam_size}")
        )
        return f"{self.model or 'default model'}{search}"


@dataclass(frozen=True)
class Side:
    label: str
    result: Result

    @property
    def words(self) -> tuple[Word, ...]:
        return tuple(w for s in self.result.segments for w in s.words)


@dataclass(frozen=True)
class WordPair:
    """One row of the word-by-word alignment: a word of each side, or of one side only."""

    a: Word | None
    b: Word | None
    same: bool  # the same word (ignoring case and punctuation)


def word_key(word: str) -> str:
    """What two words must share to count as the same: letters and digits, lower case."""
    return re.sub(r"[^\w']+", "", word.lower())


def align_words(a: Sequence[Word], b: Sequence[Word]) -> tuple[WordPair, ...]:
    """The two word sequences aligned (difflib's longest matching blocks): equal runs pair
    up, replaced runs pair position by position, the rest stand alone."""
    pairs: list[WordPair] = []
    matcher = difflib.SequenceMatcher(
        a=[word_key(w.word) for w in a], b=[word_key(w.word) for w in b], autojunk=False
    )
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        for wa, wb in itertools.zip_longest(a[i1:i2], b[j1:j2]):
            pairs.append(WordPair(wa, wb, op == "equal"))
    return tuple(pairs)


def differences(pairs: Sequence[WordPair]) -> int:
    return sum(not p.same for p in pairs)


def side_specs(models: Sequence[str], beams: Sequence[int]) -> tuple[SideSpec, SideSpec]:
    """Two sides from the flags: two models, or one model (or none: the default) with two
    beam sizes; a single beam size applies to both."""
    if len(models) > 2 or len(beams) > 2:
        raise ValueError("compare takes at most two --model and two --beam")
    if len(models) < 2 and len(beams) < 2:
        raise ValueError("give two --model (or one model and two --beam, e.g. --beam 1 --beam 5)")
    ms = list(models) * 2 if len(models) == 1 else list(models) or ["", ""]
    bs: list[int | None] = list(beams) * 2 if len(beams) == 1 else list(beams) or [None, None]
    return SideSpec(ms[0], bs[0]), SideSpec(ms[1], bs[1])


def transcribe_side(client, audio: bytes, spec: SideSpec, language: str | None) -> Side:
    """One side's transcription: word timestamps and every head's rows (for the views)."""
    options = Options(beam_size=spec.beam_size) if spec.beam_size is not None else None
    result = client.transcribe(
        audio, language=language, words=True, alignment="mean", options=options, model=spec.model
    )
    return Side(spec.label, result)


def write_compare(a: Side, b: Side, out: str | Path, audio: bytes, audio_name: str) -> Path:
    from xattn.clients.render.compare_html import compare_page

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

    from xattn.clients.cli import BAD_FILE, OK, Fail, check_outputs, open_client

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
