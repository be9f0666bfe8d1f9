"""Audio front-end: decode files or raw PCM to 16 kHz mono float32, and compute the
log-Mel spectrogram that Whisper's encoder reads.

Decoding: xattn.model.audio.containers (libsndfile for WAV/FLAC/OGG/AIFF, exact for 16/24-bit PCM;
PyAV, FFmpeg, for everything else), to mono at the file's own rate; resampled here.

Resampling: ``torchaudio.functional.resample`` (windowed sinc, Hann, 6 zero crossings), chosen
because it is deterministic, in-process and needs no ffmpeg binary. openai-whisper resamples with
the ffmpeg CLI, so decoded samples differ slightly from its ``load_audio``; the mel spectrogram of
the same 16 kHz array matches ``whisper.audio.log_mel_spectrogram`` to < 1e-4.
"""

from __future__ import annotations

import logging
import math
import os
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

try:
    import torchaudio.functional as AF
except OSError as e:  # its C library, built for another torch than the one installed
    raise ImportError(
        f"torchaudio does not load with torch {torch.__version__} ({e}): install the "
        "torchaudio release built for this torch (https://pytorch.org/audio/main/installation)"
    ) from e

from xattn.model.audio.containers import (  # noqa: F401 (re-exported: the audio API is here)
    BUDGET_VALUES_PER_SECOND,
    DEMUXERS,
    MAX_CHANNELS,
    MAX_SAMPLE_RATE,
    AudioError,
    AudioTooLongError,
    _check_channels,
    _check_rate,
    _check_samples,
    _mix,
    decode_native,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a 30 s window
_PCM_DTYPES = {"int16": np.dtype("<i2"), "float32": np.dtype("<f4")}
_MAX_KERNEL = 1_000_000  # cap on the resampler's (in steps x out steps); see resample_ratio


def check_audio(audio: np.ndarray) -> np.ndarray:
    """Return ``audio`` if it is a non-empty, finite, 1-D float32 array; else raise AudioError."""
    if not isinstance(audio, np.ndarray):
        raise AudioError(f"audio must be a numpy array, not {type(audio).__name__}")
    if audio.ndim != 1:
        raise AudioError(f"audio must be 1-D (mono), got shape {audio.shape}")
    if audio.dtype != np.float32:
        raise AudioError(f"audio must be float32, got {audio.dtype}")
    return _check_samples(audio)


def resample_ratio(sample_rate: int) -> Fraction:
    """In steps / out steps of resampling `sample_rate` to 16 kHz (both resamplers' ratio).

    torchaudio's polyphase kernel is [out steps, in steps + taps], the steps being the rate
    ratio in lowest terms: small for 44.1/48 kHz, gigabytes for a coprime rate like 44101 Hz.
    Such a ratio is rounded to a nearby one with a kernel of ~1M weights (< 0.05% time error).
    """
    ratio = Fraction(sample_rate, SAMPLE_RATE)
    if ratio.numerator * ratio.denominator > _MAX_KERNEL:
        ratio = ratio.limit_denominator(max(1, math.isqrt(int(_MAX_KERNEL / ratio))))
        log.debug("resampling %d Hz as if it were %s x 16 kHz", sample_rate, ratio)
    return ratio


def _resample(mono: np.ndarray, sample_rate: int) -> np.ndarray:
    ratio = resample_ratio(sample_rate)  # in steps / out steps
    y = AF.resample(torch.from_numpy(mono), ratio.numerator, ratio.denominator)  # [n / ratio]
    return y.numpy()


def _to_mono_16k(frames: np.ndarray, sample_rate: int) -> np.ndarray:
    """[n, channels] float samples at ``sample_rate`` -> [m] float32 at 16 kHz, in [-1, 1]."""
    mono = _mix(_check_samples(frames), axis=1)  # [n]
    mono = np.clip(mono, -1.0, 1.0)  # full scale: a float file may hold anything finite
    if sample_rate != SAMPLE_RATE:
        mono = _resample(np.ascontiguousarray(mono), sample_rate)  # [m]
    return check_audio(np.clip(mono, -1.0, 1.0).astype(np.float32, copy=False))


def pcm_to_audio(data: bytes, sample_rate: int, encoding: str, channels: int) -> np.ndarray:
    """Raw little-endian interleaved PCM ("int16" or "float32") -> 16 kHz mono float32."""
    if encoding not in _PCM_DTYPES:
        raise AudioError(f"unknown PCM encoding {encoding!r} (use 'int16' or 'float32')")
    _check_rate(sample_rate)
    _check_channels(channels)
    dtype = _PCM_DTYPES[encoding]
    frame_size = dtype.itemsize * channels
    if len(data) % frame_size:
        msg = f"PCM byte length {len(data)} is not a multiple of the frame size {frame_size}"
        raise AudioError(f"{msg} ({channels} x {encoding})")
    frames = np.frombuffer(data, dtype=dtype).reshape(-1, channels)  # [n, channels]
    if encoding == "int16":
        frames = frames.astype(np.float32) / 32768.0
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf are refused by name below
        return _to_mono_16k(frames, sample_rate)


def to_16k(mono: np.ndarray, rate: int) -> np.ndarray:
    """Mono float32 samples at `rate` (decode_native's) -> [m] float32 at 16 kHz in [-1, 1]."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf are refused by name
        return _to_mono_16k(mono[:, None], rate)  # [n, 1] -> [m]


def decode_audio(
    source: bytes | str | os.PathLike[str], *, max_seconds: float | None = None
) -> np.ndarray:
    """Decode an audio file (path or its bytes) to 16 kHz mono float32 in [-1, 1].

    With ``max_seconds``, raise AudioTooLongError for longer audio, or for audio over the
    decoding budget (max_seconds of stereo 48 kHz, see BUDGET_VALUES_PER_SECOND): before
    decoding when the header declares the duration, else as soon as decoding passes the limit.
    """
    return to_16k(*decode_native(source, max_seconds=max_seconds))


@lru_cache(maxsize=16)
def _mel_filters(n_mels: int, device: torch.device) -> torch.Tensor:
    fb = AF.melscale_fbanks(  # [n_freqs, n_mels]
        N_FFT // 2 + 1, 0.0, SAMPLE_RATE / 2, n_mels, SAMPLE_RATE, norm="slaney", mel_scale="slaney"
    )
    return fb.T.contiguous().to(device)  # [n_mels, n_freqs]


def mel_filters(n_mels: int = 80, device: str | torch.device | None = None) -> torch.Tensor:
    """Slaney-style mel filterbank [n_mels, 201] (librosa's default, as Whisper uses)."""
    return _mel_filters(n_mels, torch.device(device or "cpu"))


def log_mel_spectrogram(
    audio: np.ndarray | torch.Tensor,
    n_mels: int = 80,
    padding: int = 0,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Whisper's log-Mel spectrogram [n_mels, n_frames] of 16 kHz audio [n_samples]."""
    if isinstance(audio, np.ndarray):
        audio = torch.from_numpy(audio if audio.flags.writeable else audio.copy())
    x = audio if audio.dtype == torch.float32 else audio.float()  # [n]
    if device is not None:
        x = x.to(device)
    if padding > 0:
        x = F.pad(x, (0, padding))  # [n + padding]
    window = torch.hann_window(N_FFT, device=x.device)  # periodic
    stft = torch.stft(x, N_FFT, HOP_LENGTH, window=window, return_complex=True)  # [201, T + 1]
    power = stft[..., :-1].abs() ** 2  # [201, T]
    mel = mel_filters(n_mels, x.device) @ power  # [n_mels, T]
    log_spec = torch.clamp(mel, min=1e-10).log10()  # [n_mels, T]
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)  # [n_mels, T]
    return (log_spec + 4.0) / 4.0  # [n_mels, T]


def pad_or_trim(array: torch.Tensor, length: int = N_FRAMES, axis: int = -1) -> torch.Tensor:
    """Zero-pad or cut ``array`` along ``axis`` to exactly ``length``."""
    axis %= array.ndim
    size = array.shape[axis]
    if size > length:
        return array.narrow(axis, 0, length)
    if size < length:
        pad = [0, 0] * array.ndim  # F.pad lists (left, right) from the last axis backwards
        pad[2 * (array.ndim - 1 - axis) + 1] = length - size
        return F.pad(array, pad)
    return array
