"""Two transcriptions of one audio side by side: what each side asks for (`SideSpec`), its
result (`Side`), and their words aligned (`align_words`). No I/O: `xattn compare`
(clients/compare.py) and its page (clients/render/compare_html.py) both build on it.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from xattn.clients.data import Result, Word


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
