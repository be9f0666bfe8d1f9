"""Audio in: files and containers to mono samples (`containers`: libsndfile and PyAV, no
torch), resampling to 16 kHz and the log-mel (`features`), voice activity over a whole file
(`vad`: Silero, speech spans and the map back to the file's clock).

May import: nothing else of xattn.model (the lowest layer).

The audio API is re-exported here (`xattn.model.audio.decode_audio`, ...), loaded when first
used, so that importing `xattn.model.audio.containers` alone (the server's decoder workers)
does not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xattn.model.audio.containers import (  # noqa: F401 (the re-exports, for type checkers)
        DEMUXERS,
        MAX_CHANNELS,
        MAX_SAMPLE_RATE,
        AudioError,
        AudioTooLongError,
        decode_native,
    )
    from xattn.model.audio.features import (  # noqa: F401
        N_FRAMES,
        N_SAMPLES,
        SAMPLE_RATE,
        check_audio,
        decode_audio,
        log_mel_spectrogram,
        pad_or_trim,
        pcm_to_audio,
        to_16k,
    )

_CONTAINERS = (
    "DEMUXERS",
    "MAX_CHANNELS",
    "MAX_SAMPLE_RATE",
    "AudioError",
    "AudioTooLongError",
    "decode_native",
)
_FEATURES = (
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLE_RATE",
    "check_audio",
    "decode_audio",
    "log_mel_spectrogram",
    "pad_or_trim",
    "pcm_to_audio",
    "to_16k",
)
__all__ = [*_CONTAINERS, *_FEATURES]


def __getattr__(name: str) -> Any:
    if name in _CONTAINERS:
        return getattr(importlib.import_module(f"{__name__}.containers"), name)
    if name in _FEATURES:
        return getattr(importlib.import_module(f"{__name__}.features"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
