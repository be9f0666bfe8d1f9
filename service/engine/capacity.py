"""How many transcriptions a server decodes at once, and how long a new one would wait.

Every admitted transcription decodes on a worker thread of its own, and every worker's model
work runs on one model thread (xattn.model.decode.step_batcher): its cached decoder steps join
the running batch as soon as its window is encoded and leave it when the window ends. Running
more of them at once reads the decoder's weights once for more rows; what bounds the number is
memory, since each holds its audio, its log-mel and its window's caches (`request_bytes`):

    audio        4 B × 16,000 a second (float32 samples, the whole file)
    log-mel      4 B × n_mels × 100 a second
    cross K/V    4 B × 2 × n_text_layer × 1,500 × d (one window's, shared by its rows)
    self K/V     4 B × 2 × n_text_layer × rows × 448 × d (448 = n_text_ctx, preallocated)
    encoder out  4 B × 1,500 × d

with rows = max(beam_size, best_of) (5 by default). tiny.en, beam 5: 1.9 MB + 1.0 + 18.4 +
27.5 + 2.3 = 51 MB for a 30 s clip; 283 MB for a 30-minute file. base: 97 MB and 336 MB.
`auto_workers` fits the workers to a memory budget (`--memory-budget-mb`; by default half of
the memory available when the model has loaded) for 30 s clips, at most MAX_WORKERS; and the
engine hands a queued transcription to a worker only while the budget holds its own bytes
(one always runs), so long files decode a few at a time and clips many.

The model thread is the one server of all that work, so a new request's wait is the model
time of the windows queued ahead of it (`WaitEstimate`: model seconds per window, measured as
the model thread's busy time over the windows it finished).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path

from xattn.model.net.dims import ModelDims

SAMPLE_RATE = 16000
FRAMES_PER_SECOND = 100  # log-mel frames
WINDOW_SECONDS = 30.0
MAX_WORKERS = 16
MB = 1 << 20


@dataclass(frozen=True)
class RequestMemory:
    """Bytes one transcription in flight holds, by part."""

    audio: int
    mel: int
    cross_kv: int
    self_kv: int
    features: int

    @property
    def total(self) -> int:
        return self.audio + self.mel + self.cross_kv + self.self_kv + self.features


def request_bytes(dims: ModelDims, audio_seconds: float, rows: int = 5) -> RequestMemory:
    """The memory of one transcription of `audio_seconds` decoding `rows` rows at once."""
    d, layers = dims.n_text_state, dims.n_text_layer
    return RequestMemory(
        audio=int(4 * SAMPLE_RATE * audio_seconds),
        mel=int(4 * dims.n_mels * FRAMES_PER_SECOND * (audio_seconds + WINDOW_SECONDS)),
        cross_kv=4 * 2 * layers * dims.n_audio_ctx * d,  # a window's 1,500 frames
        self_kv=4 * 2 * layers * rows * dims.n_text_ctx * d,
        features=4 * dims.n_audio_ctx * dims.n_audio_state,
    )


def available_memory() -> int:
    """Bytes this process may still use: MemAvailable, or less under a cgroup's limit."""
    free = _meminfo("MemAvailable") or _meminfo("MemTotal") or 8 << 30
    limit = _cgroup_room()
    return min(free, limit) if limit is not None else free


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_room() -> int | None:
    """A cgroup v2 (or v1) memory limit minus what the cgroup already uses, if one is set."""
    pairs = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_file, usage_file in pairs:
        try:
            raw = Path(limit_file).read_text().strip()
            if raw == "max" or int(raw) >= 1 << 60:
                return None
            return max(0, int(raw) - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def auto_workers(
    dims: ModelDims, max_audio_seconds: float, budget: int, cap: int = MAX_WORKERS
) -> int:
    """Transcriptions decoded at once: as many as `budget` bytes hold at the longest audio
    (at least 1, at most `cap`)."""
    each = request_bytes(dims, max_audio_seconds).total
    return max(1, min(cap, budget // each))


def default_budget() -> int:
    """Half of the memory available now."""
    return available_memory() // 2


def windows_of(samples: int) -> int:
    """30 s windows a file of `samples` 16 kHz samples takes (at least 1)."""
    return max(1, math.ceil(samples / (SAMPLE_RATE * WINDOW_SECONDS)))


class WaitEstimate:
    """Model seconds per window, an average over the windows finished (thread-safe)."""

    def __init__(self, seconds_per_window: float) -> None:
        self.seconds_per_window = seconds_per_window
        self._lock = threading.Lock()
        self._busy = 0.0  # the model thread's busy seconds at the last update
        self._windows = 0  # windows finished by then

    def update(self, busy: float, windows: int) -> None:
        """The model thread's busy seconds and the windows finished, both since the start:
        the average moves toward the busy time per window since the last update."""
        with self._lock:
            dw, db = windows - self._windows, busy - self._busy
            if dw <= 0 or db < 0:
                return
            self._busy, self._windows = busy, windows
            self.seconds_per_window = 0.7 * self.seconds_per_window + 0.3 * db / dw

    def wait(self, windows_ahead: float) -> float:
        """Seconds until the model thread reaches work queued behind `windows_ahead` windows."""
        return windows_ahead * self.seconds_per_window
