"""Decoding one 30 s window: options, logit filters, and the token loop as a generator.

The loop follows openai-whisper's greedy `DecodingTask` at a given temperature: suppress
blank at the start, suppress the checkpoint's list, the timestamp rules (pairs, monotone,
max initial timestamp, timestamps win when their total probability beats every text
token). Each chosen token is yielded at once with its log-probability and, when asked, its
cross-attention over the window's frames from the same forward pass.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Generator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from xattn.model.audio.vad import VadOptions
from xattn.model.decode.step_batcher import StepBatcher, model_work
from xattn.model.decode.tokenizer import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, Tokenizer
from xattn.model.net.kv_cache import KVCache
from xattn.model.net.whisper import Whisper

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TASKS = ("transcribe", "translate")


class OptionsError(ValueError):
    """Decode options that cannot be honoured; the message says which and why."""


@dataclass(frozen=True)
class DecodeOptions:
    language: str | None = None  # None: detect (multilingual) or "en"
    task: str = "transcribe"
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES  # fallback schedule
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    word_timestamps: bool = False
    return_attention: bool = False  # every token carries [layers, heads, 1500] weights
    online_timestamps: bool = False  # every token carries its attention-peak time, no extra pass
    max_initial_timestamp: float = 1.0
    sample_len: int | None = None  # tokens per window; None: n_text_ctx // 2
    use_cache: bool = True  # False recomputes the whole prefix every step (for tests)
    seed: int = 0  # for sampling at temperature > 0
    # search (xattn.model.decode.beams), as openai-whisper's DecodingOptions; the library default is
    # greedy as there, the service's and the CLI's beam 5 with best-of 5 (the whisper CLI's)
    beam_size: int = 1  # beams at temperature 0 (1: greedy)
    best_of: int = 1  # samples at temperature > 0, the most likely one kept
    patience: float | None = None  # beam search ends after round(beam_size·patience) finished
    length_penalty: float | None = None  # ranking: logprob / length (None) or / ((5+n)/6)**α
    # openai-whisper's DecodingOptions / transcribe(), faster-whisper's (xattn.model.decode.prompts)
    prefix: str | None = None  # the first window's text starts with it (not in the output)
    hotwords: str | None = None  # faster-whisper's hint phrases, before each window's prompt
    suppress_tokens: tuple[int, ...] = (-1,)  # ids never sampled; -1: the checkpoint's list
    suppress_blank: bool = True  # no space or end-of-text as a window's first text token
    without_timestamps: bool = False  # text only: one segment per window
    hallucination_silence_threshold: float | None = None  # s; with word_timestamps only
    clip_timestamps: tuple[float, ...] = ()  # start, end, start, ...: the spans to transcribe
    prepend_punctuations: str = PREPEND_PUNCTUATIONS  # joined to the next word
    append_punctuations: str = APPEND_PUNCTUATIONS  # joined to the previous word
    # voice activity detection (xattn.model.audio.vad, faster-whisper's vad_filter): only the speech
    # is decoded, every time mapped back to the file's clock; vad_options None: the defaults
    vad_filter: bool = False
    vad_options: VadOptions | None = None
    batch_size: int | None = None  # batched long-form (transcribe.batched); None: sequential


@dataclass(frozen=True)
class Step:
    """One token chosen by the loop."""

    token: int
    logprob: float
    attention: np.ndarray | None  # [n_layer, n_head, 1500] softmax weights
    early: bool = False  # a beam search yielded it while still searching (a shared prefix)


@dataclass(frozen=True)
class WindowResult:
    tokens: tuple[int, ...]  # sampled tokens, without the final end-of-text
    temperature: float
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    text: str


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class LogitRules:
    """Everything the logit filters need, fixed for one window."""

    sample_begin: int  # index of the first sampled token in the sequence
    suppress: torch.Tensor  # ids never sampled
    suppress_blank: torch.Tensor  # ids not sampled first (space, end-of-text)
    eot: int
    timestamp_begin: int
    no_timestamps: int
    max_initial_timestamp_index: int | None
    timestamps: bool = True  # False: text only (the sequence holds <|notimestamps|>)

    def mask(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """The rules that forbid tokens outright: -inf in `logits` [n_vocab] in place, given
        every token so far (then `prefer_timestamps`)."""
        self.mask_rows(logits[None], [tokens])

    def mask_rows(self, logits: torch.Tensor, histories: list[list[int]]) -> None:
        """`mask` for each row of `logits` [R, n_vocab] given its tokens; the suppressed ids
        of every row at once (one indexed write, not one a row)."""
        logits[:, self.suppress] = -math.inf
        logits[:, self.no_timestamps] = -math.inf
        for row, tokens in zip(logits, histories, strict=True):
            self._mask_row(row, tokens[self.sample_begin :])

    def _mask_row(self, logits: torch.Tensor, sampled: list[int]) -> None:
        ts = self.timestamp_begin
        if not sampled:
            logits[self.suppress_blank] = -math.inf
        if not self.timestamps:
            logits[ts:] = -math.inf
            return
        # timestamps come in pairs, except directly before end-of-text
        last_ts = len(sampled) >= 1 and sampled[-1] >= ts
        penultimate_ts = len(sampled) < 2 or sampled[-2] >= ts
        if last_ts:
            if penultimate_ts:
                logits[ts:] = -math.inf  # has to be text
            else:
                logits[: self.eot] = -math.inf  # has to be a timestamp or end-of-text
        stamps = [t for t in sampled if t >= ts]
        if stamps:  # monotone, and each segment at least one step long
            last = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[ts:last] = -math.inf
        if not sampled:
            logits[:ts] = -math.inf  # start with a timestamp
            if self.max_initial_timestamp_index is not None:
                logits[ts + self.max_initial_timestamp_index + 1 :] = -math.inf

    def prefer_timestamps(self, logits: torch.Tensor) -> torch.Tensor:
        """Timestamps win in a row when their total probability beats every text token's
        (text set to -inf in that row of `logits`); returns the log-probabilities of the
        logits as left. `logits`: [n_vocab] or rows [R, n_vocab], each row as the reference
        treats it alone (its reductions run along the row either way)."""
        logprobs = torch.log_softmax(logits, dim=-1)  # [..., n_vocab]
        if not self.timestamps:
            return logprobs
        ts = self.timestamp_begin
        win = logprobs[..., ts:].logsumexp(dim=-1) > logprobs[..., :ts].amax(dim=-1)  # [] or [R]
        if logits.dim() == 1:  # one row: no masks to index with (~0.1 ms a step)
            if not bool(win):
                return logprobs
            logits[:ts] = -math.inf
            return torch.log_softmax(logits, dim=-1)
        # the rows that won, each through views: boolean indexing copies every row (~0.2 ms)
        for r in win.nonzero()[:, 0].tolist():
            logits[r, :ts] = -math.inf
            torch.log_softmax(logits[r], dim=-1, out=logprobs[r])  # [n_vocab]
        return logprobs


def first_max(x: torch.Tensor) -> int:
    """The index of the largest of x [n] (the first of equal ones, as torch.argmax): through
    numpy on a CPU, whose SIMD argmax takes ~4 µs over a vocabulary where torch's takes ~65."""
    if x.is_cpu and x.dtype == torch.float32 and not x.requires_grad:
        return int(x.numpy().argmax())
    return int(x.argmax())


def attention_rows(scores: list[torch.Tensor], row: int = -1) -> np.ndarray:
    """Softmax weights of one query row, every layer and head: [n_layer, n_head, 1500]."""
    s = torch.stack([layer[0, :, row] for layer in scores])  # [L, H, 1500]
    return s.float().softmax(dim=-1).cpu().numpy()


def decode_window(
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
    """Greedy (t = 0) or sampled decoding of one window; yields each token as it is chosen.
    With a batcher, the cached steps run batched with other threads' decodes, and so does all
    of a step's torch work (its logits, the token's choice, its attention rows: `finish`).
    Sampling draws from `generator` (one per transcription, as openai-whisper's global one;
    None: a new one seeded with options.seed)."""
    n_ctx = model.dims.n_text_ctx
    sample_len = options.sample_len or n_ctx // 2
    need = options.return_attention or options.online_timestamps
    device = audio_features.device
    gen = generator
    if gen is None and temperature > 0:
        gen = torch.Generator().manual_seed(options.seed)
    int8 = model.decoder.int8_logits if temperature == 0 and options.use_cache else None
    tokens = list(initial_tokens)
    sampled: list[int] = []
    sum_logprob = 0.0

    def choose(logits: torch.Tensor, scores: list | None, masked: bool = False) -> Step:
        """The token of fp32 logits [n_vocab] (masked in place unless `masked`) and its
        attention rows."""
        if not masked:
            rules.mask(logits, tokens)
        logprobs = rules.prefer_timestamps(logits)  # [n_vocab]
        if temperature == 0:
            token = first_max(logits)
        else:
            probs = (logits / temperature).softmax(dim=-1)
            token = int(torch.multinomial(probs.cpu(), 1, generator=gen))
        logprob = float(logprobs[token])
        return Step(token, logprob, attention_rows(scores) if need else None)

    def finish(h: torch.Tensor, logits: torch.Tensor | None, scores: list | None) -> Step:
        """A cached step's token from its logits, or from its state h [d] (int8, rescored)."""
        if logits is not None:
            return choose(logits, scores)
        mask = partial(rules.mask, tokens=tokens)  # before the rescoring
        logits = int8.logits(h, mask=mask, timestamp_begin=rules.timestamp_begin)
        return choose(logits, scores, masked=True)

    def first() -> tuple[float, Step]:
        """The prompt's forward: the no-speech probability and the first token."""
        cache.truncate(0)
        x = torch.tensor([tokens], device=device)  # [1, T]
        rows = sorted({sot_index, len(tokens) - 1})  # one row when the prompt is the sot alone
        h, scores = model.decoder(x, cache, need_scores=need, logit_rows=rows, hidden=True)
        # exact logits of the sot row; the last row's as a cached step takes them (int8 too)
        logits = model.decoder.project(h if int8 is None else h[:, :1])[0]  # [R or 1, n_vocab]
        no_speech_prob = logits[0].softmax(dim=-1)[tokenizer.no_speech].item()
        return no_speech_prob, finish(h[0, -1], logits[-1] if int8 is None else None, scores)

    def next_step(token: int) -> Step:
        if batcher is not None and options.use_cache:
            return batcher.step(token, cache, need, int8 is None, finish)
        if not options.use_cache:  # the whole sequence again, through a fresh cache
            x = torch.tensor([tokens], device=device)  # [1, T]
            logits, scores = model.decoder(x, model.new_cache(audio_features), need, [-1])
            return choose(logits[0, -1], scores)  # [n_vocab]
        x = torch.tensor([[token]], device=device)  # [1, 1]
        h, scores = model.decoder(x, cache, need_scores=need, hidden=True)  # [1, 1, d]
        logits = model.decoder.project(h)[0, 0] if int8 is None else None  # [n_vocab]
        return finish(h[0, 0], logits, scores)

    no_speech_prob, step = model_work(batcher)(first)
    with batcher.joined() if batcher is not None else contextlib.nullcontext():
        for _ in range(sample_len):
            sum_logprob += step.logprob
            yield step
            if step.token == rules.eot:
                break
            tokens.append(step.token)
            sampled.append(step.token)
            if len(tokens) > n_ctx:
                break
            step = next_step(step.token)
    text = tokenizer.decode(sampled).strip()
    return WindowResult(
        tokens=tuple(sampled),
        temperature=temperature,
        avg_logprob=sum_logprob / (len(sampled) + 1),
        no_speech_prob=no_speech_prob,
        compression_ratio=compression_ratio(text),
        text=text,
    )


@torch.no_grad()
def detect_language(
    model: Whisper, audio_features: torch.Tensor, tokenizer: Tokenizer
) -> tuple[str, dict[str, float]]:
    """The most probable language token after `<|startoftranscript|>`, and all their probs."""
    cache = model.new_cache(audio_features)
    x = torch.tensor([[tokenizer.sot]], device=audio_features.device)
    logits, _ = model.decoder(x, cache)
    logits = logits[0, -1]  # [n_vocab]
    ids = torch.tensor(tokenizer.specials.language_ids, device=logits.device)
    probs = logits[ids].softmax(dim=-1).tolist()
    langs = dict(zip(tokenizer.specials.language_codes, probs, strict=True))
    return max(langs, key=langs.__getitem__), langs
