"""Batched long-form (`batch_size`): independent windows decoded together, as faster-whisper's
BatchedInferencePipeline.

The audio is cut into windows of at most 30 s: with vad_filter the speech spans joined into
groups (faster-whisper's collect_chunks with max_duration 30), without it consecutive 30 s
windows. Windows are independent (no prompt from the previous one). N of them decode at once,
each on a thread of its own (`decode_with_fallback`), and the `StepBatcher` (the pipeline's,
or one made for the call, whose batches then run on the caller's thread) runs their cached
steps as one batched decoder forward per step; a window that ends makes room for the next at
once, so that the batch stays full. A window is encoded when its thread starts it (on a GPU
N at a time, sharing one K/V tensor that they attend over as one). Tokens are yielded the
moment they are chosen, tagged with their window (and renumbered in the order they leave);
segments and words (from each window's own cross-attention K/V) come out in time order once
the windows before them are done.

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

from xattn.model.audio.features import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from xattn.model.audio.vad import SAMPLE_RATE, SpeechMap, SpeechSpan, group_spans, join_speech
from xattn.model.decode.decoding import DecodeOptions, detect_language
from xattn.model.decode.prompts import window_tokens
from xattn.model.decode.results import (
    Segment,
    TimeSpan,
    TokenEvent,
    Transcript,
    WindowDiscarded,
    WindowStart,
)
from xattn.model.decode.step_batcher import CallerThread, StepBatcher, model_work
from xattn.model.net.kv_cache import CrossKV, KVCache
from xattn.model.transcribe.sequential import (
    INPUT_STRIDE,
    Context,
    decode_with_fallback,
    rules_for,
    split_segments,
)
from xattn.model.transcribe.vad_filter import frame_clock, map_segment

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
    pieces = windows_of(len(audio), spans)
    # a GPU encodes the windows batch_size at a time, a CPU one by one (_Encoded)
    group = batch_size if model.device.type == "cuda" else 1
    encoded = _Encoded(ctx, audio, pieces, group)
    language = options.language or "en"
    if options.language is None and tok.multilingual and pieces:
        features = encoded.features(0)  # [1, 1500, d]
        language, _ = model_work(ctx.batcher)(detect_language, model, features, tok)
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
    rules = rules_for(ctx, options)(sample_begin=len(initial))
    jobs = [_Window(ctx, p, encoded, sot, language, initial, rules, options) for p in pieces]
    segments: list[Segment] = []
    index = 0
    for event in _interleave(jobs, batch_size, caller):
        if isinstance(event, TokenEvent):
            event = dataclasses.replace(event, index=index)
            index += 1
        elif isinstance(event, Segment):
            event = dataclasses.replace(event, id=len(segments))
            segments.append(event)
        yield event
    text = "".join(s.text for s in segments)
    duration = len(audio) / SAMPLE_RATE
    speech = None if spans is None else tuple(TimeSpan(s.start_s, s.end_s) for s in spans)
    yield Transcript(text, language, tuple(segments), duration, speech=speech)


class _Encoded:
    """The windows' encoder output and cross-attention K/V, made on the model thread when a
    window's thread first asks, `group` windows at a time (a GPU's batch; on a CPU 1: the
    encoder is bound by compute there and a batch only adds activations that spill from the
    caches: tiny.en on 2 cores, 120 ms a window alone, 134 in twos, 144 in eights). The windows
    of a group hold views of one K/V tensor and attend as one (kv_cache.joined_rows)."""

    def __init__(self, ctx: Context, audio: np.ndarray, pieces: list[Piece], group: int) -> None:
        self.ctx, self.audio, self.pieces, self.group = ctx, audio, pieces, group
        self._lock = threading.Lock()
        self._ready: dict[int, tuple[int, torch.Tensor, CrossKV]] = {}
        self._taken: set[int] = set()

    def features(self, i: int) -> torch.Tensor:
        """Window i's encoder output [1, 1500, d] (kept for its `take`)."""
        with self._lock:
            self._make(i)
            return self._ready[i][1]

    def take(self, i: int) -> tuple[int, torch.Tensor, CrossKV]:
        """Window i's mel frames of audio, encoder output [1, 1500, d] and K/V, handed over."""
        with self._lock:
            self._make(i)
            self._taken.add(i)
            return self._ready.pop(i)

    def _make(self, i: int) -> None:
        if i in self._ready:
            return
        todo = [p for p in self.pieces[i : i + self.group] if p.index not in self._taken]
        todo = [p for p in todo if p.index not in self._ready]
        sizes, features, cross = model_work(self.ctx.batcher)(self._encode, todo)
        for j, p in enumerate(todo):
            self._ready[p.index] = (sizes[j], features[j : j + 1], cross.window(j))

    def _encode(self, todo: list[Piece]) -> tuple[list[int], torch.Tensor, CrossKV]:
        """On the model thread: as a sequential window, the log-mel of each window's audio and
        30 s of zeros, its first 30 s, encoded; their K/V."""
        model = self.ctx.model
        dtype = next(model.parameters()).dtype
        mels = [
            log_mel_spectrogram(join_speech(self.audio, p.spans), model.dims.n_mels, N_SAMPLES)
            for p in todo
        ]  # each [n_mels, content + 3000]
        sizes = [min(N_FRAMES, m.shape[-1] - N_FRAMES) for m in mels]
        mel = torch.stack([pad_or_trim(m, N_FRAMES) for m in mels]).to(model.device, dtype)
        features = model.encoder(mel)  # [B, 1500, d]
        return sizes, features, model.decoder.cross_kv(features)


class _Window:
    """One window's decode, run on a thread of its own: its encoding, its token events, then its
    segments."""

    def __init__(
        self, ctx, piece: Piece, encoded: _Encoded, sot, language, initial, rules, options
    ):
        self.ctx, self.piece, self.encoded, self.options = ctx, piece, encoded, options
        self.sot, self.language, self.initial, self.rules = sot, language, initial, rules
        self.smap = SpeechMap(piece.spans)
        self.segments: list[Segment] = []

    def decode(self, out: queue.Queue | CallerThread, stop: threading.Event) -> None:
        """On its thread: the window's WindowStart and token events into `out` until it ends or
        `stop` is set, then itself with its segments (or the error, then itself)."""
        try:
            if not stop.is_set():
                with torch.inference_mode():
                    self._decode(out, stop)
        except BaseException as e:  # the caller raises it
            out.put(e)
        finally:
            out.put(self)

    def _decode(self, out: queue.Queue | CallerThread, stop: threading.Event) -> None:
        size, features, cross = self.encoded.take(self.piece.index)
        num_frames = size // INPUT_STRIDE
        cache = KVCache(cross, self.ctx.model.dims.n_text_ctx)
        clock = frame_clock(self.smap, 0.0, num_frames)
        out.put(WindowStart(self.piece.index, clock[0].start, num_frames, self.language, clock))
        steps = decode_with_fallback(
            *(self.ctx, features, cache, self.initial, self.rules, self.options),
            *(self.piece.index, 0, 0.0, num_frames),
            torch.Generator().manual_seed(self.options.seed),
        )
        while True:
            try:
                event = next(steps)
            except StopIteration as end:
                result, _ = end.value
                break
            out.put(self._mapped(event))
            if stop.is_set():
                steps.close()
                return
        self.segments = self._segments(result, cache, size, num_frames)

    def _mapped(self, event: TokenEvent | WindowDiscarded) -> TokenEvent | WindowDiscarded:
        if isinstance(event, TokenEvent) and event.online_time is not None:
            t = event.online_time
            return dataclasses.replace(event, online_time=round(t + self.smap.shift(t), 2))
        return event

    def _segments(self, r, cache: KVCache, size: int, num_frames: int) -> list[Segment]:
        """The window's segments on the original clock (none for a silent window), its words
        from its own cross-attention K/V."""
        o, tok = self.options, self.ctx.tokenizer
        silent = o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
        if silent and o.logprob_threshold is not None:
            silent = r.avg_logprob <= o.logprob_threshold
        if silent:
            return []
        pieces, _, _ = split_segments(list(r.tokens), tok.timestamp_begin, 0.0, size)
        words = timings = [() for _ in pieces]
        if o.word_timestamps and self.ctx.aligner is not None:
            pieces, words, timings, _ = model_work(self.ctx.batcher)(
                self.ctx.aligner.align,
                *(cache, self.sot, pieces, num_frames, self.language, 0.0, 0.0),
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


def _interleave(jobs: list[_Window], slots: int, caller: CallerThread | None) -> Iterator:
    """Decode the windows, `slots` at a time on threads of their own (a window that ends makes
    room for the next at once); yield their events as they come, and each window's segments
    once it and every window before it have ended (time order). With `caller`, this thread
    runs the batches meanwhile (it is the batcher's model thread). Left early (an error, or
    the consumer closing), the windows stop after their current step."""
    out = caller or queue.Queue()
    items = caller.serve() if caller else iter(out.get, out)
    stop = threading.Event()
    running, error, ended, done = len(jobs), None, 0, set()
    with ThreadPoolExecutor(max(1, slots), thread_name_prefix="xattn-window") as pool:
        for job in jobs:
            pool.submit(job.decode, out, stop)
        try:
            while running:
                item = next(items)
                if isinstance(item, _Window):
                    running -= 1
                    done.add(item.piece.index)
                    while error is None and ended in done:  # the next windows in time order
                        yield from jobs[ended].segments
                        ended += 1
                elif isinstance(item, BaseException):
                    error = error or item
                    stop.set()
                elif error is None:
                    yield item
        finally:
            stop.set()
            while running:  # serve the windows' last steps until each has ended
                running -= isinstance(next(items), _Window)
    if error is not None:
        raise error
