"""Why admission refuses a new request of a model (`Overloaded`, with a retry hint).

A file transcription is refused when its model has workers + max_queue transcriptions in
flight (live streams included: each holds a slot), or when the queue ahead of it would keep it
waiting longer than `max_queue_wait`: the model time of the windows queued and of the files
whose audio is still being read. Live streams hold no windows of that queue (their steps take
their turns in rounds beside it), so they are not counted in its wait; their own capacity is
xattn.service.engine.live_admission's.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

from xattn.model.pipeline import Pipeline
from xattn.service.engine.capacity import WaitEstimate


class ModelLoad(Protocol):
    """What the refusal reads of a model's serving state (the engine's, under its lock)."""

    pipe: Pipeline
    workers: int
    estimate: WaitEstimate
    in_flight: int  # admitted and not over, live streams included
    running: int
    live: int
    queued: Sized

    def windows_queued(self) -> int: ...


class Overloaded(RuntimeError):
    """The model is full: its queue, its queue's wait, or its live capacity (`reason`: a value
    of observe.REFUSALS); `retry_after_ms`: when to try again."""

    def __init__(self, message: str, retry_after_ms: int, reason: str = "queue_full") -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms
        self.reason = reason


def overloaded(why: str, retry_seconds: float, reason: str = "queue_full") -> Overloaded:
    """Overloaded with the hint in its message too (within 0.1-60 s)."""
    retry_ms = int(min(60.0, max(0.1, retry_seconds)) * 1000)
    return Overloaded(f"server busy: {why}; retry in about {retry_ms} ms", retry_ms, reason)


def refusal(m: ModelLoad, max_queue: int, bound: float, live: bool) -> Overloaded | None:
    """Why a new request of model `m` (`live`: a live stream) is refused by the file path's
    bounds (`max_queue`, the queue wait's `bound` in seconds) now (None: admitted); under the
    engine's lock."""
    spw = m.estimate.seconds_per_window
    limit = m.workers + max(0, max_queue)
    if m.in_flight >= limit:
        retry = m.estimate.wait(max(1, len(m.queued)) / m.workers) + spw
        return overloaded(
            f"{m.in_flight} transcriptions of {m.pipe.name} in flight ({m.workers} "
            f"decoding, queue of {max_queue} full)",
            retry,
        )
    loading = m.in_flight - m.live - m.running - len(m.queued)  # files' audio being read
    if live or m.running + len(m.queued) + loading < m.workers:
        return None  # a worker is free for it
    wait = m.estimate.wait(m.windows_queued() + loading)
    if wait <= bound:
        return None
    return overloaded(
        f"the {len(m.queued)} transcriptions queued for {m.pipe.name} would keep this one "
        f"waiting about {wait:.0f} s (the bound is {bound:g} s)",
        wait - bound + spw,
        "queue_wait",
    )
