"""The model's room on the server: its Pipelines, their decode workers, a bounded queue.

A request is admitted (or refused with `Overloaded`), its audio decoded on a thread of its own
(xattn.service.engine.run), then its transcription generator runs on a decode worker thread of its
model. Continuous batching is the only path: every model's pipeline carries a StepBatcher
(xattn.model.decode.step_batcher), so each worker's model work (log-mel, encoder, cross K/V)
runs on the model's one model thread, taking turns with the others', and its cached decoder
steps (a beam search's beams are rows too) join the running batch as soon as its window is
encoded and leave it when the window ends. Windows of different requests interleave there, so
a long file does not hold a short request up for its whole duration.

How many decode at once adapts to the machine (xattn.service.engine.capacity: the memory budget over
each request's bytes, at most MAX_WORKERS; `--workers` caps it). Admission refuses when the
work queued ahead would keep a new request waiting longer than `max_queue_wait` (or the queue
holds `max_queue`), with a retry hint from the measured model time per window.

A live stream (xattn.service.engine.live) takes one admission slot for its whole duration
(`admit_live`: at most the model's live capacity, xattn.service.engine.live_admission); its
steps run in rounds (xattn.service.engine.live_rounds) on `live_workers` threads of their own
and their model work on the same model thread, so live decode steps share the batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields

import numpy as np

from xattn.model.audio.features import decode_audio, to_16k
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import TokenEvent, Transcript, WindowStart
from xattn.model.pipeline import Pipeline
from xattn.model.transcribe.sequential import Event
from xattn.service.engine import capacity
from xattn.service.engine.decoders import DecoderProcesses
from xattn.service.engine.limits import Limits, live_defaults
from xattn.service.engine.live_admission import LiveAdmission, measure_step
from xattn.service.engine.live_rounds import LiveRounds
from xattn.service.engine.observe import NULL, Observer, current_request, decoding_of
from xattn.service.engine.refusal import Overloaded, overloaded, refusal
from xattn.service.engine.run import END, Cancelled, LiveSlot, Run, T, Timings, in_passing_thread
from xattn.service.engine.timeline import Timeline

__all__ = ["Engine", "Limits", "LiveSlot", "NotReady", "Overloaded", "Run", "Timings"]
__all__ += ["UnknownModel", "Counters", "Event", "in_passing_thread"]

log = logging.getLogger(__name__)

WINDOW_AUDIO = 30.0  # seconds: the audio `auto_workers` sizes the workers for (one window)


@dataclass
class Counters:
    """Transcriptions by outcome; a snapshot is a copy."""

    admitted: int = 0
    rejected: int = 0  # refused: the queue full, or its wait over max_queue_wait
    invalid: int = 0  # the audio could not be used
    started: int = 0  # reached a worker
    finished: int = 0
    cancelled: int = 0  # client cancel, deadline or shutdown (queued or running)
    failed: int = 0  # the model raised
    tokens_decoded: int = 0
    windows: int = 0  # windows encoded for transcriptions (a seek after an open segment too)
    in_flight: int = 0  # admitted and not over: loading audio, queued or running
    live: int = 0  # live streams admitted (counted in the outcomes above too)
    queued: int = 0  # now: audio decoded, waiting for a worker
    running: int = 0  # now: on a worker


@dataclass
class _Model:
    """One model's serving state (under the engine's lock)."""

    pipe: Pipeline
    pool: ThreadPoolExecutor
    workers: int
    estimate: capacity.WaitEstimate
    budget: int  # bytes the transcriptions on workers may hold (capacity.request_bytes)
    admission: LiveAdmission  # its live capacity
    rounds: LiveRounds  # its live streams' steps
    in_flight: int = 0  # admitted and not over
    running: int = 0  # handed to a worker
    live: int = 0  # live streams admitted and not over (in in_flight too)
    held: int = 0  # bytes the running ones hold
    queued: deque[Run] = field(default_factory=deque)  # audio decoded, in order of arrival
    windows_done: int = 0

    def windows_queued(self) -> int:
        return sum(r.windows for r in self.queued)


class NotReady(RuntimeError):
    """The model is not loaded (yet, or any more)."""


class UnknownModel(OptionsError):
    """A request named a model this server does not have (INVALID_ARGUMENT)."""


class Engine:
    """Owns the Pipelines, one per model name (the first is the default); admits, queues, runs
    and counts transcriptions. Admission, the decode workers and batching are per model."""

    def __init__(self, limits: Limits, pipeline: Pipeline | None = None) -> None:
        self.limits = limits
        self.observer: Observer = NULL  # told what happens; the process sets its own (observe)
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()
        self._counters = Counters()
        live_workers = max(1, limits.live_workers)  # before _add: a model's rounds use it
        self.live_pool = ThreadPoolExecutor(live_workers, thread_name_prefix="xattn-live")
        if pipeline is not None:
            self._add(self._batched(pipeline))
        self.decoders = None
        if limits.decode_processes > 0:
            self.decoders = DecoderProcesses(limits.decode_processes)

    def decode_audio(self, data: bytes, max_seconds: float | None = None) -> np.ndarray:
        """An encoded file's samples (xattn.model.audio.features.decode_audio), in a worker
        process unless `decode_processes` is 0; blocking."""
        if self.decoders is None:
            return decode_audio(data, max_seconds=max_seconds)
        return to_16k(*self.decoders.decode(data, max_seconds))

    @property
    def ready(self) -> bool:
        return bool(self._models)

    @property
    def pipeline(self) -> Pipeline:
        """The default (first) model's pipeline."""
        return self.pipeline_for("")

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        """Every model's pipeline, the default first."""
        return tuple(m.pipe for m in self._models.values())

    def pipeline_for(self, model: str) -> Pipeline:
        """The pipeline of the model named `model` ("" = the first); UnknownModel otherwise."""
        if not self._models:
            raise NotReady("the model is still loading")
        if not model:
            return next(iter(self._models.values())).pipe
        m = self._models.get(model)
        if m is None:
            names = ", ".join(self._models)
            raise UnknownModel(f"model: unknown model {model!r} (this server has {names})")
        return m.pipe

    def workers_for(self, model: str = "") -> int:
        """Transcriptions of `model` ("" = the first) decoded at once."""
        return self._models[self.pipeline_for(model).name].workers

    async def load(self, loader: Callable[[], Pipeline], warm_up: bool = True) -> Pipeline:
        """Load a model off the event loop, run one tiny decode, and start serving it (the
        first one loaded is the default)."""
        pipe = await in_passing_thread(loader)
        if pipe.name in self._models:
            raise ValueError(f"two models are named {pipe.name!r}: rename one's directory")
        log.info("model %s: %s", pipe.name, pipe.summary())
        seconds = 0.0
        if warm_up:
            seconds = await in_passing_thread(pipe.warm_up)
            log.info("warmed up %s in %.2f s", pipe.name, seconds)
        step = 0.0  # a live step timed: the live capacity (unless --max-live-streams)
        if warm_up and self.limits.max_live_streams <= 0:
            limits = self.limits
            step = await in_passing_thread(measure_step, pipe, live_defaults(limits))
        pipe = await in_passing_thread(self._batched, pipe)  # packs the weights
        self._add(pipe, seconds, step)
        return pipe

    def _budget(self) -> int:
        mb = self.limits.memory_budget_mb
        return int(mb * capacity.MB) if mb > 0 else capacity.default_budget()

    def _resolve_workers(self, pipe: Pipeline) -> int:
        if self.limits.workers > 0:
            return self.limits.workers
        return capacity.auto_workers(pipe.dims, WINDOW_AUDIO, self._budget())

    def _batched(self, pipe: Pipeline) -> Pipeline:
        """The pipeline with a StepBatcher for its workers' and live streams' decodes."""
        if pipe.context.batcher is not None:
            return pipe
        return pipe.batched(self._resolve_workers(pipe) + max(1, self.limits.live_workers))

    def _add(self, pipe: Pipeline, warm_up_seconds: float = 0.0, step: float = 0.0) -> None:
        workers = self._resolve_workers(pipe)
        prefix = f"xattn-decode-{len(self._models)}" if self._models else "xattn-decode"
        pool = ThreadPoolExecutor(workers, thread_name_prefix=prefix)
        # a first guess of a window's model time until windows are measured: the warm-up's
        estimate = capacity.WaitEstimate(max(0.2, warm_up_seconds))
        budget = self._budget()
        clip = capacity.request_bytes(pipe.dims, WINDOW_AUDIO).total
        longest = capacity.request_bytes(pipe.dims, self.limits.max_audio_seconds).total
        log.info(
            "model %s: up to %d transcriptions at once in %.0f MB (each %.0f MB for 30 s, "
            "%.0f MB for %g s)",
            *(pipe.name, workers, budget / capacity.MB, clip / capacity.MB),
            *(longest / capacity.MB, self.limits.max_audio_seconds),
        )
        lim = self.limits
        admission = LiveAdmission(pipe.name, lim.live_lag_target, lim.max_live_streams, step)
        rounds = LiveRounds(self.live_pool, pipe.context.batcher)
        self._models[pipe.name] = _Model(pipe, pool, workers, estimate, budget, admission, rounds)
        if pipe.context.batcher is not None:
            pipe.context.batcher.observer = self.observer.batcher(pipe.name)
        self.observer.model_loaded(pipe, workers, workers + max(0, self.limits.max_queue))

    def live_rounds(self, model: str) -> LiveRounds:
        """Where the live steps of `model` (its name) take their turns."""
        return self._models[model].rounds

    def live_streams_for(self, model: str = "") -> int:
        """Live streams `model` ("" = the first) serves at once (its live capacity)."""
        return self._models[self.pipeline_for(model).name].admission.max_streams

    def counters(self) -> Counters:
        with self._lock:
            c = Counters(**{f.name: getattr(self._counters, f.name) for f in fields(Counters)})
            c.queued = sum(len(m.queued) for m in self._models.values())
            c.running = sum(m.running for m in self._models.values())
            return c

    def loads(self) -> dict[str, dict[str, int]]:
        """Each model's in_flight, queued, running and live transcriptions now, its workers
        and its admission capacity (workers + max_queue)."""
        with self._lock:
            return {n: {"in_flight": m.in_flight, "queued": len(m.queued), "running": m.running,
                        "live": m.live, "workers": m.workers,
                        "capacity": m.workers + max(0, self.limits.max_queue)}
                    for n, m in self._models.items()}  # fmt: skip

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
        decoding = decoding_of(options)
        with self.observer.span("xattn.admission", model=pipe.name, decoding=decoding):
            self._admit(pipe.name, decoding)
        return Run(self, load_audio, options, shape, pipe)

    def admit_live(self, model: str = "") -> LiveSlot:
        """Admit a live stream (Overloaded when full); it holds the slot until released."""
        name = self.pipeline_for(model).name
        with self.observer.span("xattn.admission", model=name, decoding="live"):
            self._admit(name, "live")
        return LiveSlot(self, name)

    def _admit(self, model: str, decoding: str) -> None:
        if not self.ready:
            raise NotReady("the model is still loading")
        live = decoding == "live"
        if (scope := current_request()) is not None:
            scope.model = model  # the request's model label, refused or not
        with self._lock:
            c, m = self._counters, self._models[model]
            refusal = self._refusal(m, live)
            if refusal is not None:
                c.rejected += 1
                self.observer.refused(model, refusal.reason)
                raise refusal
            c.admitted += 1
            c.in_flight += 1
            m.in_flight += 1
            if live:
                c.live += 1
                c.started += 1
                m.live += 1
        self.observer.admitted(model, decoding)

    def _refusal(self, m: _Model, live: bool) -> Overloaded | None:
        """Why a new request of model `m` is refused now (None: admitted); under the lock."""
        if live and (full := m.admission.refusal(m.live)) is not None:
            return overloaded(full.why, full.retry_seconds, "live_full")
        return refusal(m, self.limits.max_queue, self.limits.max_queue_wait, live)

    def enqueue(self, run: Run) -> None:
        """Queue an admitted run whose audio is decoded for its model's workers."""
        m = self._models[run.pipeline.name]
        samples = len(run.audio) if run.audio is not None else 0
        run.windows = capacity.windows_of(samples)
        rows = max(run.options.beam_size or 1, run.options.best_of or 1)
        run.bytes = capacity.request_bytes(m.pipe.dims, samples / 16000, rows).total
        self.observer.audio_decoded(m.pipe.name, samples / 16000)
        with self._lock:
            m.queued.append(run)
            self._dispatch(m)

    def _dispatch(self, m: _Model) -> None:
        """Hand queued runs to workers, in order, while a worker is free and the memory
        budget holds the next (one always runs); under the lock."""
        while m.queued and m.running < m.workers:
            run = m.queued[0]
            if m.running and m.held + run.bytes > m.budget:
                return
            m.queued.popleft()
            m.running += 1
            m.held += run.bytes
            run.claimed = True
            m.pool.submit(run.context.run, self.work, run)  # in the request's context

    def end(self, run: Run | None, outcome: str, model: str = "") -> None:
        """Count a run's (None: a live stream's) outcome and free its slot."""
        with self._lock:
            c = self._counters
            setattr(c, outcome, getattr(c, outcome) + 1)
            c.in_flight -= 1
            m = self._models.get(name := run.pipeline.name if run is not None else model)
            if m is not None:
                m.in_flight -= 1
                m.live -= run is None
        self.observer.ended(name, decoding_of(run.options) if run else "live", outcome)

    def unqueue(self, run: Run) -> None:
        """End (as cancelled) a run that no worker has taken yet; no-op once one has."""
        with self._lock:
            if run.claimed:
                return
            run.claimed, run.audio = True, None
            queued = self._models[run.pipeline.name].queued
            if run in queued:
                queued.remove(run)
        self.end(run, "cancelled")

    def work(self, run: Run) -> None:
        """Run one transcription on this (worker) thread; `_dispatch` claimed it."""
        run.times.queue = time.perf_counter() - run.queued_at
        m = self._models[run.pipeline.name]
        audio, run.audio = run.audio, None
        outcome, events, windows = "failed", None, 0
        if run.cancelled.is_set() or audio is None:
            self._measured(m, run, 0)
            self.end(run, "cancelled")
            return
        timeline = Timeline(self.observer, run)
        with self._lock:
            self._counters.started += 1
        try:
            events = run.pipeline.transcribe(audio, run.options)
            while not run.cancelled.is_set():
                t0 = time.perf_counter()
                event = next(events, None)
                dt = time.perf_counter() - t0
                if event is None:
                    outcome = "finished"
                    break
                timeline.event(event, t0, t0 + dt)
                if isinstance(event, WindowStart):
                    run.times.encode += dt
                    windows += 1
                else:
                    run.times.decode += dt
                if isinstance(event, TokenEvent):
                    with self._lock:
                        self._counters.tokens_decoded += 1
                item = run.shape(event)
                if item is not None:
                    run.put(item)
                if isinstance(event, Transcript):  # the last event, handed over: served, even
                    outcome = "finished"  # if the client hangs up before the generator ends
                    break
            else:
                outcome = "cancelled"
        except Cancelled:
            outcome = "cancelled"
        except Exception as e:
            log.exception("transcription failed")
            run.put_last(e)
        finally:
            if events is not None:
                events.close()  # its steps leave the batch here, if they had not
            timeline.close(outcome, len(audio) / 16000)
            self._measured(m, run, windows)
            self.end(run, outcome)
            run.put_last(END)

    def _measured(self, m: _Model, run: Run, windows: int) -> None:
        """`run` left its worker after `windows` windows: free its place (the next queued
        run starts) and update the model time per window."""
        batcher = m.pipe.context.batcher
        with self._lock:
            m.running -= 1
            m.held -= run.bytes
            m.windows_done += windows
            self._counters.windows += windows
            done = m.windows_done
            self._dispatch(m)
        if batcher is not None:
            stats = batcher.stats  # the files' model time: live steps' turns apart
            m.estimate.update(stats.busy - stats.turn_busy, done)

    async def close(self) -> None:
        """Stop taking work; wait for the worker threads (call after in-flight RPCs end)."""
        models = list(self._models.values())
        self._models = {}
        for pool in (*(m.pool for m in models), self.live_pool):
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
        for m in models:  # after the workers: none of them waits on its batcher any more
            if m.pipe.context.batcher is not None:
                await asyncio.to_thread(m.pipe.context.batcher.close)
        if self.decoders is not None:
            await asyncio.to_thread(self.decoders.close)
