"""Batched long-form (`batch_size`): independent windows decoded together, as faster-whisper's
BatchedInferencePipeline.

The audio is cut into windows of at most 30 s: with vad_filter the speech spans joined into
groups (faster-whisper's collect_chunks with max_duration 30), without it consecutive 30 s
windows. Windows are independent (no prompt from the previous one). N of them are encoded
together (one encoder call on a GPU; on a CPU one window per call, `_encode`) and take one
cross-attention K/V projection (each window's cache holds views of its rows); then each
window's `decode_with_fallback` runs on a thread of its own and the `StepBatcher` (the
pipeline's, or one made for the call) runs their cached steps as one batched
decoder forward per step, the windows' cross-attention as one over the batch's K/V. Tokens
are yielded the moment they are chosen, tagged with their window (and renumbered in the order
they leave); segments and words (from each window's own cross-attention K/V) come out in time
order once the windows before them are done.

A window decoded in a batch gives the same tokens as decoded alone (`batch_size=1`): the batch
changes only float rounding (tests/test_batched.py).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from xattn.model.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from xattn.model.batching import CallerThread, StepBatcher, model_work
from xattn.model.decoding import DecodeOptions, detect_language
from xattn.model.kv_cache import KVCache
from xattn.model.prompts import window_tokens
from xattn.model.results import (
    Segment,
    TimeSpan,
    TokenEvent,
    Transcript,
    WindowDiscarded,
    WindowStart,
)
from xattn.model.transcribe import (
    INPUT_STRIDE,
    Context,
    decode_with_fallback,
    rules_for,
    split_segments,
)
from xattn.model.vad import SAMPLE_RATE, SpeechMap, SpeechSpan, group_spans, join_speech
from xattn.model.vad_filter import frame_clock, map_segment
from xattn.model.whisper import Whisper

WINDOW = N_SAMPLES  # samples in a 30 s window


@dataclasses.dataclass(frozen=True)
class Piece:
    """One window of the batched pipeline: its spans of the original audio, joined."""

    index: int
    spans: tuple[SpeechSpan, ...]


def windows_of(n_samples: int, spans: list[SpeechSpan] | None) -> list[Piece]:
    """The windows: speech spans grouped to <= 30 s (vad_filter), or 30 s cuts of the audio."""
    if spans is None:
        spans = [SpeechSpan(s, min(s + WINDOW, n_samples)) for s in range(0, n_samples, WINDOW)]
        groups = [(s,) for s in spans]
    else:
        groups = group_spans(spans, WINDOW / SAMPLE_RATE)
    return [Piece(i, g) for i, g in enumerate(groups)]


def transcribe_batched(
    ctx: Context,
    audio: np.ndarray,
    options: DecodeOptions,
    batch_size: int,
    spans: list[SpeechSpan] | None = None,
) -> Iterator:
    """Every event of the batched transcription of `audio` (16 kHz mono float32), times on the
    original clock; `spans`: the speech (vad_filter), None: all of it."""
    own = ctx.batcher is None
    caller = CallerThread() if own else None  # this thread runs the batches (CallerThread)
    batcher = StepBatcher(ctx.model, max(batch_size, 1), thread=caller) if own else ctx.batcher
    ctx = dataclasses.replace(ctx, batcher=batcher)
    try:
        yield from _batched(ctx, audio, options, batch_size, spans, caller)
    finally:
        if own:
            batcher.close()


def _batched(ctx, audio, options, batch_size, spans, caller) -> Iterator:
    model, tok = ctx.model, ctx.tokenizer
    run = model_work(ctx.batcher)
    dtype = next(model.parameters()).dtype
    pieces = windows_of(len(audio), spans)
    language = options.language
    window_rules = rules_for(ctx, options)
    segments: list[Segment] = []
    index = 0
    for b in range(0, len(pieces), batch_size):
        batch = pieces[b : b + batch_size]
        # as a sequential window: the log-mel of the audio and 30 s of zeros, its first 30 s
        mels = [
            run(log_mel_spectrogram, join_speech(audio, p.spans), model.dims.n_mels, N_SAMPLES)
            for p in batch
        ]  # each [n_mels, content + 3000]
        sizes = [min(N_FRAMES, m.shape[-1] - N_FRAMES) for m in mels]
        features = run(_encode, model, mels, dtype)  # [B, 1500, d]
        if language is None:
            language = "en"
            if tok.multilingual:
                language, _ = run(lambda f=features: detect_language(model, f[:1], tok))
        sot = tok.sot_sequence(language, options.task)
        initial = window_tokens(
            sot_sequence=sot,
            previous=[],
            sot_prev=tok.sot_prev,
            no_timestamps=tok.no_timestamps,
            n_text_ctx=model.dims.n_text_ctx,
            encode=tok.encode,
            prefix=None,
            hotwords=options.hotwords,
            without_timestamps=options.without_timestamps,
        )
        rules = window_rules(sample_begin=len(initial))
        cross = run(model.decoder.cross_kv, features)  # [B, ...] once: views per window
        jobs = [
            _Window(ctx, p, sizes[i], features[i : i + 1], cross.window(i), initial, rules, options)
            for i, p in enumerate(batch)
        ]
        for job in jobs:
            yield job.start_event(language)
        for event in _interleave(jobs, caller):
            if isinstance(event, TokenEvent):
                event = dataclasses.replace(event, index=index)
                index += 1
            yield event
        for job in jobs:  # time order: the windows' segments one window after the other
            for seg in job.segments(sot, language):
                seg = dataclasses.replace(seg, id=len(segments))
                segments.append(seg)
                yield seg
    text = "".join(s.text for s in segments)
    duration = len(audio) / SAMPLE_RATE
    speech = None if spans is None else tuple(TimeSpan(s.start_s, s.end_s) for s in spans)
    yield Transcript(text, language or "en", tuple(segments), duration, speech=speech)


def _encode(model: Whisper, mels: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The windows' encoder output [B, 1500, d], on the model thread. On a GPU in one call; on
    a CPU one window per call, as the encoder is bound by compute there and a batch only adds
    activations that spill from the caches (tiny.en, 2 cores: 120 ms a window alone, 134 in
    twos, 144 in eights)."""
    mel = torch.stack([pad_or_trim(m, N_FRAMES) for m in mels]).to(model.device, dtype)
    if mel.is_cuda:
        return model.encoder(mel)  # [B, 1500, d]
    return torch.cat([model.encoder(m[None]) for m in mel])  # [B, 1500, d]


class _Window:
    """One window's decode, run on a thread of its own."""

    def __init__(self, ctx, piece: Piece, size: int, features, cross, initial, rules, options):
        self.ctx, self.piece, self.options = ctx, piece, options
        self.features, self.initial, self.rules = features, initial, rules
        self.size = size  # mel frames of audio
        self.num_frames = size // INPUT_STRIDE
        self.smap = SpeechMap(piece.spans)
        self.cache = KVCache(cross, ctx.model.dims.n_text_ctx)  # its rows of the batch's K/V
        self.result = None

    def start_event(self, language: str) -> WindowStart:
        clock = frame_clock(self.smap, 0.0, self.num_frames)
        return WindowStart(self.piece.index, clock[0].start, self.num_frames, language, clock)

    def decode(self, out: queue.Queue | CallerThread, stop: threading.Event) -> None:
        """On its thread: the window's token events into `out` until it ends or `stop` is set,
        then None."""
        try:
            with torch.inference_mode():
                steps = decode_with_fallback(
                    self.ctx,
                    self.features,
                    self.cache,
                    self.initial,
                    self.rules,
                    self.options,
                    self.piece.index,
                    0,
                    0.0,
                    self.num_frames,
                    torch.Generator().manual_seed(self.options.seed),
                )
                while True:
                    try:
                        event = next(steps)
                    except StopIteration as stop:
                        self.result, _ = stop.value
                        break
                    out.put(self._mapped(event))
                    if stop.is_set():
                        steps.close()
                        break
        except BaseException as e:  # the caller raises it
            out.put(e)
        finally:
            out.put(None)

    def _mapped(self, event: TokenEvent | WindowDiscarded) -> TokenEvent | WindowDiscarded:
        if isinstance(event, TokenEvent) and event.online_time is not None:
            t = event.online_time
            return dataclasses.replace(event, online_time=round(t + self.smap.shift(t), 2))
        return event

    def segments(self, sot: tuple[int, ...], language: str) -> list[Segment]:
        """The window's segments on the original clock (none for a silent window)."""
        r, o, tok = self.result, self.options, self.ctx.tokenizer
        silent = o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
        if silent and o.logprob_threshold is not None:
            silent = r.avg_logprob <= o.logprob_threshold
        if silent:
            return []
        pieces, _, _ = split_segments(list(r.tokens), tok.timestamp_begin, 0.0, self.size)
        words = timings = [() for _ in pieces]
        if o.word_timestamps and self.ctx.aligner is not None:
            pieces, words, timings, _ = model_work(self.ctx.batcher)(
                self.ctx.aligner.align,
                *(self.cache, sot, pieces, self.num_frames, language, 0.0, 0.0),
                *(o.prepend_punctuations, o.append_punctuations),
            )
        out = []
        for p, w, t in zip(pieces, words, timings, strict=True):
            text = tok.decode(list(p.tokens))
            if p.start == p.end or not text.strip():
                continue
            seg = Segment(
                id=0,
                window=self.piece.index,
                seek=0,
                start=p.start,
                end=p.end,
                text=text,
                tokens=p.tokens,
                temperature=r.temperature,
                avg_logprob=r.avg_logprob,
                compression_ratio=r.compression_ratio,
                no_speech_prob=r.no_speech_prob,
                words=tuple(w),
                token_timings=tuple(t),
            )
            out.append(map_segment(seg, self.smap))
        return out


def _interleave(jobs: list[_Window], caller: CallerThread | None) -> Iterator:
    """Run the windows' decodes on threads; yield their events as they come. With `caller`,
    this thread runs the batches meanwhile (it is the batcher's model thread). Left early (an
    error, or the consumer closing), the windows stop after their current step."""
    out = caller or queue.Queue()
    items = caller.serve() if caller else iter(out.get, out)
    stop = threading.Event()
    running, error = len(jobs), None
    with ThreadPoolExecutor(len(jobs), thread_name_prefix="xattn-window") as pool:
        for job in jobs:
            pool.submit(job.decode, out, stop)
        try:
            while running:
                item = next(items)
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    error = error or item
                    stop.set()
                elif error is None:
                    yield item
        finally:
            stop.set()
            while running:  # serve the windows' last steps until each has ended
                running -= next(items) is None
    if error is not None:
        raise error
