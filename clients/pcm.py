"""Raw PCM from a live source (a pipe, a microphone, the browser) as the chunks a live
stream sends: 16 kHz mono little-endian int16.

    chunks = PcmQueue(PcmFormat(rate=44100, channels=2, sample="f32le"))
    read_pipe(sys.stdin.buffer.fileno(), chunks)     # a thread: put() ... end()
    for event in stream_chunks(client, chunks): ...  # xattn.clients.streaming

Producers `put` raw bytes in the source's format from any thread; iterating takes what has
arrived (at most MAX_CHUNK_SECONDS at a time), converted, until `end()` or `stop`.
Resampling is PyAV's (libswresample), stateful across chunks.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import av
import numpy as np

log = logging.getLogger(__name__)

RATE = 16000  # what a live stream sends
SAMPLES = {"s16le": ("<i2", "s16"), "f32le": ("<f4", "flt")}  # numpy dtype, PyAV format
MAX_CHANNELS = 8
MAX_CHUNK_SECONDS = 1.0  # one request's audio at most (a fast pipe sends many)
POLL_SECONDS = 0.1  # how often a waiting iterator looks at `stop`


class SourceError(ValueError):
    """A live source that cannot be used: a bad format, no microphone (usage: exit 2)."""


class PcmFormatError(SourceError):
    """A source format this client cannot convert."""


@dataclass(frozen=True)
class PcmFormat:
    """Raw interleaved little-endian samples: `rate` Hz, `channels`, `sample` s16le|f32le."""

    rate: int = RATE
    channels: int = 1
    sample: str = "s16le"

    def __post_init__(self) -> None:
        if self.sample not in SAMPLES:
            raise PcmFormatError(f"--format must be one of {sorted(SAMPLES)}, not {self.sample}")
        if not 1000 <= self.rate <= 384000:
            raise PcmFormatError(f"--rate must be 1000..384000 Hz, not {self.rate}")
        if not 1 <= self.channels <= MAX_CHANNELS:
            raise PcmFormatError(f"--channels must be 1..{MAX_CHANNELS}, not {self.channels}")

    @property
    def frame_bytes(self) -> int:
        return (2 if self.sample == "s16le" else 4) * self.channels

    @property
    def native(self) -> bool:
        """Already what a live stream sends."""
        return self == PcmFormat()


class PcmConverter:
    """Bytes in `fmt` -> 16 kHz mono int16 bytes; keeps a partial frame for the next call."""

    def __init__(self, fmt: PcmFormat) -> None:
        self.fmt = fmt
        self._rest = b""
        self._resampler = (
            None if fmt.rate == RATE else av.AudioResampler(format="s16", layout="mono", rate=RATE)
        )

    def __call__(self, data: bytes) -> bytes:
        data = self._rest + data
        whole = len(data) - len(data) % self.fmt.frame_bytes
        data, self._rest = data[:whole], data[whole:]
        if not data or self.fmt.native:
            return data
        dtype, _ = SAMPLES[self.fmt.sample]
        x = np.frombuffer(data, dtype).reshape(-1, self.fmt.channels)  # [n, channels]
        mono = x.astype(np.float32).mean(axis=1)  # [n]
        if self.fmt.sample == "f32le":
            mono = np.clip(mono, -1.0, 1.0) * 32767.0
        else:
            mono = np.round(mono)
        pcm = mono.astype("<i2")  # [n]
        if self._resampler is None:
            return pcm.tobytes()
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")  # [1, n]
        frame.sample_rate = self.fmt.rate
        return b"".join(_s16(f) for f in self._resampler.resample(frame))

    def flush(self) -> bytes:
        """What the resampler still holds (at the end of the source)."""
        if self._resampler is None:
            return b""
        return b"".join(_s16(f) for f in self._resampler.resample(None))


def _s16(frame: av.AudioFrame) -> bytes:
    return frame.to_ndarray().astype("<i2").tobytes()  # packed mono s16: [1, n]


_END = object()


class PcmQueue:
    """Raw audio in from producer threads; 16 kHz mono int16 chunks out, in order.

    Iteration ends after `end()` (with everything put before it) or once `stop` is set
    (with what had arrived: Ctrl-C keeps the audio heard so far)."""

    def __init__(self, fmt: PcmFormat = PcmFormat(), stop: threading.Event | None = None) -> None:
        self.fmt = fmt
        self.stop = stop or threading.Event()
        self._convert = PcmConverter(fmt)
        self._queue: queue.SimpleQueue[bytes | object] = queue.SimpleQueue()
        self.received = 0  # raw bytes put
        self.sent = 0  # converted bytes yielded

    def put(self, data: bytes) -> None:
        self.received += len(data)
        self._queue.put(bytes(data))

    def end(self) -> None:
        self._queue.put(_END)

    @property
    def sent_seconds(self) -> float:
        return self.sent / 2 / RATE

    def __iter__(self) -> Iterator[bytes]:
        limit = int(MAX_CHUNK_SECONDS * RATE) * 2
        ended = False
        while not ended:
            parts, ended = self._take()
            out = self._convert(b"".join(parts)) + (self._convert.flush() if ended else b"")
            for at in range(0, len(out), limit):
                self.sent += len(out[at : at + limit])
                yield out[at : at + limit]

    def _take(self) -> tuple[list[bytes], bool]:
        """What has arrived (waiting for at least one piece) and whether the source ended."""
        while not self.stop.is_set():
            try:
                item = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if item is _END:
                return [], True
            parts, ended = self._drain([item])  # type: ignore[list-item]
            return parts, ended or self.stop.is_set()
        return self._drain([])[0], True

    def _drain(self, parts: list[bytes]) -> tuple[list[bytes], bool]:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return parts, False
            if item is _END:
                return parts, True
            parts.append(item)  # type: ignore[arg-type]


def read_pipe(fd: int, chunks: PcmQueue, block: int = 1 << 16) -> threading.Thread:
    """Start a daemon thread that puts what `fd` delivers into `chunks`, then ends it."""

    def pump() -> None:
        try:
            while data := os.read(fd, block):
                chunks.put(data)
        except OSError as e:
            log.warning("reading the audio pipe failed: %s", e)
        finally:
            chunks.end()

    thread = threading.Thread(target=pump, name="xattn-pipe", daemon=True)
    thread.start()
    return thread
