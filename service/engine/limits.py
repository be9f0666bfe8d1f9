"""A server's limits (Limits: sizes, queues, timeouts, the live steps' settings) and the live
stream options they imply (`live_defaults`), read by the engine and by every face."""

from __future__ import annotations

from dataclasses import dataclass

from xattn.model.live.types import LiveOptions
from xattn.model.live.window import SHORT_BUFFER

# beams of a live step's decode by default: greedy. 5 (--live-beam-size 5, a stream's
# LivePolicy.beam_size) reads the words a file's beam-5 transcript reads where greedy loses
# 6-9 pp on generated speech, and costs a live step's decoder ~5 rows (docs/live.md)
LIVE_BEAMS = 1


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float = 1800.0
    # transcriptions decoded at once, their steps batched; 0: as many as the memory budget
    # holds (xattn.service.engine.capacity.auto_workers), at most 16; N > 0 caps it at N
    workers: int = 0
    max_queue: int = 64  # admitted transcriptions waiting for a worker, at most
    max_queue_wait: float = 30.0  # refuse when the queue ahead would take longer (seconds)
    memory_budget_mb: float = 0.0  # for the requests in flight; 0: half the available memory
    max_receive_message_bytes: int = 0  # reported only; the server enforces it
    max_send_message_bytes: int = 0
    max_live_seconds: float = 1800.0  # audio one live stream may send
    live_idle_timeout: float = 10.0  # seconds a live stream may send nothing
    # live decode steps in flight (each stream runs one at a time); their model work takes
    # turns on the model thread, their decoder steps join the batch
    live_workers: int = 8
    live_lag_target: float = 1.0  # seconds: live streams admitted while rounds fit in it
    max_live_streams: int = 0  # live streams at once; 0: as measured (live_admission)
    # the encoder's precision in live steps (AudioEncoder.PRECISIONS; None: the model's compute)
    live_precision: str | None = None
    # seconds of margin a live step's short window encodes (LiveOptions.encode_margin; None:
    # the whole 30 s window), over a buffer of at most SHORT_BUFFER s
    live_margin: float | None = None
    live_beam_size: int = LIVE_BEAMS  # beams of a live step's decode (LiveOptions.beam_size)
    # encoded files decoded at once, each in a worker process (xattn.service.engine.decoders); 0: on
    # the server's own threads, where a crash in FFmpeg or libsndfile ends the server
    decode_processes: int = 2


def live_defaults(limits: Limits) -> LiveOptions:
    """A live stream's options on a server with these limits, before its own policy."""
    short = limits.live_margin is not None
    return LiveOptions(
        precision=limits.live_precision,
        encode_margin=limits.live_margin,
        max_buffer=SHORT_BUFFER if short else LiveOptions.max_buffer,
        beam_size=limits.live_beam_size,
    )
