"""Comparing transcripts word by word (case and punctuation aside)."""

from __future__ import annotations

import re


def words_of(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def word_distance(a: str, b: str) -> int:
    """Words inserted, deleted or replaced to turn a into b (Levenshtein over words)."""
    x, y = words_of(a), words_of(b)
    row = list(range(len(y) + 1))
    for i, u in enumerate(x, 1):
        diagonal, row[0] = row[0], i
        for j, v in enumerate(y, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (u != v))
    return row[-1]


# Words a live transcript of jfk may differ from the offline one by. Live finals depend on
# where the steps land, which a loaded machine or a burst of audio moves: a first step over
# 3 s of jfk reads "so my" as "so am I" (two edits), and a stream's first words can be
# committed from that one step (no earlier step has to agree: policy.commit_count). Live
# accuracy is measured in benchmarks/live_wer.py.
LIVE_SLACK = 2
