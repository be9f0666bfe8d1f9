"""What a live stream is given and gives back (xattn.model.live.transcriber runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xattn.model.audio.vad import VadOptions
from xattn.model.decode.results import WordTiming
from xattn.model.live.window import SHORTEST


@dataclass(frozen=True)
class LiveOptions:
    language: str | None = None  # None: "en", or detected on the first decode (multilingual)
    commit_margin: float = 0.3  # seconds: attention this close to the newest audio waits
    agreement: bool = True  # also commit what two successive decodes agree on
    min_step: float = 0.3  # seconds of new audio before decoding again
    max_buffer: float = 25.0  # seconds: slide the buffer before the 30 s window fills
    return_attention: bool = True
    vad: VadOptions | None = None  # skip decodes while nobody speaks (xattn.model.live.vad_stream)
    single_utterance: bool = False  # with vad: over after the first speech ends
    # seconds of margin after the buffer's audio that a step encodes (rounded up to whole
    # seconds, at least encode_floor, with the window's last second; xattn.model.live.window);
    # None: the whole 30 s window
    encode_margin: float | None = None
    encode_floor: float = SHORTEST  # seconds: with encode_margin, the shortest window encoded
    # no step while the new audio's RMS is below this (dB of full scale) and the last step
    # left nothing undecided; None: a step on every min_step of audio
    gate_db: float | None = None
    # a hypothesis ends where the attention jumps back more than this (s; a repetition loop);
    # None: no cut
    max_jump: float | None = None
    # a hypothesis ends before a run of tokens repeated more than this many times in a row
    max_repeats: int | None = None
    # at most this many tokens a second of buffered audio a step (+ 16); None: up to 224
    tokens_per_second: float | None = None
    # seconds of audio after the last committed text past which a decode that ended with
    # nothing but punctuation undecided slides the buffer (policy.stalled); None: never
    stall: float | None = 1.5
    # seconds of audio heard after a stream's first words before they are committed (by the
    # heard rule alone): with no text before them Whisper misreads first words until it hears
    # what follows (tiny.en read "Set the thermostat" as "That's the first time" until 2 s
    # were heard); None: as any other words
    first_context: float | None = None
    # beams of each step's decode (1: greedy): the offline default searches 5, and greedy
    # reads more words wrong (xattn.model.decode.beams; a step's decoder costs ~beams rows)
    beam_size: int = 1
    # the encoder's precision for live steps (AudioEncoder.PRECISIONS: "fp32", "bf16",
    # "int8"; approximate but for fp32); None: the model's compute
    precision: str | None = None


@dataclass(frozen=True)
class LiveToken:
    id: int
    text: str
    logprob: float
    peak_time: float  # stream clock: where its attention peaked
    attention: np.ndarray | None = field(default=None, repr=False, compare=False)  # [L, H, 1500]


@dataclass(frozen=True)
class LiveResult:
    is_final: bool
    tokens: tuple[LiveToken, ...]
    text: str
    stability: float  # interim: share of its tokens the previous decode proposed too
    buffer_offset: float  # stream time of frame 0 of the window the rows refer to
    audio_seconds: float  # audio received when this was decided
    words: tuple[WordTiming, ...] = ()  # finals: stream clock


@dataclass
class LiveStats:
    """What the decodes cost so far (wall-clock seconds on the calling thread)."""

    steps: int = 0  # decodes run (each re-encodes the buffer; a finish over silence reuses one)
    encode_seconds: float = 0.0  # log-mel and encoder passes
    step_seconds: float = 0.0  # whole steps: encode, decode, word alignment
    skipped_steps: int = 0  # vad, gate_db: decodes that new audio would have run in silence
    encoder_frames: int = 0  # encoder frames computed (1,500 a whole window), over all steps
    decoder_steps: int = 0  # decoder forward passes of the steps' decodes (one per token)
