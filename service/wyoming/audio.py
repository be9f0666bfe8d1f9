"""Wyoming's raw audio -> what the engine takes.

An `audio-start` names the format of the audio that follows: `rate` (samples per second per
channel), `width` (bytes per sample: 1 is unsigned 8-bit, as in WAV and as the `wyoming`
library's converter reads it; 2, 3 and 4 are signed little-endian integers) and `channels`
(interleaved, mixed down to mono). Every rate the engine reads is taken (1 Hz .. 384 kHz).

Two paths, both the project's own resamplers:
- batch: the command's bytes as one `pb.Pcm` (int16 for widths 1 and 2, float32 for 3 and 4),
  decoded by the engine exactly as gRPC `Transcribe` decodes the same Pcm (`engine_pcm`);
- streamed: each chunk mixed down and resampled to 16 kHz as it arrives (`StreamConverter`,
  xattn.model.audio.resample: equal, to float rounding, to resampling the whole command).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xattn.model.audio.containers import MAX_CHANNELS, MAX_SAMPLE_RATE
from xattn.model.audio.features import SAMPLE_RATE, AudioError, pcm_to_audio
from xattn.model.audio.resample import StreamResampler
from xattn.v1 import transcriber_pb2 as pb

WIDTHS = (1, 2, 3, 4)  # bytes per sample the protocol's converter handles (audioop's)


@dataclass(frozen=True)
class PcmFormat:
    """The format an audio-start names (and every chunk after it repeats)."""

    rate: int
    width: int
    channels: int

    @property
    def frame_bytes(self) -> int:
        return self.width * self.channels

    def seconds(self, n_bytes: int) -> float:
        return n_bytes / (self.frame_bytes * self.rate)

    def check(self, data: bytes) -> None:
        """AudioError unless `data` is whole frames of this format."""
        if len(data) % self.frame_bytes:
            raise AudioError(
                f"audio-chunk of {len(data)} bytes is not whole samples: width {self.width} x "
                f"{self.channels} channel(s) takes {self.frame_bytes} bytes per sample"
            )


def pcm_format(rate: object, width: object, channels: object) -> PcmFormat:
    """An audio event's format (AudioError naming the field the server cannot take)."""
    for name, value in (("rate", rate), ("width", width), ("channels", channels)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise AudioError(f"audio {name} must be an integer, not {value!r}")
    assert isinstance(rate, int) and isinstance(width, int) and isinstance(channels, int)
    if not 0 < rate <= MAX_SAMPLE_RATE:
        raise AudioError(f"audio rate must be 1..{MAX_SAMPLE_RATE} Hz, not {rate}")
    if width not in WIDTHS:
        raise AudioError(f"audio width must be 1, 2, 3 or 4 bytes, not {width}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"audio channels must be 1..{MAX_CHANNELS}, not {channels}")
    return PcmFormat(rate, width, channels)


def engine_pcm(fmt: PcmFormat, data: bytes) -> tuple[bytes, int]:
    """Whole frames of `fmt` as the engine's PCM: (bytes, pb.PcmEncoding). Widths 1 and 2
    become int16 and 3 becomes float32 without loss; 4 (32-bit) becomes float32, rounded
    to its 24-bit mantissa (below what any microphone resolves)."""
    if fmt.width == 2:
        return data, pb.PCM_ENCODING_INT16
    if fmt.width == 1:
        u8 = np.frombuffer(data, np.uint8)  # [n * channels], 128 is silence
        return ((u8.astype(np.int16) - 128) << 8).astype("<i2").tobytes(), pb.PCM_ENCODING_INT16
    if fmt.width == 3:
        b = np.frombuffer(data, np.uint8).reshape(-1, 3)  # [n * channels, 3] little-endian
        i32 = (b[:, 0].astype(np.int32) | b[:, 1].astype(np.int32) << 8) | (
            b[:, 2].astype(np.int8).astype(np.int32) << 16  # the top byte carries the sign
        )
        return (i32.astype(np.float32) / 2.0**23).astype("<f4").tobytes(), pb.PCM_ENCODING_FLOAT32
    i32 = np.frombuffer(data, "<i4")
    return (i32.astype(np.float32) / 2.0**31).astype("<f4").tobytes(), pb.PCM_ENCODING_FLOAT32


def batch_pcm(fmt: PcmFormat, data: bytes) -> pb.Pcm:
    """A whole command's audio as the Pcm a gRPC Transcribe of it sends."""
    pcm, encoding = engine_pcm(fmt, data)
    return pb.Pcm(data=pcm, sample_rate=fmt.rate, encoding=encoding, channels=fmt.channels)


_ENCODINGS = {pb.PCM_ENCODING_INT16: "int16", pb.PCM_ENCODING_FLOAT32: "float32"}


class StreamConverter:
    """A command's chunks, as they arrive -> 16 kHz mono float32 bytes (a live stream's
    audio_content); `flush()` gives the rest at audio-stop."""

    def __init__(self, fmt: PcmFormat) -> None:
        self.fmt = fmt
        self._resampler = StreamResampler(fmt.rate) if fmt.rate != SAMPLE_RATE else None

    def feed(self, data: bytes) -> bytes:
        self.fmt.check(data)
        if not data:
            return b""
        pcm, encoding = engine_pcm(self.fmt, data)
        # mixed down and clipped as the engine mixes a Pcm; the rate is left as it is here
        mono = pcm_to_audio(pcm, SAMPLE_RATE, _ENCODINGS[encoding], self.fmt.channels)  # [n]
        if self._resampler is not None:
            mono = self._resampler.feed(mono)  # [n * 16000 / rate]
        return _f32(mono)

    def flush(self) -> bytes:
        return _f32(self._resampler.flush()) if self._resampler is not None else b""


def _f32(x: np.ndarray) -> bytes:
    return np.clip(x, -1.0, 1.0).astype("<f4").tobytes()
