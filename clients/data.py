"""The client's data: model info, streamed events, the assembled `Result`.

Plain dataclasses (no gRPC) so renderers and tests can build them by hand. Rows are
float32 numpy arrays of shape [n_heads, 1500]: one per head the request selected, or a
single row holding the mean over the checkpoint's alignment heads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FRAMES = 1500  # encoder frames per 30 s window
FRAMES_PER_SECOND = 50  # one frame is 20 ms

Head = tuple[int, int]  # (layer, head), both 0-based


def frame_time(clock: tuple[tuple[int, int, float], ...], offset: float, frame: float) -> float:
    """Seconds on the file's clock of a window's `frame`: through its vad_filter clock, else
    offset + frame / 50."""
    for first, count, start in clock:
        if first <= frame < first + count:
            return start + (frame - first) / FRAMES_PER_SECOND
    return offset + frame / FRAMES_PER_SECOND


@dataclass(frozen=True)
class ModelInfo:
    """What GetModelInfo says, with the numbers the renderers use."""

    name: str
    n_text_layer: int
    n_text_head: int
    n_text_state: int
    n_text_ctx: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_layer: int
    n_audio_head: int
    n_mels: int
    n_vocab: int
    alignment_heads: tuple[Head, ...]
    languages: tuple[str, ...]
    multilingual: bool
    frames_per_second: int = FRAMES_PER_SECOND
    compute_type: str = ""
    device: str = ""
    compute_exact: bool = True  # the compute path transcribes exactly as fp32
    compute_note: str = ""  # what an approximate compute path changes, measured

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["alignment_heads"] = [list(h) for h in self.alignment_heads]
        d["languages"] = list(self.languages)
        return d


@dataclass(frozen=True)
class WindowStarted:
    """The decoder starts a 30 s window (its encoder pass is done)."""

    window: int
    offset: float
    num_frames: int
    language: str
    clock: tuple[tuple[int, int, float], ...] = ()  # vad_filter: see Window.clock


@dataclass
class Token:
    """One decoded token; `row` is its cross-attention, `peak_frame` the argmax of its
    alignment-head mean over the window's real frames."""

    index: int
    id: int
    text: str
    logprob: float
    window: int
    kind: str  # "text", "timestamp" or "eot"
    temperature: float = 0.0
    timestamp: float | None = None  # seconds within the window, timestamp tokens only
    row: np.ndarray | None = field(default=None, repr=False)  # [n_heads, 1500]
    peak_frame: int | None = None
    offset: float = 0.0  # the window's start in the file
    start: float | None = None  # its word's start (file clock), when words were asked
    early: bool = False  # a beam search sent it before its window's search ended
    clock: tuple[tuple[int, int, float], ...] = ()  # vad_filter: its window's (see Window)

    @property
    def label(self) -> str:
        """A short, printable name: the text, `<|1.24|>` or `<|eot|>`."""
        if self.kind == "timestamp":
            return f"<|{self.timestamp or 0.0:.2f}|>"
        if self.kind == "eot":
            return "<|eot|>"
        return self.text if self.text else "\u00b7"

    @property
    def peak_time(self) -> float | None:
        """The attention peak on the file's clock, seconds."""
        if self.peak_frame is None:
            return None
        return frame_time(self.clock, self.offset, self.peak_frame)

    @property
    def play_time(self) -> float:
        """Where to play it from: its word's start, else its timestamp, else its peak."""
        if self.start is not None:
            return self.start
        if self.kind == "timestamp" and self.timestamp is not None:
            return frame_time(self.clock, self.offset, self.timestamp * FRAMES_PER_SECOND)
        return self.peak_time if self.peak_time is not None else self.offset

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "text": self.text,
            "kind": self.kind,
            "logprob": round(float(self.logprob), 6),
            "window": self.window,
            "timestamp": self.timestamp,
            "peak_frame": self.peak_frame,
            "peak_time": None if self.peak_time is None else round(self.peak_time, 3),
            "start": None if self.start is None else round(self.start, 3),
        }


@dataclass(frozen=True)
class WindowDiscarded:
    """The window's last attempt was rejected; its tokens (and rows) were dropped."""

    window: int
    temperature: float
    reason: str


@dataclass(frozen=True)
class Word:
    word: str
    start: float
    end: float
    probability: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "probability": round(self.probability, 4),
        }


@dataclass(frozen=True)
class Segment:
    id: int
    window: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "window": self.window,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": list(self.tokens),
            "temperature": self.temperature,
            "avg_logprob": round(self.avg_logprob, 6),
            "compression_ratio": round(self.compression_ratio, 4),
            "no_speech_prob": round(self.no_speech_prob, 6),
            "words": [w.to_dict() for w in self.words],
        }


@dataclass
class Window:
    """One 30 s window: its accepted tokens and their rows, growing as they stream."""

    window: int
    offset: float
    num_frames: int
    language: str
    tokens: list[Token] = field(default_factory=list)
    discarded: int = 0  # attempts rejected so far
    # vad_filter: (first frame, frames, start s) pieces: where its frames lie on the file's
    # clock (a window of joined speech); (): frame f at offset + f / 50
    clock: tuple[tuple[int, int, float], ...] = ()

    def matrix(self) -> np.ndarray:
        """The rows stacked: [n_tokens, n_heads, 1500] (tokens without rows are left out)."""
        rows = [t.row for t in self.tokens if t.row is not None]
        if not rows:
            return np.zeros((0, 1, FRAMES), np.float32)
        return np.stack(rows)

    @property
    def duration(self) -> float:
        return self.num_frames / FRAMES_PER_SECOND


@dataclass(frozen=True)
class Timings:
    queue: float = 0.0
    audio: float = 0.0
    encode: float = 0.0
    decode: float = 0.0
    total: float = 0.0


@dataclass
class Result:
    """The whole transcription, with every window's matrix."""

    text: str
    language: str
    duration: float
    segments: list[Segment]
    windows: list[Window]
    heads: list[Head] | None  # what each row index means; None: the alignment-head mean
    info: ModelInfo
    timings: Timings = field(default_factory=Timings)
    speech: list[tuple[float, float]] | None = None  # vad_filter: the spans decoded as speech

    @property
    def tokens(self) -> list[Token]:
        return [t for w in self.windows for t in w.tokens]

    @property
    def words(self) -> list[Word]:
        return [w for s in self.segments for w in s.words]

    def to_dict(self) -> dict[str, Any]:
        """Everything but the matrices, for --json."""
        return {
            "text": self.text,
            "language": self.language,
            "duration": round(self.duration, 3),
            "model": self.info.name,
            "segments": [s.to_dict() for s in self.segments],
            "speech": self.speech,
            "tokens": [t.to_dict() for t in self.tokens],
            "windows": [
                {
                    "window": w.window,
                    "offset": w.offset,
                    "num_frames": w.num_frames,
                    "clock": [list(p) for p in w.clock],
                    "language": w.language,
                    "token_indices": [t.index for t in w.tokens],
                    "discarded_attempts": w.discarded,
                }
                for w in self.windows
            ],
            "timings": asdict(self.timings),
        }


@dataclass(frozen=True)
class Finished:
    """The last event: the whole result."""

    result: Result


Event = WindowStarted | Token | WindowDiscarded | Segment | Finished
