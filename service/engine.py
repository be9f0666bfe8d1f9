"""The model's room on the server: one Pipeline, a few worker threads, a bounded queue.

A request is admitted (or refused with `Overloaded`), its audio decoded on a thread of its own
that ends with it (`in_passing_thread`: the OpenMP team of a thread that resampled, kept alive,
slowed every decoder step ~30 %), then its transcription generator runs on a decode worker
thread. Each event is shaped there (the caller's function, e.g. into a proto message) and
handed to the event loop through an asyncio queue, with a little backpressure. Cancelling the
consumer (client cancel, deadline, shutdown) closes the generator within one token. With
several workers the pipeline carries a StepBatcher (decode/step_batcher.py): the workers' model
work takes turns, and their cached decoder steps run as one batched forward.

A live stream (xattn.service.live) takes one admission slot for its whole duration (`admit_live`);
its decode steps run on a pool of their own, `live_workers` threads, so a long file on a decode
worker does not stall a live stream for minutes (the CPU is shared instead).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import numpy as np

from xattn.model.audio.features import decode_audio, to_16k
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import TokenEvent, WindowStart
from xattn.model.pipeline import Pipeline
from xattn.model.transcribe.sequential import Event
from xattn.service.decoders import DecoderProcesses

log = logging.getLogger(__name__)

T = TypeVar("T")
BUFFERED_EVENTS = 256  # shaped events a worker may run ahead of a slow consumer
_END = object()


@dataclass(frozen=True)
class Limits:
    max_audio_seconds: float = 1800.0
    workers: int = 1  # transcriptions running at once
    max_queue: int = 8  # admitted transcriptions waiting for a worker
    max_receive_message_bytes: int = 0  # reported only; the server enforces it
    max_send_message_bytes: int = 0
    max_live_seconds: float = 1800.0  # audio one live stream may send
    live_idle_timeout: float = 10.0  # seconds a live stream may send nothing
    # live decode steps run at once (each stream runs one at a time): two on 2 cores overlap
    # one stream's memory-bound decoder with another's encoder (benchmarks/streaming.py)
    live_workers: int = 2
    # encoded files decoded at once, each in a worker process (xattn.service.decoders); 0: on
    # the server's own threads, where a crash in FFmpeg or libsndfile ends the server
    decode_processes: int = 2


@dataclass
class Counters:
    """Transcriptions by outcome; a snapshot is a copy."""

    admitted: int = 0
    rejected: int = 0  # refused: queue full
    invalid: int = 0  # the audio could not be used
    started: int = 0  # reached a worker
    finished: int = 0
    cancelled: int = 0  # client cancel, deadline or shutdown (queued or running)
    failed: int = 0  # the model raised
    tokens_decoded: int = 0
    in_flight: int = 0  # admitted and not over: loading audio, queued or running
    live: int = 0  # live streams admitted (counted in the outcomes above too)


@dataclass
class Timings:
    """Wall-clock seconds of one transcription."""

    queue: float = 0.0
    audio: float = 0.0
    encode: float = 0.0
    decode: float = 0.0
    total: float = 0.0


class NotReady(RuntimeError):
    """The model is not loaded (yet, or any more)."""


class Overloaded(RuntimeError):
    """Every worker is busy and the queue is full."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class UnknownModel(OptionsError):
    """A request named a model this server does not have (INVALID_ARGUMENT)."""


class _Cancelled(Exception):
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
        self.claimed = False  # under the engine's lock: a worker took it, or it ended queued

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
            # the queued item holds no samples
            engine.pool_for(self.pipeline.name).submit(engine.work, self)
            submitted = True
            while (item := await self._queue.get()) is not _END:
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
                raise _Cancelled
        if self.cancelled.is_set():
            raise _Cancelled
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


class Engine:
    """Owns the Pipelines, one per model name (the first is the default); admits, queues, runs
    and counts transcriptions. Admission, the decode workers and batching are per model."""

    def __init__(self, limits: Limits, pipeline: Pipeline | None = None) -> None:
        self.limits = limits
        self._pipelines: dict[str, Pipeline] = {}
        self._in_flight: dict[str, int] = {}  # per model: admitted and not over
        self._lock = threading.Lock()
        self._counters = Counters()
        self._mean_seconds = 2.0  # moving average of a transcription's time, for retry hints
        workers = max(1, limits.workers)
        self.decode_pool = ThreadPoolExecutor(workers, thread_name_prefix="xattn-decode")
        self._pools: dict[str, ThreadPoolExecutor] = {}  # the first model's is decode_pool
        if pipeline is not None:
            self._add(self._batched(pipeline))
        live_workers = max(1, limits.live_workers)
        self.live_pool = ThreadPoolExecutor(live_workers, thread_name_prefix="xattn-live")
        self.decoders = None
        if limits.decode_processes > 0:
            self.decoders = DecoderProcesses(limits.decode_processes)

    def decode_audio(self, data: bytes, max_seconds: float | None = None) -> np.ndarray:
        """An encoded file's samples (xattn.model.audio.features.decode_audio), in a worker process
        unless `decode_processes` is 0; blocking."""
        if self.decoders is None:
            return decode_audio(data, max_seconds=max_seconds)
        return to_16k(*self.decoders.decode(data, max_seconds))

    @property
    def ready(self) -> bool:
        return bool(self._pipelines)

    @property
    def pipeline(self) -> Pipeline:
        """The default (first) model's pipeline."""
        return self.pipeline_for("")

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        """Every model's pipeline, the default first."""
        return tuple(self._pipelines.values())

    def pipeline_for(self, model: str) -> Pipeline:
        """The pipeline of the model named `model` ("" = the first); UnknownModel otherwise."""
        if not self._pipelines:
            raise NotReady("the model is still loading")
        if not model:
            return next(iter(self._pipelines.values()))
        pipe = self._pipelines.get(model)
        if pipe is None:
            names = ", ".join(self._pipelines)
            raise UnknownModel(f"model: unknown model {model!r} (this server has {names})")
        return pipe

    def pool_for(self, model: str) -> ThreadPoolExecutor:
        return self._pools[model]

    async def load(self, loader: Callable[[], Pipeline], warm_up: bool = True) -> Pipeline:
        """Load a model off the event loop, run one tiny decode, and start serving it (the
        first one loaded is the default)."""
        pipe = await in_passing_thread(loader)
        if pipe.name in self._pipelines:
            raise ValueError(f"two models are named {pipe.name!r}: rename one's directory")
        log.info("model %s: %s", pipe.name, pipe.summary())
        if warm_up:
            seconds = await in_passing_thread(pipe.warm_up)
            log.info("warmed up %s in %.2f s", pipe.name, seconds)
        pipe = await in_passing_thread(self._batched, pipe)  # packs the weights
        self._add(pipe)
        return pipe

    def _add(self, pipe: Pipeline) -> None:
        if self._pipelines:  # the first model's workers are decode_pool
            workers = max(1, self.limits.workers)
            prefix = f"xattn-decode-{len(self._pools)}"
            self._pools[pipe.name] = ThreadPoolExecutor(workers, thread_name_prefix=prefix)
        else:
            self._pools[pipe.name] = self.decode_pool
        self._in_flight[pipe.name] = 0
        self._pipelines[pipe.name] = pipe

    def _batched(self, pipe: Pipeline) -> Pipeline:
        """With several workers, their transcriptions' decoder steps run as one batch."""
        return pipe.batched(self.limits.workers) if self.limits.workers > 1 else pipe

    def counters(self) -> Counters:
        with self._lock:
            return Counters(**{f.name: getattr(self._counters, f.name) for f in fields(Counters)})

    def submit(
        self,
        load_audio: Callable[[], np.ndarray],
        options: DecodeOptions,
        shape: Callable[[Event], T | None],
        model: str = "",
    ) -> Run[T]:
        """Admit a transcription by `model` ("" = the first; Overloaded when that model is
        full); must run on the event loop."""
        pipe = self.pipeline_for(model)
        self._admit(pipe.name)
        return Run(self, load_audio, options, shape, pipe)

    def admit_live(self, model: str = "") -> LiveSlot:
        """Admit a live stream (Overloaded when full); it holds the slot until released."""
        name = self.pipeline_for(model).name
        self._admit(name, live=True)
        return LiveSlot(self, name)

    def _admit(self, model: str, live: bool = False) -> None:
        if not self.ready:
            raise NotReady("the model is still loading")
        capacity = max(1, self.limits.workers) + max(0, self.limits.max_queue)
        with self._lock:
            c = self._counters
            in_flight = self._in_flight[model]
            if in_flight >= capacity:
                c.rejected += 1
                waiting = in_flight - max(1, self.limits.workers) + 1
                retry = self._mean_seconds * waiting / max(1, self.limits.workers)
                retry_ms = int(min(60.0, max(0.1, retry)) * 1000)
                raise Overloaded(
                    f"server busy: {in_flight} transcriptions of {model} in flight "
                    f"({self.limits.workers} running, queue of {self.limits.max_queue} full); "
                    f"retry in about {retry_ms} ms",
                    retry_ms,
                )
            c.admitted += 1
            c.in_flight += 1
            self._in_flight[model] += 1
            if live:
                c.live += 1
                c.started += 1

    def end(self, run: Run | None, outcome: str, model: str = "") -> None:
        with self._lock:
            c = self._counters
            setattr(c, outcome, getattr(c, outcome) + 1)
            c.in_flight -= 1
            name = run.pipeline.name if run is not None else model
            if name in self._in_flight:
                self._in_flight[name] -= 1
            if outcome == "finished" and run is not None:
                seconds = time.perf_counter() - run.arrived
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds

    def unqueue(self, run: Run) -> None:
        """End (as cancelled) a run that no worker has taken yet; no-op once one has."""
        with self._lock:
            if run.claimed:
                return
            run.claimed, run.audio = True, None
        self.end(run, "cancelled")

    def work(self, run: Run) -> None:
        """Run one transcription on this (worker) thread."""
        run.times.queue = time.perf_counter() - run.queued_at
        with self._lock:
            if run.claimed:  # ended while queued (unqueue)
                return
            run.claimed = True
            audio, run.audio = run.audio, None
        if run.cancelled.is_set() or audio is None:
            self.end(run, "cancelled")
            return
        with self._lock:
            self._counters.started += 1
        outcome, events = "failed", None
        try:
            events = run.pipeline.transcribe(audio, run.options)
            while not run.cancelled.is_set():
                t0 = time.perf_counter()
                event = next(events, None)
                dt = time.perf_counter() - t0
                if event is None:
                    outcome = "finished"
                    break
                if isinstance(event, WindowStart):
                    run.times.encode += dt
                else:
                    run.times.decode += dt
                if isinstance(event, TokenEvent):
                    with self._lock:
                        self._counters.tokens_decoded += 1
                item = run.shape(event)
                if item is not None:
                    run.put(item)
            else:
                outcome = "cancelled"
        except _Cancelled:
            outcome = "cancelled"
        except Exception as e:
            log.exception("transcription failed")
            run.put_last(e)
        finally:
            if events is not None:
                events.close()
            self.end(run, outcome)
            run.put_last(_END)

    async def close(self) -> None:
        """Stop taking work; wait for the worker threads (call after in-flight RPCs end)."""
        batchers = [p.context.batcher for p in self._pipelines.values()]
        pools = [self.decode_pool, *(p for p in self._pools.values() if p is not self.decode_pool)]
        self._pipelines = {}
        for pool in (*pools, self.live_pool):
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        for batcher in batchers:  # after the workers: none of them waits on it any more
            if batcher is not None:
                await asyncio.to_thread(batcher.close)
        if self.decoders is not None:
            await asyncio.to_thread(self.decoders.close)

