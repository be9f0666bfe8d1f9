"""Beam search and best-of sampling of one window, as openai-whisper's `BeamSearchDecoder`,
its sampling `GreedyDecoder` over `best_of` rows and its `MaximumLikelihoodRanker`.

The rows of a window (beams, samples) step together: one decoder forward per step over a
KVCache of as many rows (`KVCache.reorder` moves each beam's past to its new place; the
window's cross-attention K/V are shared by every row, never copied), through the
StepBatcher when there is one, where a window's step is one multi-row step among the other
decodes' steps.

Each row keeps the Steps of its tokens (token, log-probability, attention row from the
pass that chose it). Tokens are yielded as soon as they can no longer change (`early`): the
prefix shared by every live row and by the best finished candidate so far (a finished
candidate stays a candidate, so one ranked below it can never win; every later candidate
grows from a live row). The rest of the winner's tokens follow when the search ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from xattn.model.decode.decoding import (
    DecodeOptions,
    LogitRules,
    OptionsError,
    Step,
    WindowResult,
    compression_ratio,
    decode_window,
)
from xattn.model.decode.step_batcher import StepBatcher, model_work
from xattn.model.decode.tokenizer import Tokenizer
from xattn.model.net.kv_cache import KVCache
from xattn.model.net.logits import top_k
from xattn.model.net.whisper import Whisper


@dataclass(frozen=True)
class Candidate:
    """A row's sampled tokens so far (with its end-of-text last once finished)."""

    steps: tuple[Step, ...]
    sum_logprob: float  # a float32 value, summed in float32 as the reference does
    finished: bool = False

    @cached_property  # read several times a step: by the search, the rules, the settled prefix
    def tokens(self) -> tuple[int, ...]:
        """The sampled tokens without the end-of-text."""
        n = len(self.steps) - self.finished
        return tuple(s.token for s in self.steps[:n])


def add32(a: float, b: float) -> float:
    """a + b in float32 (the reference's sums are float32 tensors)."""
    return float(np.float32(a) + np.float32(b))


def rank_score(sum_logprob: float, length: int, length_penalty: float | None) -> float:
    """MaximumLikelihoodRanker's score: the sum over the length, or over Google NMT's
    ((5 + length) / 6) ** length_penalty."""
    penalty = length if length_penalty is None else ((5 + length) / 6) ** length_penalty
    return sum_logprob / penalty


def best(candidates: Sequence[Candidate], length_penalty: float | None) -> int:
    """The index of the winner (the first of equal scores, as np.argmax)."""
    scores = [rank_score(c.sum_logprob, len(c.tokens), length_penalty) for c in candidates]
    return int(np.argmax(scores))


def settled(live: Sequence[tuple[int, ...]], leader: tuple[int, ...] | None) -> int:
    """How many tokens every live row and the leading finished candidate share."""
    seqs = [*live, *([leader] if leader is not None else [])]
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


class BeamSearch:
    """The bookkeeping of openai-whisper's BeamSearchDecoder for one window (no torch): each
    update takes every live beam's top beam_size + 1 tokens and keeps the beam_size best
    continuations; those ending in end-of-text join the finished candidates (the best first,
    up to round(beam_size · patience)), which end the search once there are that many."""

    def __init__(self, beam_size: int, patience: float | None, eot: int) -> None:
        self.beam_size = beam_size
        self.max_candidates = round(beam_size * (patience or 1.0))
        if self.max_candidates <= 0:
            raise ValueError(f"beam_size {beam_size} with patience {patience}: no candidates")
        self.eot = eot
        self.live = [Candidate((), 0.0)]  # the first step's rows are one (identical) row
        self.finished: dict[tuple[int, ...], Candidate] = {}

    @property
    def completed(self) -> bool:
        return len(self.finished) >= self.max_candidates

    def update(
        self, top: list[list[tuple[float, int]]], rows: list[np.ndarray | None]
    ) -> list[int]:
        """Extend the live beams by their (logprob, token) candidates `top` (each best first)
        and attention `rows`; return each new beam's source row."""
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], tuple[int, float]] = {}
        for j, beam in enumerate(self.live):
            prefix = beam.tokens
            for logprob, token in top[j]:
                seq = (*prefix, token)
                scores[seq] = add32(beam.sum_logprob, logprob)
                sources[seq] = (j, logprob)
        live, indices, finished = [], [], {}
        for seq in sorted(scores, key=scores.get, reverse=True):
            j, logprob = sources[seq]
            step = Step(seq[-1], logprob, rows[j])
            grown = Candidate((*self.live[j].steps, step), scores[seq], seq[-1] == self.eot)
            if grown.finished:
                finished[seq] = grown
            else:
                live.append(grown)
                indices.append(j)
                if len(live) == self.beam_size:
                    break
        for seq in sorted(finished, key=lambda s: finished[s].sum_logprob, reverse=True):
            if len(self.finished) >= self.max_candidates:
                break
            self.finished[seq] = finished[seq]
        self.live = live
        return indices

    def leader(self, length_penalty: float | None) -> Candidate | None:
        """The finished candidate that would win now."""
        done = list(self.finished.values())
        return done[best(done, length_penalty)] if done else None

    def candidates(self) -> list[Candidate]:
        """The finished ones, topped up with the most likely live beams (as unfinished
        candidates, without an end-of-text) when fewer than beam_size finished."""
        found = list(self.finished.values())
        if len(found) < self.beam_size:
            sums = np.array([c.sum_logprob for c in self.live], dtype=np.float32)
            for j in list(np.argsort(sums))[::-1]:
                found.append(self.live[j])
                if len(found) >= self.beam_size:
                    break
        return found


def attention_all(scores: list[torch.Tensor]) -> np.ndarray:
    """Softmax weights of each row's last query: [rows, n_layer, n_head, 1500]."""
    s = torch.stack([layer[:, :, -1] for layer in scores], dim=1)  # [B, L, H, 1500]
    return s.float().softmax(dim=-1).cpu().numpy()


class WindowRows:
    """The rows of one window stepped together over a KVCache of as many rows."""

    def __init__(
        self, model: Whisper, cache: KVCache, batcher: StepBatcher | None, need: bool
    ) -> None:
        self.model, self.batcher, self.need = model, batcher, need
        model.decoder.pack()  # several rows a step: oneDNN's kernels pay (once a process)
        self.cache = cache.fork()  # its own self-attention rows; the window's cross K/V

    def prompt(self, tokens: tuple[int, ...], sot_index: int, no_speech: int, finish: Callable):
        """The prompt's forward (one row): the no-speech probability and finish(None, the
        last row's logits [1, n_vocab], scores n_layer × [1, H, 1, 1500])."""

        def run() -> tuple[float, object]:
            decoder = self.model.decoder
            x = torch.tensor([tokens], device=self.cache.self_k.device)  # [1, T]
            rows = sorted({sot_index, len(tokens) - 1})
            logits, scores = decoder(x, self.cache, need_scores=self.need, logit_rows=rows)
            no_speech_prob = logits[0, 0].softmax(dim=-1)[no_speech].item()
            last = [layer[:, :, -1:] for layer in scores] if self.need else None
            return no_speech_prob, finish(None, logits[0, -1:], last)  # [1, n_vocab]

        return model_work(self.batcher)(run)

    def step(self, tokens: list[int], reorder: list[int], finish: Callable):
        """One forward of every row (after `reorder`): finish(h, logits [rows, n_vocab],
        scores n_layer × [rows, H, 1, 1500])."""
        if self.batcher is not None:
            return self.batcher.step(tokens, self.cache, self.need, True, finish, reorder)
        self.cache.reorder(reorder)
        decoder = self.model.decoder
        x = torch.tensor(tokens, device=self.cache.self_k.device)[:, None]  # [B, 1]
        h, scores = decoder(x, self.cache, need_scores=self.need, hidden=True)  # [B, 1, d]
        return finish(h[:, 0], decoder.project(h)[:, 0], scores)  # [B, n_vocab]


def filtered(rules: LogitRules, logits: torch.Tensor, histories: list[list[int]]) -> torch.Tensor:
    """Each row's logits [R, n_vocab] through the logit rules given its tokens (in place, the
    reference's filters), and their log-probabilities [R, n_vocab]."""
    rules.mask_rows(logits, histories)
    return rules.prefer_timestamps(logits)  # [R, n_vocab]


def beam_window(
    model: Whisper,
    audio_features: torch.Tensor,
    cache: KVCache,
    tokenizer: Tokenizer,
    initial_tokens: tuple[int, ...],
    sot_index: int,
    rules: LogitRules,
    temperature: float,
    options: DecodeOptions,
    batcher: StepBatcher | None = None,
    generator: torch.Generator | None = None,
) -> Generator[Step, None, WindowResult]:
    """Beam search over one window (temperature 0, options.beam_size beams); yields the
    winner's tokens, the settled prefix while searching (`early`), the rest at the end."""
    need = options.return_attention or options.online_timestamps
    n_ctx = model.dims.n_text_ctx
    sample_len = options.sample_len or n_ctx // 2
    search = BeamSearch(options.beam_size, options.patience, tokenizer.eot)
    rows = WindowRows(model, cache, batcher, need)
    k = options.beam_size + 1

    def finish(h: torch.Tensor | None, logits: torch.Tensor, scores: list | None):
        histories = [[*initial_tokens, *c.tokens] for c in search.live]
        top, ids = top_k(filtered(rules, logits, histories), k)  # [R, k]
        att = attention_all(scores) if need else None  # [R, L, H, 1500]
        values, tokens = top.tolist(), ids.tolist()
        pairs = [list(zip(v, t, strict=True)) for v, t in zip(values, tokens, strict=True)]
        return pairs, [att[r] if att is not None else None for r in range(len(pairs))]

    no_speech_prob, (top, att) = rows.prompt(initial_tokens, sot_index, tokenizer.no_speech, finish)
    sent = 0
    with batcher.joined() if batcher is not None else contextlib.nullcontext():
        for i in range(sample_len):
            sources = search.update(top, att)
            leader = search.leader(options.length_penalty)
            live = [c.tokens for c in search.live]
            n = settled(live, leader.tokens if leader else None)
            ref = search.live[0] if search.live else leader
            for step in ref.steps[sent:n]:
                yield Step(step.token, step.logprob, step.attention, early=True)
            sent = max(sent, n)
            if search.completed or len(initial_tokens) + i + 1 > n_ctx:
                break
            last = [c.steps[-1].token for c in search.live]
            top, att = rows.step(last, sources, finish)
    candidates = search.candidates()
    winner = candidates[best(candidates, options.length_penalty)]
    yield from winner.steps[sent:]
    return window_result(winner, tokenizer, temperature, no_speech_prob)


def window_result(
    winner: Candidate, tokenizer: Tokenizer, temperature: float, no_speech_prob: float
) -> WindowResult:
    tokens = winner.tokens
    text = tokenizer.decode(list(tokens)).strip()
    return WindowResult(
        tokens=tokens,
        temperature=temperature,
        avg_logprob=winner.sum_logprob / (len(tokens) + 1),
        no_speech_prob=no_speech_prob,
        compression_ratio=compression_ratio(text),
        text=text,
    )


def best_of_window(
    model: Whisper,
    audio_features: torch.Tensor,
    cache: KVCache,
    tokenizer: Tokenizer,
    initial_tokens: tuple[int, ...],
    sot_index: int,
    rules: LogitRules,
    temperature: float,
    options: DecodeOptions,
    batcher: StepBatcher | None = None,
    generator: torch.Generator | None = None,
) -> Generator[Step, None, WindowResult]:
    """options.best_of samples of one window at `temperature > 0` as one batched forward a
    step, the most likely kept (the ranker's score). The draws are the reference's: one
    multinomial over every sample's row a step, finished ones included (their tokens
    dropped), from one generator."""
    need = options.return_attention or options.online_timestamps
    n_ctx = model.dims.n_text_ctx
    sample_len = options.sample_len or n_ctx // 2
    eot = tokenizer.eot
    gen = generator or torch.Generator().manual_seed(options.seed)
    n = options.best_of
    samples = [Candidate((), 0.0) for _ in range(n)]
    live = list(range(n))  # samples still running, in row order
    rows = WindowRows(model, cache, batcher, need)

    def finish(h: torch.Tensor | None, logits: torch.Tensor, scores: list | None):
        """Draw every sample's next token from its row of logits [R, n_vocab] (the prompt's
        one row for all of them)."""
        histories = [[*initial_tokens, *samples[s].tokens] for s in live[: len(logits)]]
        logprobs = filtered(rules, logits, histories)  # [R, V]
        scaled = logits / temperature  # [R, V] as Categorical(logits=...) normalises them
        probs = (scaled - scaled.logsumexp(dim=-1, keepdim=True)).softmax(dim=-1)  # [R, V]
        which = list(range(len(live))) if len(logits) == len(live) else [0] * len(live)
        full = torch.full((n, probs.shape[-1]), 1.0 / probs.shape[-1])  # [n, V]
        full[live] = probs[which].cpu()
        drawn = torch.multinomial(full, 1, True, generator=gen)[:, 0].tolist()  # [n]
        att = attention_all(scores) if need else None  # [R, L, H, 1500]
        out = []
        for r, s in zip(which, live, strict=True):
            token = drawn[s]
            out.append(Step(token, float(logprobs[r, token]), att[r] if need else None))
        return out

    no_speech_prob, steps = rows.prompt(initial_tokens, sot_index, tokenizer.no_speech, finish)
    sent = 0
    with batcher.joined() if batcher is not None else contextlib.nullcontext():
        for i in range(sample_len):
            for s, step in zip(live, steps, strict=True):
                c = samples[s]
                samples[s] = Candidate(
                    (*c.steps, step), add32(c.sum_logprob, step.logprob), step.token == eot
                )
            running = [s for s in live if not samples[s].finished]
            done = [samples[s] for s in range(n) if samples[s].finished]
            leader = done[best(done, options.length_penalty)] if done else None
            tips = [samples[s].tokens for s in running]
            n_settled = settled(tips, leader.tokens if leader else None)
            ref = samples[running[0]] if running else leader
            for step in ref.steps[sent:n_settled]:
                yield Step(step.token, step.logprob, step.attention, early=True)
            sent = max(sent, n_settled)
            if not running or len(initial_tokens) + i + 1 > n_ctx:
                break
            reorder = [live.index(s) for s in running] if i else [0] * len(running)
            live = running
            steps = rows.step([samples[s].steps[-1].token for s in live], reorder, finish)
    winner = samples[best(samples, options.length_penalty)]
    yield from winner.steps[sent:]
    return window_result(winner, tokenizer, temperature, no_speech_prob)


def window_decoder(options: DecodeOptions, temperature: float) -> Callable:
    """The token decoder of an attempt at `temperature`: beam search at 0 with beam_size > 1,
    best-of sampling above 0 with best_of > 1, else one greedy or sampled row (decode_window),
    as openai-whisper's transcribe() picks them."""
    if temperature == 0 and options.beam_size > 1:
        return beam_window
    if temperature > 0 and options.best_of > 1:
        return best_of_window
    return decode_window


MAX_ROWS = 16  # beams or samples of one window


def check_search_options(options: DecodeOptions) -> None:
    """Raise OptionsError naming the search option out of its range."""
    if not 1 <= options.beam_size <= MAX_ROWS:
        raise OptionsError(f"beam_size must be in [1, {MAX_ROWS}], not {options.beam_size}")
    if not 1 <= options.best_of <= MAX_ROWS:
        raise OptionsError(f"best_of must be in [1, {MAX_ROWS}], not {options.best_of}")
    p = options.patience
    if p is not None and not (0 < p <= MAX_ROWS and round(options.beam_size * p) >= 1):
        raise OptionsError(
            f"patience must be in (0, {MAX_ROWS}] with round(beam_size * patience) >= 1, not {p}"
        )
    lp = options.length_penalty
    if lp is not None and not 0 <= lp <= 10:
        raise OptionsError(f"length_penalty must be in [0, 10], not {lp}")
