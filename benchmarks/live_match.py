"""Live words against the offline transcript of the same audio: which final word is which
spoken word, and how long after its end it arrived (commit lag).

Shared by benchmarks.streaming, benchmarks.live_page, benchmarks.live_scale and its peer
(benchmarks.live_peer). A live word is (text, end, arrived): its normalised text, its end on
the stream's clock where the door says it (gRPC's final words carry DTW times; the Realtime
deltas and WhisperLiveKit's lines do not: None), and when it arrived, on the audio clock
(seconds since the stream's first chunk left, times the feed's speed). A reference word is
(text, end) from the offline transcript's DTW word timestamps.

`matched_pairs` pairs them in order, most pairs first (a longest common subsequence), where a
pair's texts are equal (normalised) and its times agree: the live word's end within `within`
seconds of the reference word's when the live word has one, else the reference word ended no
later than `within` seconds after the live word arrived (no word is final before it was
heard, up to DTW's error). The times keep a repeated clip's words apart, where text alone may
pair a word with the same word of another repetition and count the repetition as delay.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

RefWord = tuple[str, float]  # text, end (s)
LiveWord = tuple[str, float | None, float]  # normalised text, end (s) or None, arrived (s)


def norm(word: str) -> str:
    """A word as matching compares it: lower case, letters, digits and apostrophes."""
    return re.sub(r"[^\w']", "", word.lower())


def words_of(text: str) -> list[str]:
    """`text`'s words, normalised, the empty ones (punctuation alone) dropped."""
    return [w for w in (norm(t) for t in text.split()) if w]


def _fits(live: LiveWord, ref_end: float, within: float) -> bool:
    _, end, arrived = live
    if end is not None:
        return abs(ref_end - end) <= within
    return ref_end <= arrived + within


def matched_pairs(
    ref: Sequence[RefWord], live: Sequence[LiveWord], within: float = 1.0
) -> list[tuple[int, int]]:
    """(reference index, live index) of each matched word, in order (see the module)."""
    said = [norm(w) for w, _ in ref]
    n, m = len(ref), len(live)
    # best[i][j]: the most pairs among ref[i:] and live[j:]
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below = best[i], best[i + 1]
        for j in range(m - 1, -1, -1):
            take = 0
            if said[i] == live[j][0] and _fits(live[j], ref[i][1], within):
                take = below[j + 1] + 1
            row[j] = max(take, below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if (
            said[i] == live[j][0]
            and _fits(live[j], ref[i][1], within)
            and best[i][j] == best[i + 1][j + 1] + 1
        ):
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def matched_delays(
    ref: Sequence[RefWord], live: Sequence[LiveWord], within: float = 1.0
) -> list[float]:
    """Arrival - reference end of each matched live word, in the live words' order."""
    return [live[j][2] - ref[i][1] for i, j in matched_pairs(ref, live, within)]


def waits(
    ref: Sequence[RefWord], live: Sequence[LiveWord], within: float = 1.0
) -> list[tuple[str, float, float]]:
    """(word, its reference end, its lag) of each matched word: where the lag is spent."""
    return [
        (ref[i][0], ref[i][1], live[j][2] - ref[i][1]) for i, j in matched_pairs(ref, live, within)
    ]
