"""Batched long-form (`batch_size`): chunks of the audio decoded side by side, each exactly as
the sequential transcription of that chunk alone; their steps batched.

The audio is cut into chunks (docs/how-it-works.md, "Batched long-form"): with vad_filter the
speech spans joined into groups of at most 30 s of speech (a longer span alone), cut only
between spans, so at a pause; without it, windows of at most 30 s cut at the quietest 20 ms
of their last 5 s. A chunk is its spans' audio joined back to back, transcribed as
`transcribe` transcribes a file (xattn.model.transcribe.sequential): window after window, the next
one starting at the last complete segment's end timestamp, so that speech after it (a segment
the window cut short, words past the 30 s) is decoded again in a window of its own; the
previous windows' text as its prompt; the no-speech and fallback rules as there. Chunks are
independent (no prompt from the one before). N of them decode at once, each on a thread of
its own, and the `StepBatcher` (the pipeline's, or one made for the call, whose batches then
run on the caller's thread) runs their cached steps as one batched decoder forward per step;
a chunk that ends makes room for the next at once, so that the batch stays full. On a GPU the
first windows of N chunks are encoded together, sharing one K/V tensor that they attend over
as one. Tokens are yielded the moment they are chosen, tagged with their window (a chunk's
k-th window is numbered chunk + k x chunks: the first windows 0..chunks-1, in time order) and
renumbered in the order they leave; segments and words (from each window's own
cross-attention K/V) come out in time order once the chunks before them are done.

A chunk decoded in a batch gives the same tokens as `transcribe` of its audio alone: the batch
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
from xattn.model.audio.vad import (
    SAMPLE_RATE,
    SpeechMap,
    SpeechSpan,
    VadOptions,
    calibrated,
    group_spans,
    join_speech,
    speech_probs,
    speech_spans,
)
from xattn.model.decode.decoding import DecodeOptions, detect_language
from xattn.model.decode.model_thread import CallerThread
from xattn.model.decode.results import (
    Segment,
    TimeSpan,
    TokenEvent,
    Transcript,
    WindowDiscarded,
    WindowStart,
)
from xattn.model.decode.step_batcher import StepBatcher, model_work
from xattn.model.decode.step_batcher import encode as encode_window
from xattn.model.net.kv_cache import CrossKV, KVCache
from xattn.model.transcribe.sequential import Context, transcribe
from xattn.model.transcribe.vad_filter import frame_clock, map_segment

WINDOW = N_SAMPLES  # samples in a 30 s window
QUIET_SEARCH = 5 * SAMPLE_RATE  # without VAD: a cut is sought in a window's last 5 s
QUIET_FRAME = 320  # samples: 20 ms, the loudness measured over each


# vad_filter's spans for chunks: every pause of 160 ms or more ends one (a chunk may be cut
# there), no span split inside speech (a span over 30 s is a chunk of its own, decoded window
# after window)
CHUNK_VAD = VadOptions(min_silence_duration_ms=160)
# a chunk of joined speech keeps at most ~0.8 s of silence in a row (the spans' padding), so
# more than this without a segment in a window (between two, or after the last one) is speech
# the decoder passed over: its chunk goes on from there (sequential.transcribe's resume_after)
RESUME_AFTER = 2.0
# less than this left of a chunk after a window (seconds) is its span's padding, not decoded
# (sequential.transcribe's min_tail): seen, 0.1-0.8 s tails that cost an encoder pass each and
# gave nothing, or a hallucination after every fallback temperature
MIN_TAIL = 1.0


def chunk_spans(audio: np.ndarray, options: VadOptions | None) -> list[SpeechSpan]:
    """The speech spans that batched long-form cuts into chunks: with the caller's VAD options
    as given, else with CHUNK_VAD, its threshold calibrated to the file (vad.calibrated)."""
    probs = speech_probs(audio)
    vad = options if options is not None else calibrated(probs, CHUNK_VAD)
    return speech_spans(probs, len(audio), vad)


@dataclasses.dataclass(frozen=True)
class Piece:
    """One chunk of the batched pipeline: its spans of the original audio, joined."""

    index: int
    spans: tuple[SpeechSpan, ...]


def quiet_cuts(audio: np.ndarray, window: int = WINDOW, search: int = QUIET_SEARCH) -> list[int]:
    """Where to cut audio without speech spans into pieces of at most `window` samples: each
    cut at the start of the quietest 20 ms frame in the last `search` samples before the
    limit (a pause, if there is one), the end of the audio last (pure)."""
    cuts, start, n = [], 0, len(audio)
    while n - start > window:
        lo, hi = start + window - search, start + window
        frames = audio[lo:hi].reshape(-1, QUIET_FRAME).astype(np.float64)  # [F, 320]
        energy = np.square(frames).sum(axis=1)
        start = lo + QUIET_FRAME * int(np.argmin(energy))
        cuts.append(start)
    return [*cuts, n] if n else []


def windows_of(audio: np.ndarray, spans: list[SpeechSpan] | None) -> list[Piece]:
    """The chunks: speech spans grouped to <= 30 s of speech (vad_filter; a longer span alone),
    or the audio cut at its quiet points into pieces of <= 30 s."""
    if spans is None:
        ends = quiet_cuts(audio)
        groups = [(SpeechSpan(a, b),) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
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
    pieces = windows_of(audio, spans)
    # a GPU encodes the first windows batch_size at a time, a CPU one by one (_Encoded)
    group = batch_size if model.device.type == "cuda" else 1
    encoded = _Encoded(ctx, audio, pieces, group)
    language = options.language or "en"
    if options.language is None and tok.multilingual and pieces:
        features = encoded.features(0)  # [1, 1500, d]
        language, _ = model_work(ctx.batcher)(detect_language, model, features, tok)
    inner = dataclasses.replace(
        options, language=language, vad_filter=False, batch_size=None, clip_timestamps=()
    )
    resume = None if spans is None else RESUME_AFTER  # without VAD a chunk has its pauses
    jobs = [_Window(ctx, p, len(pieces), encoded, inner, resume) for p in pieces]
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
    """The chunks' first windows' encoder output and cross-attention K/V, made on the model
    thread when a chunk's thread first asks, `group` at a time (a GPU's batch). On a CPU
    a chunk's windows are encoded by its own transcription, one by one (the encoder is bound
    by compute there and a batch only adds activations that spill from the caches: tiny.en on
    2 cores, 120 ms a window alone, 134 in twos, 144 in eights); here only for the language
    detection. The windows of a group hold views of one K/V tensor and attend as one
    (kv_cache.joined_rows)."""

    def __init__(self, ctx: Context, audio: np.ndarray, pieces: list[Piece], group: int) -> None:
        self.ctx, self.audio, self.pieces, self.group = ctx, audio, pieces, group
        self._lock = threading.Lock()
        self._ready: dict[int, tuple[torch.Tensor, CrossKV]] = {}
        self._taken: set[int] = set()

    def features(self, i: int) -> torch.Tensor:
        """Chunk i's first encoder output [1, 1500, d] (kept for its `take`)."""
        with self._lock:
            self._make(i)
            return self._ready[i][0]

    def has(self, i: int) -> bool:
        """Whether chunk i's first window is (or will be) encoded here."""
        with self._lock:
            return self.group > 1 or i in self._ready

    def take(self, i: int) -> tuple[torch.Tensor, CrossKV]:
        """Chunk i's first encoder output [1, 1500, d] and K/V, handed over."""
        with self._lock:
            self._make(i)
            self._taken.add(i)
            return self._ready.pop(i)

    def _make(self, i: int) -> None:
        if i in self._ready:
            return
        todo = [p for p in self.pieces[i : i + self.group] if p.index not in self._taken]
        todo = [p for p in todo if p.index not in self._ready]
        features, cross = model_work(self.ctx.batcher)(self._encode, todo)
        for j, p in enumerate(todo):
            self._ready[p.index] = (features[j : j + 1], cross.window(j))

    def _encode(self, todo: list[Piece]) -> tuple[torch.Tensor, CrossKV]:
        """On the model thread: each chunk's first window as `transcribe` makes it (the
        log-mel of the chunk and 30 s of zeros, its first <= 3000 frames padded with zeros),
        encoded; their K/V."""
        model = self.ctx.model
        dtype = next(model.parameters()).dtype
        windows = []
        for p in todo:
            mel = log_mel_spectrogram(
                join_speech(self.audio, p.spans), model.dims.n_mels, N_SAMPLES, model.device
            )  # [n_mels, content + 3000]
            size = min(N_FRAMES, mel.shape[-1] - N_FRAMES)
            windows.append(pad_or_trim(mel[:, :size], N_FRAMES))
        mel = torch.stack(windows).to(model.device, dtype)  # [B, n_mels, 3000]
        features = model.encoder(mel)  # [B, 1500, d]
        return features, model.decoder.cross_kv(features)


class _Window:
    """One chunk's transcription, run on a thread of its own: its token events as they come,
    its segments kept for their turn."""

    def __init__(
        self,
        ctx: Context,
        piece: Piece,
        chunks: int,
        encoded: _Encoded,
        options: DecodeOptions,
        resume_after: float | None = None,
    ) -> None:
        self.ctx, self.piece, self.chunks, self.encoded = ctx, piece, chunks, encoded
        self.resume_after = resume_after
        prefix = options.prefix if piece.index == 0 else None  # the file's first window only
        self.options = dataclasses.replace(options, prefix=prefix)
        self.smap = SpeechMap(piece.spans)
        self.segments: list[Segment] = []

    def decode(self, out: queue.Queue | CallerThread, stop: threading.Event) -> None:
        """On its thread: the chunk's WindowStart and token events into `out` until it ends or
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
        encode = self._encode if self.encoded.has(self.piece.index) else None
        audio = join_speech(self.encoded.audio, self.piece.spans)
        events = transcribe(
            self.ctx,
            audio,
            self.options,
            encode=encode,
            keep_open_tails=True,
            resume_after=self.resume_after,
            min_tail=MIN_TAIL,
        )
        try:
            for event in events:
                if isinstance(event, Segment):
                    self.segments.append(self._segment(event))
                elif not isinstance(event, Transcript):
                    out.put(self._mapped(event))
                if stop.is_set():
                    return
        finally:
            events.close()

    def _encode(self, seek: int, mel: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
        """The chunk's first window from _Encoded, the next ones as `transcribe` encodes its
        windows (step_batcher.encode: padded, encoded and its K/V made in one turn on the
        model thread). `mel`: [n_mels, <= 3000]."""
        model = self.ctx.model
        if seek > 0:
            dtype = next(model.parameters()).dtype
            return encode_window(self.ctx.batcher, model, mel[None].to(dtype))
        features, cross = self.encoded.take(self.piece.index)
        return features, KVCache(cross, model.dims.n_text_ctx)

    def _window(self, local: int) -> int:
        return self.piece.index + local * self.chunks

    def _mapped(self, event: WindowStart | TokenEvent | WindowDiscarded):
        """An event of the chunk's transcription with its window's number and the original
        clock."""
        event = dataclasses.replace(event, window=self._window(event.window))
        if isinstance(event, WindowStart):
            clock = frame_clock(self.smap, event.offset, event.num_frames)
            return dataclasses.replace(event, offset=clock[0].start, clock=clock)
        if isinstance(event, TokenEvent) and event.online_time is not None:
            t = event.online_time
            return dataclasses.replace(event, online_time=round(t + self.smap.shift(t), 2))
        return event

    def _segment(self, seg: Segment) -> Segment:
        """A segment of the chunk on the original clock, its window numbered, its seek in
        frames of the file."""
        seek = round(self.smap.original(seg.seek * 0.01) * 100)
        return map_segment(
            dataclasses.replace(seg, window=self._window(seg.window), seek=seek), self.smap
        )


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
