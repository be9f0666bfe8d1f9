"""Audio front-end: decode files or raw PCM to 16 kHz mono float32, and compute the
log-Mel spectrogram that Whisper's encoder reads.

Decoding: soundfile (libsndfile) for WAV/FLAC/OGG/AIFF, which is exact for 16/24-bit PCM;
PyAV (FFmpeg) for everything else (MP3, M4A, ...). Channels are averaged to mono.

Resampling: ``torchaudio.functional.resample`` (windowed sinc, Hann, 6 zero crossings), chosen
because it is deterministic, in-process and needs no ffmpeg binary. openai-whisper resamples with
the ffmpeg CLI, so decoded samples differ slightly from its ``load_audio``; the mel spectrogram of
the same 16 kHz array matches ``whisper.audio.log_mel_spectrogram`` to < 1e-4.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
from fractions import Fraction
from functools import lru_cache, partial
from pathlib import Path

import av
import numpy as np
import soundfile as sf
import torch
import torch.nn.functional as F

try:
    import torchaudio.functional as AF
except OSError as e:  # its C library, built for another torch than the one installed
    raise ImportError(
        f"torchaudio does not load with torch {torch.__version__} ({e}): install the "
        "torchaudio release built for this torch (https://pytorch.org/audio/main/installation)"
    ) from e

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in a 30 s window

MAX_SAMPLE_RATE = 384_000
MAX_CHANNELS = 32
_PCM_DTYPES = {"int16": np.dtype("<i2"), "float32": np.dtype("<f4")}
# libsndfile reads these exactly (24-bit included); anything else (MP3, AAC, ...) goes to PyAV
_SOUNDFILE_MAGIC = (b"RIFF", b"RF64", b"riff", b"fLaC", b"OggS", b"FORM", b"caff")
_MAX_KERNEL = 1_000_000  # cap on the resampler's (in steps x out steps); see _resample
# Decoding budget for untrusted files (with max_seconds): a file may decode to at most
# max_seconds of stereo 48 kHz worth of values (frames x channels). A few KB of FLAC or Vorbis
# can declare minutes of 8 channels at 192 kHz (gigabytes of float32); such a file is refused
# before it is decoded when its header says so, else as soon as decoding passes the budget.
BUDGET_VALUES_PER_SECOND = 2 * 48_000
_BLOCK_VALUES = 1 << 18  # values libsndfile decodes per block (1 MiB of float32)
_SF_UNKNOWN_FRAMES = 1 << 62  # libsndfile reports SF_COUNT_MAX frames for unknown lengths
# FFmpeg demuxers such as concat, hls or sdp open further URLs named inside the data (local
# files, sockets): for bytes, no protocol is allowed beyond the bytes handed over. Only the
# demuxers of audio files and of the usual audio/video containers may probe an input: the MPEG
# program stream one (PyAV 16.1's libavformat 62.3) kills the process with a segmentation
# fault, on a valid .mpg file as on the 6 KB input the fuzzer found
# (tests/fuzz/regressions/ffmpeg-mpeg-ps-segfault).
DEMUXERS = (
    "wav,w64,aiff,au,caf,flac,mp3,ogg,matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,aac,ac3,eac3,"
    "amr,amrnb,amrwb,asf,avi,flv,mpegts,ape,wv,tta,dsf,voc,gsm,dts,truehd,xwma,nistsphere"
)
_PYAV_OPTIONS = {"protocol_whitelist": "none", "format_whitelist": DEMUXERS}


class AudioError(ValueError):
    """Audio that cannot be used; the message names the problem."""


class AudioTooLongError(AudioError):
    """Audio longer than the caller's ``max_seconds``."""


def check_audio(audio: np.ndarray) -> np.ndarray:
    """Return ``audio`` if it is a non-empty, finite, 1-D float32 array; else raise AudioError."""
    if not isinstance(audio, np.ndarray):
        raise AudioError(f"audio must be a numpy array, not {type(audio).__name__}")
    if audio.ndim != 1:
        raise AudioError(f"audio must be 1-D (mono), got shape {audio.shape}")
    if audio.dtype != np.float32:
        raise AudioError(f"audio must be float32, got {audio.dtype}")
    return _check_samples(audio)


def _check_samples(samples: np.ndarray) -> np.ndarray:
    if samples.size == 0:
        raise AudioError("audio is empty (0 samples)")
    if bad := samples.size - int(np.count_nonzero(np.isfinite(samples))):
        raise AudioError(f"audio contains {bad} non-finite samples (NaN/Inf)")
    return samples


def _check_rate(sample_rate: int) -> int:
    if not 0 < sample_rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"invalid sample rate {sample_rate} Hz (must be 1..{MAX_SAMPLE_RATE})")
    return int(sample_rate)


def _resample(mono: np.ndarray, sample_rate: int) -> np.ndarray:
    # torchaudio's polyphase kernel is [out steps, in steps + taps], the steps being the rate
    # ratio in lowest terms: small for 44.1/48 kHz, gigabytes for a coprime rate like 44101 Hz.
    # Such a ratio is rounded to a nearby one with a kernel of ~1M weights (< 0.05% time error).
    ratio = Fraction(sample_rate, SAMPLE_RATE)  # in steps / out steps
    if ratio.numerator * ratio.denominator > _MAX_KERNEL:
        ratio = ratio.limit_denominator(max(1, math.isqrt(int(_MAX_KERNEL / ratio))))
        log.debug("resampling %d Hz as if it were %s x 16 kHz", sample_rate, ratio)
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
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"invalid channel count {channels} (must be 1..{MAX_CHANNELS})")
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


def _check_channels(channels: int) -> int:
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"invalid channel count {channels} (must be 1..{MAX_CHANNELS})")
    return channels


def _frame_limit(max_seconds: float | None, rate: int, channels: int) -> int | None:
    """Frames a file may decode to: max_seconds, within the decoding budget (None: any)."""
    if max_seconds is None:
        return None
    budget = max_seconds * BUDGET_VALUES_PER_SECOND / max(1, channels)
    return math.floor(min(max_seconds * rate, budget))


def _too_long(
    frames: float, rate: int, channels: int, max_seconds: float, what: str
) -> AudioTooLongError:
    seconds = frames / rate
    if seconds <= max_seconds:  # within the time limit, over the decoding budget
        return AudioTooLongError(
            f"audio is too long to decode: {what} {seconds:.1f} s of {channels} channels at "
            f"{rate} Hz; the limit is {max_seconds:g} s of stereo 48 kHz"
        )
    return AudioTooLongError(f"audio is too long: {what} {seconds:.1f} s, limit {max_seconds:g} s")


def _mono_to_16k(chunks: list[np.ndarray], rate: int) -> np.ndarray:
    """Mono float32 blocks at ``rate`` -> [m] float32 at 16 kHz, in [-1, 1]."""
    if not chunks:
        raise AudioError("audio is empty (0 samples)")
    mono = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)  # [n]
    return _to_mono_16k(mono[:, None], rate)  # [n, 1] -> [m]


def _decode_soundfile(src: object, max_seconds: float | None) -> np.ndarray | None:
    """Decode with libsndfile; None when it cannot open the input."""
    try:
        f = sf.SoundFile(src)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        log.debug("soundfile cannot open the audio: %s", e)
        return None
    with f:
        rate, channels = _check_rate(f.samplerate), _check_channels(f.channels)
        limit = _frame_limit(max_seconds, rate, channels)
        if limit is not None and limit < f.frames < _SF_UNKNOWN_FRAMES:
            raise _too_long(f.frames, rate, channels, max_seconds or 0, "declared")
        block = max(1, _BLOCK_VALUES // channels)
        chunks: list[np.ndarray] = []  # mono blocks: memory is frames x 4 bytes, not x channels
        n = 0
        try:
            while True:
                want = block if limit is None else min(block, limit + 1 - n)
                frames = f.read(frames=want, dtype="float32", always_2d=True)  # [k, channels]
                if not len(frames):
                    break
                chunks.append(_mix(frames, axis=1))  # [k]
                n += len(frames)
                if limit is not None and n > limit:
                    raise _too_long(n, rate, channels, max_seconds or 0, "over")
        except sf.LibsndfileError as e:
            why = e.error_string.removeprefix("Error : ")
            raise AudioError(f"cannot decode audio: {why}") from e
    return _mono_to_16k(chunks, rate)


def _decode_pyav(src: object, max_seconds: float | None) -> np.ndarray:
    try:
        options = _PYAV_OPTIONS | ({"protocol_whitelist": "file"} if isinstance(src, str) else {})
        # metadata that is not UTF-8 must not fail the decode (PyAV's default is "strict")
        container = av.open(src, mode="r", options=options, metadata_errors="replace")
    except av.error.FFmpegError as e:
        if e.errno == errno.EINVAL:  # found a demuxer that is not one of DEMUXERS
            raise AudioError(
                "cannot decode audio: not a format xattn reads (WAV, FLAC, MP3, Ogg, MP4/M4A, "
                "WebM/Matroska, AAC, AIFF, ASF/WMA, AVI, MPEG-TS, ...)"
            ) from e
        raise AudioError(f"cannot decode audio: {e.strerror or e}") from e
    with container:
        if not container.streams.audio:
            raise AudioError("no audio stream in the input")
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        if ctx is None:
            raise AudioError("no decoder for the audio stream's codec")
        if max_seconds is not None and container.duration is not None and ctx.sample_rate:
            declared = container.duration / av.time_base * ctx.sample_rate  # frames
            channels = max(1, ctx.channels)
            limit = _frame_limit(max_seconds, ctx.sample_rate, channels)
            if limit is not None and declared > limit:
                raise _too_long(declared, ctx.sample_rate, channels, max_seconds, "declared")
        chunks: list[np.ndarray] = []
        rate = n = 0
        try:
            for frame in container.decode(stream):
                if chunks and frame.sample_rate != rate:
                    raise AudioError(f"sample rate changes mid-stream: {frame.sample_rate} Hz")
                rate = _check_rate(frame.sample_rate)
                channels = _check_channels(frame.layout.nb_channels)
                chunks.append(_frame_to_mono(frame))  # [samples]
                n += frame.samples
                limit = _frame_limit(max_seconds, rate, channels)
                if limit is not None and n > limit:
                    raise _too_long(n, rate, channels, max_seconds or 0, "over")
        except av.error.FFmpegError as e:
            raise AudioError(f"cannot decode audio: {e.strerror or e}") from e
    return _mono_to_16k(chunks, rate)


def _frame_to_mono(frame: av.AudioFrame) -> np.ndarray:
    """One decoded PyAV frame (any sample format, any layout) -> [samples] float32."""
    try:
        x = frame.to_ndarray()  # planar: [channels, samples]; packed: [1, samples * channels]
    except (KeyError, ValueError) as e:  # e.g. 64-bit integer PCM: PyAV has no numpy view
        raise AudioError(f"unsupported sample format {frame.format.name!r}") from e
    if not frame.format.is_planar:
        x = x.reshape(-1, frame.layout.nb_channels).T  # [channels, samples]
    if x.dtype.kind in "iu":  # integer PCM: full scale is 2^(bits - 1); unsigned is offset
        half = float(2 ** (8 * x.dtype.itemsize - 1))
        x = (x.astype(np.float64) - (half if x.dtype.kind == "u" else 0.0)) / half
    return _mix(x, axis=0)  # [samples]


def _mix(x: np.ndarray, axis: int) -> np.ndarray:
    """The mean over channels, as float32: summed in float64, so that loud finite floats
    (up to 3.4e38) do not overflow to Inf on the way; a channel at a time, since numpy's mean
    over a short strided axis is ~10x slower (11 s of stereo: 11 vs 1.2 ms)."""
    channels = np.moveaxis(x, axis, 0)  # [channels, n], views
    if len(channels) == 1:
        return channels[0].astype(np.float32)  # [n], a copy
    total = channels[0].astype(np.float64)  # [n]
    for channel in channels[1:]:
        total += channel
    total /= len(channels)
    return total.astype(np.float32)  # [n]


def _wav_header_problem(head: bytes) -> str | None:
    """Name what is wrong in a RIFF/WAVE header's fmt chunk (both decoders only say "invalid")."""
    if head[:4] not in (b"RIFF", b"RF64") or head[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 16 <= len(head):
        size = int.from_bytes(head[pos + 4 : pos + 8], "little")
        if head[pos : pos + 4] == b"fmt ":
            rate = int.from_bytes(head[pos + 12 : pos + 16], "little")
            return None if 0 < rate <= MAX_SAMPLE_RATE else f"invalid sample rate {rate} Hz"
        pos += 8 + size + (size & 1)
    return None


def decode_audio(
    source: bytes | str | os.PathLike[str], *, max_seconds: float | None = None
) -> np.ndarray:
    """Decode an audio file (path or its bytes) to 16 kHz mono float32 in [-1, 1].

    With ``max_seconds``, raise AudioTooLongError for longer audio, or for audio over the
    decoding budget (max_seconds of stereo 48 kHz, see BUDGET_VALUES_PER_SECOND): before
    decoding when the header declares the duration, else as soon as decoding passes the limit.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        head, opener = data[:4096], partial(io.BytesIO, data)
    else:
        path = Path(source)
        if not path.is_file():
            raise AudioError(f"no such audio file: {path}")
        with path.open("rb") as fh:
            head, opener = fh.read(4096), partial(str, path)
    if not head:
        raise AudioError("audio is empty (0 bytes)")
    if problem := _wav_header_problem(head):
        raise AudioError(problem)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf are refused by name
        sniffed = head.startswith(_SOUNDFILE_MAGIC)
        audio = _decode_soundfile(opener(), max_seconds) if sniffed else None
        return _decode_pyav(opener(), max_seconds) if audio is None else audio


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
