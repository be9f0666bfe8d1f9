"""Audio files to mono samples at their own rate, checked and bounded: libsndfile for
WAV/FLAC/OGG/AIFF, which is exact for 16/24-bit PCM, PyAV (FFmpeg) for everything else (MP3,
M4A, ...); channels averaged. Without torch: the server decodes untrusted files in worker
processes of this module's size (xattn.service.engine.decoders); xattn.model.audio.features
resamples.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
from functools import partial
from pathlib import Path

import av
import numpy as np
import soundfile as sf

log = logging.getLogger(__name__)

MAX_SAMPLE_RATE = 384_000
MAX_CHANNELS = 32
# libsndfile reads these exactly (24-bit included); anything else (MP3, AAC, ...) goes to PyAV
_SOUNDFILE_MAGIC = (b"RIFF", b"RF64", b"riff", b"fLaC", b"OggS", b"FORM", b"caff")
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


def _decode_soundfile(src: object, max_seconds: float | None) -> tuple[np.ndarray, int] | None:
    """Decode with libsndfile: mono samples and their rate; None when it cannot open the
    input."""
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
    return _joined(chunks), rate


def _decode_pyav(src: object, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Decode with PyAV (FFmpeg): mono samples and their rate."""
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
    return _joined(chunks), rate


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


def _joined(chunks: list[np.ndarray]) -> np.ndarray:
    if not chunks:
        raise AudioError("audio is empty (0 samples)")
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)  # [n]


def decode_native(
    source: bytes | str | os.PathLike[str], *, max_seconds: float | None = None
) -> tuple[np.ndarray, int]:
    """An audio file (path or its bytes) as mono float32 samples at its own rate, and the rate
    (xattn.model.audio.features.decode_audio's limits and errors, before resampling)."""
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
        decoded = _decode_soundfile(opener(), max_seconds) if sniffed else None
        return _decode_pyav(opener(), max_seconds) if decoded is None else decoded
