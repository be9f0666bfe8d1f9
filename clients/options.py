"""The transcription options of openai-whisper and faster-whisper, as the client sends them.

`Options()` leaves every field at the server's default (openai-whisper's); set what you need::

    options = Options(initial_prompt="Kubernetes, gRPC.", task="translate")
    client.transcribe("talk.mp3", options=options)

Thresholds take a number, `OFF` (the check is not made: openai-whisper's None) or None (the
server's default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from xattn.v1 import transcriber_pb2 as pb

OFF: Literal["off"] = "off"
Threshold = float | Literal["off"] | None
TASKS = {"transcribe": pb.TASK_TRANSCRIBE, "translate": pb.TASK_TRANSLATE}


@dataclass(frozen=True)
class Options:
    task: str | None = None  # "transcribe" or "translate" (into English)
    initial_prompt: str | None = None  # prompts the first window; not in the transcript
    prefix: str | None = None  # the first window's text starts with it
    hotwords: str | None = None  # faster-whisper's hint phrases, in every window's prompt
    suppress_tokens: Sequence[int] | None = None  # ids; -1: the checkpoint's list
    suppress_blank: bool | None = None
    without_timestamps: bool = False
    max_initial_timestamp: float | None = None  # s; 0: no limit
    condition_on_previous_text: bool | None = None
    compression_ratio_threshold: Threshold = None
    logprob_threshold: Threshold = None
    no_speech_threshold: Threshold = None
    hallucination_silence_threshold: float | None = None  # s; needs word timestamps
    clip_timestamps: Sequence[float] = ()  # start, end, start, ... seconds
    prepend_punctuations: str | None = None
    append_punctuations: str | None = None
    # the search (xattn.model.decode.beams): None leaves the server's beam 5, best-of 5
    beam_size: int | None = None  # 1: greedy
    best_of: int | None = None  # samples at each fallback temperature above 0
    patience: float | None = None
    length_penalty: float | None = None  # None: rank by logprob / length
    # voice activity detection (Silero, faster-whisper's vad_filter): decode only the speech
    vad_filter: bool = False
    vad_threshold: float | None = None  # speech probability (0.5)
    vad_min_silence_duration_ms: int | None = None  # silence that ends a span (2000)
    vad_speech_pad_ms: int | None = None  # padding each side (400)
    batch_size: int | None = None  # batched long-form: N windows at once; None: sequential

    def apply(self, msg: pb.TranscriptionOptions) -> pb.TranscriptionOptions:
        """Set these options on `msg` (fields left None keep the server's defaults)."""
        if self.task is not None:
            if self.task not in TASKS:
                raise ValueError(f"task must be one of {sorted(TASKS)}, not {self.task!r}")
            msg.task = TASKS[self.task]
        for name in ("initial_prompt", "prefix", "hotwords"):
            if getattr(self, name):
                setattr(msg, name, getattr(self, name))
        if self.suppress_tokens is not None:
            msg.suppress_tokens.SetInParent()  # set, even with no ids
            msg.suppress_tokens.ids.extend(int(t) for t in self.suppress_tokens)
        optional = (
            "suppress_blank",
            "max_initial_timestamp",
            "condition_on_previous_text",
            "hallucination_silence_threshold",
            "prepend_punctuations",
            "append_punctuations",
            "beam_size",
            "best_of",
            "patience",
            "length_penalty",
            "batch_size",
        )
        for name in optional:
            if getattr(self, name) is not None:
                setattr(msg, name, getattr(self, name))
        msg.without_timestamps = self.without_timestamps
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            value = getattr(self, name)
            if value is not None:
                getattr(msg, name).SetInParent()
            if value == OFF:
                getattr(msg, name).off = True
            elif value is not None:
                getattr(msg, name).value = float(value)
        msg.clip_timestamps.extend(float(t) for t in self.clip_timestamps)
        msg.vad_filter = self.vad_filter
        for name in ("threshold", "min_silence_duration_ms", "speech_pad_ms"):
            if getattr(self, f"vad_{name}") is not None:
                setattr(msg.vad_options, name, getattr(self, f"vad_{name}"))
        return msg
