"""What decoding hands out: frozen dataclasses, yielded as soon as they are known.

Times are seconds on the whole file's clock. A `row` is one token's cross-attention
over the 1,500 encoder frames of its window (20 ms each).
"""

from dataclasses import dataclass, field

import numpy as np

FRAMES_PER_SECOND = 50  # encoder frames per second of audio (20 ms each)


@dataclass(frozen=True)
class TimeSpan:
    """Seconds on the whole file's clock, e.g. a stretch of speech that vad_filter kept."""

    start: float
    end: float


@dataclass(frozen=True)
class FrameSpan:
    """vad_filter: frames first .. first + count - 1 of a window lie on the original clock at
    start + 0.02 s each (a window of joined speech is pieced together from several spans)."""

    first: int
    count: int
    start: float


@dataclass(frozen=True)
class WindowStart:
    """A 30 s window is about to be decoded (yielded after its encoder pass)."""

    window: int  # index of the decode attempt over the file, 0, 1, 2 ...
    offset: float  # seconds: where the window starts in the file
    num_frames: int  # encoder frames (of 1,500) that hold real audio
    language: str
    clock: tuple[FrameSpan, ...] = ()  # vad_filter: where its frames lie; (): offset + 0.02 f


@dataclass(frozen=True)
class TokenEvent:
    """One token, yielded the moment it is chosen."""

    index: int  # position among all tokens emitted for the file (0, 1, ...)
    id: int
    text: str  # "" for timestamp tokens and end-of-text
    logprob: float  # log-probability under the filtered distribution it was chosen from
    window: int
    temperature: float
    timestamp: float | None = None  # seconds within the window, for timestamp tokens
    # DecodeOptions.online_timestamps: the live estimate of when the token was spoken (whole-
    # file clock), its attention peak over the alignment heads; see alignment.online_token_time
    online_time: float | None = None
    # [n_text_layer, n_text_head, 1500] float32 softmax weights over the frames,
    # from the same forward pass that chose the token; None when not asked.
    attention: np.ndarray | None = field(default=None, repr=False, compare=False)
    # a beam search sent it while still searching: every candidate that could still win
    # shares it (xattn.model.decode.beams); False for greedy and sampled tokens, sent as chosen
    early: bool = False


@dataclass(frozen=True)
class WindowDiscarded:
    """The tokens of `window` with `temperature` were rejected; a fallback follows."""

    window: int
    temperature: float
    reason: str  # "compression_ratio" or "avg_logprob"


@dataclass(frozen=True)
class WordTiming:
    word: str
    start: float
    end: float
    probability: float
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenTiming:
    id: int
    start: float
    end: float


@dataclass(frozen=True)
class Segment:
    id: int
    window: int
    seek: int  # mel frame (10 ms) where the window started
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]  # with timestamp tokens, as openai-whisper keeps them
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[WordTiming, ...] = ()
    token_timings: tuple[TokenTiming, ...] = ()


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    segments: tuple[Segment, ...]
    duration: float  # seconds of audio
    speech: tuple[TimeSpan, ...] | None = None  # vad_filter: the spans decoded; None: all
