"""StreamTranscribeResponse messages -> typed events and a growing `Result` (no I/O)."""

from __future__ import annotations

import logging

import numpy as np

from xattn.clients.data import (
    FRAMES,
    Event,
    Finished,
    Head,
    ModelInfo,
    Result,
    Segment,
    Timings,
    Token,
    Window,
    WindowDiscarded,
    WindowStarted,
    Word,
)
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

KINDS = {
    pb.TOKEN_KIND_TEXT: "text",
    pb.TOKEN_KIND_TIMESTAMP: "timestamp",
    pb.TOKEN_KIND_END_OF_TEXT: "eot",
}
WIRE_DTYPES = {
    pb.DATA_TYPE_UNSPECIFIED: np.dtype("<f2"),
    pb.DATA_TYPE_FLOAT16: np.dtype("<f2"),
    pb.DATA_TYPE_FLOAT32: np.dtype("<f4"),
}


def decode_tensor(tensor: pb.Tensor) -> np.ndarray:
    """A Tensor's little-endian values as float32 in its shape (a 1-D row becomes [1, n])."""
    dtype = WIRE_DTYPES.get(tensor.data_type)
    if dtype is None:
        raise ValueError(f"unknown tensor data_type {tensor.data_type}")
    shape = tuple(int(s) for s in tensor.shape)
    count = int(np.prod(shape)) if shape else 0
    if len(tensor.data) != count * dtype.itemsize:
        raise ValueError(f"tensor of shape {shape} has {len(tensor.data)} bytes of {dtype}")
    values = np.frombuffer(tensor.data, dtype=dtype).astype(np.float32).reshape(shape)
    return values.reshape(1, -1) if values.ndim == 1 else values


def mean_rows(heads: list[Head] | None, alignment_heads: tuple[Head, ...]) -> list[int]:
    """Which row indices average to the alignment-head mean (all rows if none match)."""
    if heads is None:
        return [0]
    wanted = set(alignment_heads)
    picked = [i for i, h in enumerate(heads) if h in wanted]
    return picked or list(range(len(heads)))


def alignment_mean(rows: np.ndarray, picked: list[int]) -> np.ndarray:
    """[..., n_heads, 1500] -> [..., 1500]: the mean over the picked heads."""
    return rows[..., picked, :].mean(axis=-2)


def attach_words(window: Window, segments: list[Segment]) -> None:
    """Give each text token of `window` its word's start (matched by the words' characters)."""
    words = [w for s in segments if s.window == window.window for w in s.words]
    if not words:
        return
    owner: list[int] = []  # word index of each non-space character of the words
    for i, w in enumerate(words):
        owner.extend(i for c in w.word if not c.isspace())
    pos = 0
    for token in window.tokens:
        if token.kind != "text":
            continue
        chars = sum(1 for c in token.text if not c.isspace())
        if pos >= len(owner):
            break
        token.start = words[owner[pos]].start
        pos += chars


class Assembler:
    """Feeds on stream messages; keeps the windows, segments and (at `done`) the Result."""

    def __init__(self, info: ModelInfo, heads: list[Head] | None) -> None:
        self.info = info
        self.heads = heads
        self.picked = mean_rows(heads, info.alignment_heads)
        self.windows: list[Window] = []
        self.segments: list[Segment] = []
        self.result: Result | None = None

    def _window(self, index: int) -> Window:
        for w in reversed(self.windows):
            if w.window == index:
                return w
        log.warning("event for window %d before its window_start", index)
        w = Window(index, index * 30.0, FRAMES, "")
        self.windows.append(w)
        return w

    def feed(self, msg: pb.StreamTranscribeResponse) -> list[Event]:
        kind = msg.WhichOneof("event")
        if kind == "window_start":
            ws = msg.window_start
            clock = tuple((c.first_frame, c.num_frames, c.start) for c in ws.clock)
            self.windows.append(
                Window(ws.window, ws.offset, ws.num_frames, ws.language, clock=clock)
            )
            return [WindowStarted(ws.window, ws.offset, ws.num_frames, ws.language, clock)]
        if kind == "token":
            return [self._token(msg.token)]
        if kind == "window_discarded":
            wd = msg.window_discarded
            w = self._window(wd.window)
            w.tokens.clear()
            w.discarded += 1
            return [WindowDiscarded(wd.window, wd.temperature, wd.reason)]
        if kind == "segment":
            seg = segment(msg.segment)
            self.segments.append(seg)
            attach_words(self._window(seg.window), [seg])
            return [seg]
        if kind == "done":
            return [Finished(self._finish(msg.done))]
        log.warning("unknown stream event %r", kind)
        return []

    def _token(self, t: pb.Token) -> Token:
        w = self._window(t.window)
        token = Token(
            index=t.index,
            id=t.id,
            text=t.text,
            logprob=t.logprob,
            window=t.window,
            kind=KINDS.get(t.kind, "text"),
            temperature=t.temperature,
            timestamp=t.timestamp if t.HasField("timestamp") else None,
            offset=w.offset,
            early=t.early,
            clock=w.clock,
        )
        if t.HasField("alignment") and t.alignment.shape:
            token.row = decode_tensor(t.alignment)
            real = max(1, min(w.num_frames or FRAMES, token.row.shape[-1]))
            token.peak_frame = int(np.argmax(alignment_mean(token.row, self.picked)[:real]))
        w.tokens.append(token)
        return token

    def _finish(self, done: pb.Done) -> Result:
        t = done.transcript
        if t.segments:  # the final word: what Transcribe would answer
            self.segments = [segment(s) for s in t.segments]
        for w in self.windows:  # words again, now that every segment is known
            attach_words(w, self.segments)
        tm = done.timings
        self.result = Result(
            text=t.text,
            language=t.language,
            duration=t.duration,
            segments=self.segments,
            windows=self.windows,
            heads=self.heads,
            info=self.info,
            timings=Timings(
                tm.queue_seconds,
                tm.audio_seconds,
                tm.encode_seconds,
                tm.decode_seconds,
                tm.total_seconds,
            ),
            speech=[(s.start, s.end) for s in t.speech] if t.vad_filtered else None,
        )
        return self.result


def segment(s: pb.Segment) -> Segment:
    return Segment(
        id=s.id,
        window=s.window,
        start=s.start,
        end=s.end,
        text=s.text,
        tokens=tuple(s.tokens),
        temperature=s.temperature,
        avg_logprob=s.avg_logprob,
        compression_ratio=s.compression_ratio,
        no_speech_prob=s.no_speech_prob,
        words=tuple(Word(w.word, w.start, w.end, w.probability) for w in s.words),
    )
