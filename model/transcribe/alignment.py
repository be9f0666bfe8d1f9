"""Word and token timestamps from cross-attention, with openai-whisper's numbers.

Pure functions over the alignment heads' pre-softmax cross-attention of a teacher-forced pass
over `[*sot_sequence, <|notimestamps|>, *text, <|endoftext|>]`; the tokenizer is a callable.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import torch

from xattn.model.decode.results import FRAMES_PER_SECOND, WordTiming
from xattn.model.decode.tokenizer import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

SENTENCE_END_MARKS = ".。!！?？"
UNICODE_SPLIT_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
_REPLACEMENT_CHAR = "\ufffd"
NETWORK_WIDTH = 15  # median_filter's widest sorting network (width² / 2 min/max pairs)

Decode = Callable[[list[int]], str]


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd `width` along the last dim, reflect-padded.

    The sorted windows' middle value, NaN sorting last, as openai's sort of the unfolded
    windows; up to NETWORK_WIDTH as a sorting network over `width` shifted views (elementwise
    min/max: ~3x faster than sorting the 7-wide windows of 8 heads × 31 tokens × 550 frames,
    the same values). Returns `x` itself when the last dim is not longer than `width // 2`
    (too short to reflect).
    """
    if width <= 0 or width % 2 == 0:
        raise ValueError(f"median filter width must be odd and positive, got {width}")
    pad = width // 2
    n = x.shape[-1]
    if n <= pad:
        return x
    left = torch.arange(pad, 0, -1)  # x[pad], ..., x[1]
    right = torch.arange(n - 2, n - 2 - pad, -1)  # x[n-2], ..., x[n-1-pad]
    index = torch.cat([left, torch.arange(n), right]).to(x.device)
    padded = x[..., index]  # [..., n + 2 * pad]
    if width > NETWORK_WIDTH:
        return padded.unfold(-1, width, 1).kthvalue(pad + 1, dim=-1).values  # [..., n]
    nan = padded.isnan()  # [..., n + 2 * pad]
    has_nan = bool(nan.any())
    finite = padded.masked_fill(nan, math.inf) if has_nan else padded  # NaN as +inf
    wires: list[torch.Tensor | None] = [finite[..., i : i + n] for i in range(width)]
    for i, j, low, high in _median_network(width):  # width × [..., n]
        a, b = wires[i], wires[j]
        wires[i] = a.minimum(b) if low else None
        wires[j] = a.maximum(b) if high else None
    median = wires[pad]  # [..., n]
    assert median is not None
    if has_nan:  # the middle value is NaN when more than half the window is
        count = sum(nan[..., i : i + n].int() for i in range(width))  # [..., n]
        median = median.masked_fill(count > pad, math.nan)
    return median


@cache
def _median_network(width: int) -> tuple[tuple[int, int, bool, bool], ...]:
    """The comparators (i, j, keep min, keep max) of an odd-even transposition sort of `width`
    wires that the middle wire depends on: pruned backwards from it (7 wide: 18 of 21
    comparators, 30 of their 42 outputs)."""
    sort = [(i, i + 1) for r in range(width) for i in range(r % 2, width - 1, 2)]
    needed, kept = {width // 2}, []
    for i, j in reversed(sort):
        low, high = i in needed, j in needed
        if low or high:
            kept.append((i, j, low, high))
            needed |= {i, j}
    return tuple(reversed(kept))


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotone path through `cost` [rows, cols]: (text_indices, time_indices).

    As whisper's CPU DTW: float32 accumulation, a diagonal or vertical step only when strictly
    cheaper than both others (else horizontal), same backtrace. Vectorised per anti-diagonal.
    """
    x = np.asarray(cost, dtype=np.float64)  # [n, m]
    n, m = x.shape
    # Skewed layout: row k, column i holds grid cell (i, k - i) of the padded (n+1, m+1) grid.
    xs = np.full((n + m + 1, n + 1), np.inf)  # [n + m + 1, n + 1]
    for i in range(1, n + 1):
        xs[i + 1 : i + m + 1, i] = x[i - 1]
    acc = np.full((n + m + 1, n + 1), np.inf, dtype=np.float32)  # [n + m + 1, n + 1]
    diag_step = np.zeros((n + m + 1, n + 1), dtype=bool)  # the step into a cell: diagonal,
    up_step = np.zeros((n + m + 1, n + 1), dtype=bool)  # up, else left
    acc[0, 0] = 0.0
    for k in range(2, n + m + 1):  # ~12 numpy calls a diagonal, each writing in place
        lo, hi = max(1, k - m), min(n, k - 1)
        diag = acc[k - 2, lo - 1 : hi]  # [cells]  cell (i-1, j-1)
        up = acc[k - 1, lo - 1 : hi]  # [cells]  cell (i-1, j)
        left = acc[k - 1, lo : hi + 1]  # [cells]  cell (i, j-1)
        take_diag, take_up = diag_step[k, lo : hi + 1], up_step[k, lo : hi + 1]
        np.less(diag, np.minimum(up, left), out=take_diag)  # strictly below both (NaN: no)
        np.less(up, np.minimum(diag, left), out=take_up)
        best = np.where(take_diag, diag, np.where(take_up, up, left))  # [cells] float32
        np.add(xs[k, lo : hi + 1], best, out=acc[k, lo : hi + 1])  # float64 sum, as float32

    path, i, j = [], n, m
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if j == 0:  # column 0 goes up, row 0 left
            i -= 1
        elif i == 0:
            j -= 1
        elif diag_step[i + j, i]:
            i, j = i - 1, j - 1
        elif up_step[i + j, i]:
            i -= 1
        else:
            j -= 1
    steps = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)  # [path_len, 2]
    return steps[:, 0], steps[:, 1]


def split_tokens_on_unicode(
    tokens: Sequence[int], decode_with_timestamps: Decode, eot: int
) -> tuple[list[str], list[list[int]]]:
    """Split wherever the tokens so far decode to whole unicode characters.

    A run ends when its text has no U+FFFD, or one the full decode also has there. Tokens
    left incomplete at the end are dropped, as openai does. `eot` is unused (same signature).
    """
    full = decode_with_timestamps(list(tokens))
    words: list[str] = []
    groups: list[list[int]] = []
    pending: list[int] = []
    offset = 0
    for token in tokens:
        pending.append(token)
        text = decode_with_timestamps(pending)
        bad = text.find(_REPLACEMENT_CHAR)
        genuine = 0 <= offset + bad < len(full) and full[offset + bad] == _REPLACEMENT_CHAR
        if bad < 0 or genuine:
            words.append(text)
            groups.append(pending)
            pending = []
            offset += len(text)
    return words, groups


def split_tokens_on_spaces(
    tokens: Sequence[int], decode_with_timestamps: Decode, eot: int
) -> tuple[list[str], list[list[int]]]:
    """Join unicode pieces into words; a new word starts at a leading space, punctuation or
    a special token (id >= eot)."""
    words: list[str] = []
    groups: list[list[int]] = []
    pieces, piece_groups = split_tokens_on_unicode(tokens, decode_with_timestamps, eot)
    for piece, piece_tokens in zip(pieces, piece_groups, strict=True):
        special = piece_tokens[0] >= eot
        # substring test, as openai's: "" and runs like '!"' count as punctuation
        punctuation = piece.strip() in string.punctuation
        if special or piece.startswith(" ") or punctuation or not words:
            words.append(piece)
            groups.append(list(piece_tokens))
        else:
            words[-1] += piece
            groups[-1].extend(piece_tokens)
    return words, groups


def split_to_word_tokens(
    tokens: Sequence[int], language: str, decode_with_timestamps: Decode, eot: int
) -> tuple[list[str], list[list[int]]]:
    """Words and their tokens: unicode splitting for zh/ja/th/lo/my/yue, spaces otherwise."""
    if language in UNICODE_SPLIT_LANGUAGES:
        return split_tokens_on_unicode(tokens, decode_with_timestamps, eot)
    return split_tokens_on_spaces(tokens, decode_with_timestamps, eot)


@dataclass(frozen=True)
class AlignedWord:
    word: str
    tokens: tuple[int, ...]
    start: float  # seconds from the window start
    end: float
    probability: float  # mean probability of its tokens


def token_probabilities(
    logits: torch.Tensor, *, n_prefix: int, text_tokens: Sequence[int], eot: int
) -> list[float]:
    """Probability of each text token from the teacher-forced logits [n_tokens_total, vocab],
    softmaxed over the ids below `eot` only (text tokens), as openai does."""
    rows = logits[n_prefix - 1 : n_prefix - 1 + len(text_tokens), :eot].float()  # [T, eot]
    probs = rows.softmax(dim=-1)  # [T, eot]
    picked = probs[torch.arange(len(text_tokens)), torch.as_tensor(list(text_tokens))]  # [T]
    return picked.tolist()


def find_alignment(
    scores: torch.Tensor,
    *,
    num_frames: int,
    n_prefix: int,
    text_tokens: list[int],
    text_token_probs: list[float],
    language: str,
    decode_with_timestamps: Decode,
    eot: int,
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
) -> tuple[list[AlignedWord], np.ndarray, np.ndarray]:
    """Align text tokens to encoder frames with DTW over the alignment heads' attention.

    `scores` [heads, n_prefix + len(text_tokens) + 1, frames] holds the pre-softmax
    cross-attention of every input position; `n_prefix` counts the positions before the
    first text token (sot sequence + <|notimestamps|>); `num_frames` the encoder frames of
    real audio. Returns the words and each text token's start and end times [T] (seconds).
    """
    n_text = len(text_tokens)
    if n_text == 0:
        return [], np.zeros(0), np.zeros(0)
    if scores.shape[1] != n_prefix + n_text + 1:
        raise ValueError(f"scores have {scores.shape[1]} rows, want {n_prefix + n_text + 1}")
    weights = scores[:, :, :num_frames].float() * qk_scale  # [heads, tokens, frames]
    weights = weights.softmax(dim=-1)  # [heads, tokens, frames]
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)  # [heads, 1, f]
    weights = (weights - mean) / std  # [heads, tokens, frames]
    weights = median_filter(weights, medfilt_width)  # [heads, tokens, frames]
    matrix = weights.mean(dim=0)  # [tokens, frames]
    # row of the input that predicts each text token, then the one that predicts eot
    matrix = matrix[n_prefix - 1 : n_prefix + n_text]  # [T + 1, frames]
    text_indices, time_indices = dtw((-matrix).double().cpu().numpy())

    jumps = np.diff(text_indices, prepend=text_indices[0] - 1).astype(bool)  # [path_len]
    jump_times = time_indices[jumps] / FRAMES_PER_SECOND  # [T + 1] first step of each row
    token_starts, token_ends = jump_times[:n_text], jump_times[1 : n_text + 1]  # [T], [T]

    words, word_tokens = split_to_word_tokens(
        [*text_tokens, eot], language, decode_with_timestamps, eot
    )
    if len(word_tokens) <= 1:
        return [], token_starts, token_ends
    bounds = np.cumsum([0] + [len(t) for t in word_tokens[:-1]])  # [n_words + 1] (eot's last)
    aligned = [
        AlignedWord(
            word=word,
            tokens=tuple(tokens),
            start=float(jump_times[lo]),
            end=float(jump_times[hi]),
            probability=float(np.mean(text_token_probs[lo:hi])),
        )
        for word, tokens, lo, hi in zip(words, word_tokens, bounds[:-1], bounds[1:], strict=False)
    ]
    return aligned, token_starts, token_ends


def merge_punctuations(
    words: list[AlignedWord],
    prepended: str = PREPEND_PUNCTUATIONS,
    appended: str = APPEND_PUNCTUATIONS,
) -> list[AlignedWord]:
    """Fold punctuation into neighbours; emptied entries stay, with "" and no tokens.

    " x" with x in `prepended` joins the next kept word; a word in `appended` joins the
    previous one unless that ends with a space. The receiver keeps its times and probability.
    Membership is a substring test, as in openai (so "" counts as punctuation).
    """
    text = [w.word for w in words]
    toks = [list(w.tokens) for w in words]
    target = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        if text[i].startswith(" ") and text[i].strip() in prepended:
            text[target] = text[i] + text[target]
            toks[target] = toks[i] + toks[target]
            text[i], toks[i] = "", []
        else:
            target = i
    target = 0
    for j in range(1, len(words)):
        if not text[target].endswith(" ") and text[j] in appended:
            text[target] += text[j]
            toks[target] += toks[j]
            text[j], toks[j] = "", []
        else:
            target = j
    return [replace(w, word=s, tokens=tuple(t)) for w, s, t in zip(words, text, toks, strict=True)]


@dataclass(frozen=True)
class SegmentTokens:
    start: float  # seconds on the file's clock, from the timestamp tokens
    end: float
    text_tokens: tuple[int, ...]  # ids < eot, in order; all segments concatenated = text


@dataclass(frozen=True)
class TimedSegment:
    start: float  # snapped to the first word (or kept, when that word is too long)
    end: float
    words: tuple[WordTiming, ...]


def _round2(x: float) -> float:
    # openai's times are numpy float64, so its round(x, 2) is numpy's rounding
    return float(np.round(x, 2))


def add_word_timestamps(
    segments: Sequence[SegmentTokens],
    words: Sequence[AlignedWord],
    *,
    time_offset: float,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> tuple[list[TimedSegment], float]:
    """Turn one window's `find_alignment` words into per-segment word timings.

    Clamps word durations, merges punctuation, hands words back to segments by token counts,
    snaps segment bounds to their words and adds `time_offset`. Returns the segments and the
    new last speech time: the last word's end (else the last segment's end), which is what
    openai's transcribe carries into the next window.
    """
    if not segments:
        return [], last_speech_timestamp
    durations = np.array([w.end - w.start for w in words])  # [n_words]
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median * 2
    words = list(words)
    if len(durations):
        for i in range(1, len(words)):
            w = words[i]
            if w.end - w.start > max_duration:
                if w.word in SENTENCE_END_MARKS:
                    words[i] = replace(w, end=w.start + max_duration)
                elif words[i - 1].word in SENTENCE_END_MARKS:
                    words[i] = replace(w, start=w.end - max_duration)
    words = merge_punctuations(words, prepend_punctuations, append_punctuations)

    out: list[TimedSegment] = []
    index = 0
    for segment in segments:
        seg_start, seg_end = segment.start, segment.end
        picked: list[AlignedWord] = []
        spans: list[list[float]] = []  # [start, end] per picked word, mutable
        saved = 0
        while index < len(words) and saved < len(segment.text_tokens):
            w = words[index]
            if w.word:
                picked.append(w)
                spans.append([_round2(time_offset + w.start), _round2(time_offset + w.end)])
            saved += len(w.tokens)
            index += 1
        if spans:
            first, last = spans[0], spans[-1]
            second = spans[1] if len(spans) > 1 else None
            # the first (and second) word after a long pause must not be too long
            if first[1] - last_speech_timestamp > median * 4 and (
                first[1] - first[0] > max_duration
                or (second is not None and second[1] - first[0] > max_duration * 2)
            ):
                if second is not None and second[1] - second[0] > max_duration:
                    boundary = max(second[1] / 2, second[1] - max_duration)
                    first[1] = second[0] = boundary
                first[0] = max(0.0, first[1] - max_duration)
            # keep the segment's own start when the first word is too long
            if seg_start < first[1] and seg_start - 0.5 > first[0]:
                first[0] = max(0.0, min(first[1] - median, seg_start))
            else:
                seg_start = first[0]
            # likewise for the end and the last word
            if seg_end > last[0] and seg_end + 0.5 < last[1]:
                last[1] = max(last[0] + median, seg_end)
            else:
                seg_end = last[1]
            last_speech_timestamp = seg_end
        timed = tuple(
            WordTiming(word=w.word, start=s, end=e, probability=w.probability, tokens=w.tokens)
            for w, (s, e) in zip(picked, spans, strict=True)
        )
        out.append(TimedSegment(start=seg_start, end=seg_end, words=timed))
    ends = [s.words[-1].end for s in out if s.words]
    return out, ends[-1] if ends else out[-1].end


def online_token_time(row: np.ndarray, *, num_frames: int | None = None) -> float:
    """Live estimate of when one token was spoken: its attention peak, argmax frame / 50.

    `row` [frames] is the token's alignment-head-mean cross-attention, streamed while
    decoding; `num_frames` (optional) ignores the padding frames after the audio. Unlike
    DTW it sees one token at a time: no monotonicity, no standardisation across tokens, no
    median filter, so consecutive tokens can jump back and forth. Use it only for display;
    final word times come from `find_alignment`.
    """
    valid = row if num_frames is None else row[:num_frames]  # [frames]
    return float(np.argmax(valid)) / FRAMES_PER_SECOND
