"""Checks of the DecodeOptions that openai-whisper and faster-whisper take, each raising
OptionsError that names the field (as the proto spells it) and the allowed values."""

from __future__ import annotations

import math

from xattn.model.decode.decoding import DecodeOptions, OptionsError

MAX_SECONDS = 30.0  # a window


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise OptionsError(f"{name} must be a finite number, not {value}")


def _in_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):  # NaN fails too
        raise OptionsError(f"{name} must be in [{low:g}, {high:g}], not {value}")


def validate_options(options: DecodeOptions, n_vocab: int) -> None:
    """Raise OptionsError for the first option out of its range."""
    for t in options.suppress_tokens:
        if t != -1 and not 0 <= t < n_vocab:
            raise OptionsError(
                f"suppress_tokens: {t} is not a token id (0..{n_vocab - 1}, or -1 for the "
                "checkpoint's list)"
            )
    if options.max_initial_timestamp is not None:
        _in_range("max_initial_timestamp", options.max_initial_timestamp, 0.0, MAX_SECONDS)
    if options.compression_ratio_threshold is not None:
        _finite("compression_ratio_threshold", options.compression_ratio_threshold)
        _in_range("compression_ratio_threshold", options.compression_ratio_threshold, 0, 1e6)
    if options.logprob_threshold is not None:
        _finite("logprob_threshold", options.logprob_threshold)
        _in_range("logprob_threshold", options.logprob_threshold, -1e6, 0.0)
    if options.no_speech_threshold is not None:
        _in_range("no_speech_threshold", options.no_speech_threshold, 0.0, 1.0)
    threshold = options.hallucination_silence_threshold
    if threshold is not None:
        if not options.word_timestamps:
            raise OptionsError(
                "hallucination_silence_threshold needs word_timestamps (as in openai-whisper)"
            )
        if not (0 < threshold <= MAX_SECONDS):
            raise OptionsError(
                f"hallucination_silence_threshold must be in (0, {MAX_SECONDS:g}] s, not "
                f"{threshold}"
            )
    previous = 0.0
    for i, t in enumerate(options.clip_timestamps):
        if not math.isfinite(t) or t < previous:
            raise OptionsError(
                f"clip_timestamps[{i}] = {t}: the times must be finite, >= 0 and not decrease "
                "(start, end, start, end, ... seconds)"
            )
        if i % 2 and t == previous:
            raise OptionsError(f"clip_timestamps[{i}] = {t}: a clip must end after its start")
        previous = t
