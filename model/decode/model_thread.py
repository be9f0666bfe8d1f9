"""The model thread: where a StepBatcher runs its model work, one piece at a time.

`TurnThread`, a thread of its own (the server's), runs the work submitted to it in the order
of keys. `CallerThread` makes the caller's thread the model thread (library calls that batch
their own decodes).

Work is ordered by a key taken when it is submitted (first come, first served), except inside
a *turn*: a piece of work made of many model calls with Python between them (a live stream's
decode step: its log-mel, encoder pass, decoder steps and word alignment) takes one key when
the turn begins, and every call its thread submits during the turn carries it. So a turn's
calls go before the work submitted since it began, and while a turn is open and has nothing
queued (its thread is between two calls), the model thread holds for it, at most `hold`
seconds after the turn was last active, rather than start newer work (an encoder pass of
another stream: 0.2 s that its next decoder step would wait). A turn runs from its start to
its end without the work that came after it, and work that came before it goes first.
Several threads may share one turn (a *round*: `new_key()`, then `turn(key)` on each): their
calls run at its key in the order they come, so their decoder steps can meet in one batch,
and the turn ends when the last of them leaves it.

Without turns it is a single-thread executor in submission order.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

T = TypeVar("T")

HOLD = 0.02  # seconds the model thread waits for an open turn's next call


@dataclass
class _Work:
    future: Future
    fn: Callable[[], object]

    def run(self) -> None:
        if self.future.set_running_or_notify_cancel():
            try:
                self.future.set_result(self.fn())
            except BaseException as e:
                self.future.set_exception(e)


@dataclass(order=True)
class _Item:
    key: int
    seq: int
    work: _Work = field(compare=False)


class ModelThread(Executor):
    """Where a StepBatcher runs its model work: each piece queued at a key (`submit_at`);
    `submit` at the key `key()` gives the calling thread."""

    def key(self) -> int:
        raise NotImplementedError

    def submit_at(self, key: int, fn: Callable[[], T]) -> Future[T]:
        raise NotImplementedError

    def submit(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> Future[T]:
        return self.submit_at(self.key(), partial(fn, *args, **kwargs))


class TurnThread(ModelThread):
    """One thread running submitted work by key (`submit_at`; `submit`: the calling thread's
    turn's key, else a new one); `turn()` opens a turn on the calling thread."""

    def __init__(self, name: str = "xattn-model", hold: float = HOLD) -> None:
        self.hold = hold
        self._cond = threading.Condition()
        self._heap: list[_Item] = []
        self._keys = itertools.count()
        self._seq = itertools.count()
        self._open: dict[int, float] = {}  # open turns: key -> when last active (monotonic)
        self._members: dict[int, int] = {}  # open turns: key -> threads in it
        self._local = threading.local()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def key(self) -> int:
        """The key of work submitted now from this thread: its turn's, else a new one."""
        key = getattr(self._local, "key", None)
        return next(self._keys) if key is None else key

    def in_turn(self) -> bool:
        """Whether the calling thread is in a turn."""
        return getattr(self._local, "key", None) is not None

    def new_key(self) -> int:
        """A key for a turn that several threads share (`turn(key)`): after every key so far."""
        with self._cond:
            return next(self._keys)

    @contextlib.contextmanager
    def turn(self, key: int | None = None) -> Iterator[int]:
        """Open a turn on this thread (within one already open: that one); yields its key.
        `key` (from `new_key`): join the turn of that key, shared with other threads."""
        if getattr(self._local, "key", None) is not None:
            yield self._local.key
            return
        with self._cond:
            key = next(self._keys) if key is None else key
            self._open[key] = time.monotonic()
            self._members[key] = self._members.get(key, 0) + 1
        self._local.key = key
        try:
            yield key
        finally:
            self._local.key = None
            with self._cond:
                self._members[key] -= 1
                if not self._members[key]:
                    del self._open[key], self._members[key]
                self._cond.notify_all()

    def submit_at(self, key: int, fn: Callable[[], T]) -> Future[T]:
        """Run fn() when every queued piece of work with a smaller key has run."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot submit work after the model thread was shut down")
            heapq.heappush(self._heap, _Item(key, next(self._seq), _Work(future, fn)))
            if key in self._open:
                self._open[key] = time.monotonic()
            self._cond.notify_all()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            if cancel_futures:
                for item in self._heap:
                    item.work.future.cancel()
                self._heap = []
            self._cond.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _next(self) -> _Item | None:
        """The next work to run (holding for an older open turn), None once shut down."""
        with self._cond:
            while True:
                if not self._heap:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                first = self._heap[0].key
                older = [t for k, t in self._open.items() if k < first]
                until = max(older) + self.hold if older else 0.0
                now = time.monotonic()
                if now < until and not self._closed:
                    self._cond.wait(until - now)
                    continue
                return heapq.heappop(self._heap)

    def _serve(self) -> None:
        while (item := self._next()) is not None:
            item.work.run()
            with self._cond:
                if item.key in self._open:
                    self._open[item.key] = time.monotonic()


class CallerThread(ModelThread):
    """The thread that makes it, as a batcher's model thread: work submitted to it waits in a
    queue until this thread `serve`s it. A library call that batches its own decodes
    (xattn.model.transcribe.batched) runs its torch work on the caller's thread this way, as the
    sequential path does: a model thread of its own would bring a second OpenMP team onto the
    cores that the caller's (from loading the model) holds, and with two teams libgomp stops
    spinning between parallel regions (a step of 8 windows: 26 ms instead of 16)."""

    def __init__(self) -> None:
        self._owner = threading.get_ident()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._keys = itertools.count()

    def owned(self) -> bool:
        """Whether the calling thread is the owner."""
        return threading.get_ident() == self._owner

    def key(self) -> int:
        """A new key (no turns here: work runs in submission order, whatever its key)."""
        return next(self._keys)

    def submit_at(self, key: int, fn: Callable[[], T]) -> Future[T]:
        """Queue fn() for the owner; the key is TurnThread's interface, unused here."""
        work = _Work(Future(), fn)
        self._queue.put(work)
        return work.future

    def put(self, item: object) -> None:
        """Hand the owner an item to `serve` up (from any thread)."""
        self._queue.put(item)

    def serve(self) -> Iterator[object]:
        """On the owner's thread: run the submitted work as it comes; yield every `put` item."""
        while True:
            item = self._queue.get()
            if isinstance(item, _Work):
                item.run()
            else:
                yield item
