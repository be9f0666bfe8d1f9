"""One admitted transcription (`Run`) and one live stream's admission slot (`LiveSlot`).

A run's audio is decoded on a thread of its own that ends with it (`in_passing_thread`: the
OpenMP team of a thread that resampled, kept alive, slowed every decoder step ~30 %), then it
waits in its model's queue for a decode worker (xattn.service.engine.engine). Each event is
shaped on the worker (the caller's function, e.g. into a proto message) and handed to the event loop
through an asyncio queue, with a little backpressure. Cancelling the consumer (client cancel,
deadline, shutdown) closes the generator within one token: its decoder steps leave the running
batch at the next step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Generic, Protocol, TypeVar

import numpy as np

from xattn.model.decode.decoding import DecodeOptions
from xattn.model.pipeline import Pipeline
from xattn.model.transcribe.sequential import Event


class Engine(Protocol):
    """What a run and a slot need of their engine (xattn.service.engine.engine.Engine)."""

    def enqueue(self, run: Run) -> None: ...
    def end(self, run: Run | None, outcome: str, model: str = "") -> None: ...
    def unqueue(self, run: Run) -> None: ...


T = TypeVar("T")
BUFFERED_EVENTS = 256  # shaped events a worker may run ahead of a slow consumer
END = object()


@dataclass
class Timings:
    """Wall-clock seconds of one transcription."""

    queue: float = 0.0
    audio: float = 0.0
    encode: float = 0.0
    decode: float = 0.0
    total: float = 0.0


class Cancelled(Exception):
    pass


class Run(Generic[T]):
    """One admitted transcription: iterate `events()`, then read `timings()`."""

    def __init__(
        self,
        engine: Engine,
        load_audio: Callable[[], np.ndarray],
        options: DecodeOptions,
        shape: Callable[[Event], T | None],
        pipeline: Pipeline,
    ) -> None:
        self._engine = engine
        self.pipeline = pipeline  # the model this request asked for
        self._load_audio = load_audio
        self.options = options
        self.shape = shape
        self.arrived = time.perf_counter()
        self.queued_at = self.arrived
        self.times = Timings()
        self.cancelled = threading.Event()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._space = threading.Semaphore(BUFFERED_EVENTS)
        self._done = False
        self._started = False  # events() was entered (it ends the run however it ends)
        self.audio: np.ndarray | None = None  # decoded, waiting for a worker
        self.windows = 1  # 30 s windows of its audio, once decoded (the queue's wait)
        self.bytes = 0  # the memory it holds on a worker (xattn.service.engine.capacity)
        self.claimed = False  # under the engine's lock: handed to a worker, or ended queued

    def timings(self) -> Timings:
        if not self._done:
            self.times.total = time.perf_counter() - self.arrived
        return Timings(**{f.name: getattr(self.times, f.name) for f in fields(Timings)})

    async def events(self) -> AsyncIterator[T]:
        """The shaped events; raises what the audio loader or the model raised."""
        engine, submitted = self._engine, False
        self._started = True
        try:
            t0 = time.perf_counter()
            self.audio = await in_passing_thread(self._load_audio)  # its torch (resampling) too
            self.queued_at = time.perf_counter()
            self.times.audio = self.queued_at - t0
            engine.enqueue(self)  # the queued item holds no samples
            submitted = True
            while (item := await self._queue.get()) is not END:
                self._space.release()
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
            self.timings()
            self._done = True
        except BaseException as e:
            if not submitted:
                engine.end(self, "cancelled" if _is_cancel(e) else "invalid")
            else:
                engine.unqueue(self)  # still queued: free its slot now, not when a worker comes
            raise
        finally:
            self.cancelled.set()  # the worker, if still running, stops within one token

    def abandon(self) -> None:
        """End a run whose events() was never entered (its consumer went away first)."""
        if not self._started:
            self._started = True
            self._engine.end(self, "cancelled")

    # called on the worker thread
    def put(self, item: object) -> None:
        while not self._space.acquire(timeout=0.05):
            if self.cancelled.is_set():
                raise Cancelled
        if self.cancelled.is_set():
            raise Cancelled
        self.put_last(item)

    def put_last(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening
            self.cancelled.set()


class LiveSlot:
    """One live stream's admission slot; `release(outcome)` exactly once (later calls no-op)."""

    def __init__(self, engine: Engine, model: str) -> None:
        self._engine = engine
        self.model = model
        self._released = False
        self._lock = threading.Lock()

    def release(self, outcome: str) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._engine.end(None, outcome, self.model)


def _is_cancel(e: BaseException) -> bool:
    return isinstance(e, asyncio.CancelledError | GeneratorExit)


async def in_passing_thread(fn: Callable[..., T], *args: object) -> T:
    """fn(*args) on a thread that ends with it. Torch's OpenMP team belongs to the thread that
    calls it and lives as long as that thread: with a second team alive (here, the one that
    loaded the model) libgomp counts more threads than cores and stops spinning between
    ops, and every later decoder step paid for waking its threads (jfk as 16 kHz WAV through
    the server, greedy: 0.48 s with the loading thread kept, 0.34 without; beam 5: 0.62 and
    0.45). Once this thread ends, its team is gone. Used for loading a model and decoding a
    request's audio (whose resampling runs torch)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="xattn-passing")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    finally:
        pool.shutdown(wait=False)  # its thread ends when fn returns; the loop never waits
