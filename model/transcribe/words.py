"""Word and token timestamps for a decoded window, from its cached cross-attention.

The window's cross-attention K/V are already in its KVCache, so the only extra work is one
teacher-forced decoder pass over `[sot sequence, <|notimestamps|>, text tokens, <|endoftext|>]`
returning the alignment heads' scores; the math (median filter, DTW, word split, clamps) lives
in `xattn.model.transcribe.alignment` as pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from xattn.model.decode.results import TokenTiming, WordTiming
from xattn.model.decode.tokenizer import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, Tokenizer
from xattn.model.net.kv_cache import KVCache
from xattn.model.net.whisper import Whisper
from xattn.model.transcribe.alignment import (
    SegmentTokens,
    add_word_timestamps,
    find_alignment,
    token_probabilities,
)


@dataclass(frozen=True)
class Piece:
    """A timestamp-delimited piece of a window: a segment before text and words are added."""

    start: float  # seconds, whole-file clock
    end: float
    tokens: tuple[int, ...]


class WordAligner:
    def __init__(self, model: Whisper, tokenizer: Tokenizer, heads: tuple[tuple[int, int], ...]):
        self.model, self.tokenizer, self.heads = model, tokenizer, heads

    def scores(self, cache: KVCache, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits [T, n_vocab] and alignment-head scores [n_heads, T, 1500]."""
        fresh = cache.fork()  # new self-attention rows, the window's cross-attention K/V
        x = torch.tensor([tokens], device=self.model.device)  # [1, T]
        logits, scores = self.model.decoder(x, fresh, need_scores=True)
        picked = torch.stack([scores[layer][0, head] for layer, head in self.heads])  # [h, T, 1500]
        return logits[0], picked

    def align(
        self,
        cache: KVCache,
        sot_sequence: tuple[int, ...],
        pieces: list[Piece],
        num_frames: int,
        language: str,
        time_offset: float,
        last_speech: float,
        prepend: str = PREPEND_PUNCTUATIONS,
        append: str = APPEND_PUNCTUATIONS,
    ) -> tuple[
        list[Piece], list[tuple[WordTiming, ...]], list[tuple[TokenTiming, ...]], float | None
    ]:
        """Pieces with snapped bounds, their words and token timings, and the new last speech
        time (None when the window has no segments). Punctuation in `prepend` joins the next
        word, in `append` the previous one."""
        tok = self.tokenizer
        if not pieces:
            return pieces, [], [], None
        per_piece = [[t for t in p.tokens if t < tok.eot] for p in pieces]
        text_tokens = [t for tokens in per_piece for t in tokens]
        prefix = [*sot_sequence, tok.no_timestamps]
        logits, scores = self.scores(cache, [*prefix, *text_tokens, tok.eot])
        probs = token_probabilities(
            logits, n_prefix=len(prefix), text_tokens=text_tokens, eot=tok.eot
        )
        words, starts, ends = find_alignment(
            scores,
            num_frames=num_frames,
            n_prefix=len(prefix),
            text_tokens=text_tokens,
            text_token_probs=probs,
            language=language,
            decode_with_timestamps=tok.decode_with_timestamps,
            eot=tok.eot,
        )
        segments = [
            SegmentTokens(p.start, p.end, tuple(t)) for p, t in zip(pieces, per_piece, strict=True)
        ]
        timed, last_end = add_word_timestamps(
            segments,
            words,
            time_offset=time_offset,
            last_speech_timestamp=last_speech,
            prepend_punctuations=prepend,
            append_punctuations=append,
        )
        bounds = np.cumsum([0] + [len(t) for t in per_piece])  # [n_pieces + 1]
        timings = [
            tuple(
                TokenTiming(t, round(time_offset + float(s), 2), round(time_offset + float(e), 2))
                for t, s, e in zip(text_tokens[lo:hi], starts[lo:hi], ends[lo:hi], strict=True)
            )
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        pieces = [replace(p, start=t.start, end=t.end) for p, t in zip(pieces, timed, strict=True)]
        return pieces, [t.words for t in timed], timings, last_end
