"""Who goes next on the model thread among a model's live streams: rounds.

A live stream with audio to decode asks for a step (`LiveRounds.step`). Steps run in rounds:
when no round is running, every stream that is due starts its step at once, on the live pool,
the neediest first (the most audio not yet decoded); a stream that becomes due while a round
runs waits for the next one. So no stream waits for another's whole step more than once in a
row, and when the model thread cannot keep up every round grows alike: the lag grows evenly
for all streams, and none stalls. Between two rounds the streams of the last one get a moment
to come back (each sends its results first): the next round starts once each has asked for
its next step or said it has no audio (`idle`), or after GATHER seconds, so that a stream
whose step ended last is not left out of the next round (nor one slow reader hold all).

The steps of one round share one turn of the model thread (StepBatcher.round_key and
`turn(key)`, xattn.model.decode.model_thread): their encoder passes run one after another, in
the order they come, and their decoder steps meet in the StepBatcher's batch instead of each
step holding the model thread for its whole decode; work submitted after the round began
(files' windows, the next round) goes after it. When a token is final is the live policy's
business (xattn.model.live); this decides only who steps when.

Everything here runs on the event loop (no lock): tickets are taken and rounds started there;
each step's result comes back through its future.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from typing import Generic, TypeVar

from xattn.model.decode.step_batcher import StepBatcher

T = TypeVar("T")
GATHER = 0.05  # seconds the next round waits at most for the streams of the last one


class Ticket(Generic[T]):
    """One stream's step, due: `future` is its run on the pool once its round starts."""

    def __init__(self, owner: object, need: Callable[[], float], fn: Callable[[], T]) -> None:
        self.owner = owner  # the stream (its session)
        self.need = need  # how due its step is (read when its round starts; larger first)
        self.fn = fn
        self.done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.future: Future[T] | None = None  # its step on the pool, once started
        self.round = -1  # the round it ran in


class LiveRounds:
    """One model's live steps, in rounds on `pool` (a round shares a turn of `batcher`)."""

    def __init__(self, pool: Executor, batcher: StepBatcher | None) -> None:
        self._pool = pool
        self._batcher = batcher
        self._due: list[Ticket] = []
        self._running = 0  # steps of the current round not over
        self._rounds = itertools.count()
        self.round = -1  # the current (or last) round's number
        self._away: set[int] = set()  # streams of the last round not back yet (their ids)
        self._gather: asyncio.TimerHandle | None = None  # the end of the wait for them

    @property
    def due(self) -> int:
        """Streams waiting for the next round."""
        return len(self._due)

    async def step(self, ticket: Ticket[T]) -> T:
        """Run the ticket's step in the next round (now, if none runs); its result. Cancelled
        before its round started, it never runs; after, its step ends on its own."""
        self._due.append(ticket)
        self._away.discard(id(ticket.owner))
        self._start()
        try:
            return await asyncio.shield(ticket.done)
        except asyncio.CancelledError:
            if ticket in self._due:
                self._due.remove(ticket)
            ticket.done.add_done_callback(_retrieved)  # its error, if any, is nobody's now
            raise

    def idle(self, owner: object) -> None:
        """`owner` has no audio to decode now (or has ended): the next round need not wait
        for it."""
        self._away.discard(id(owner))
        self._start()

    def _gathered(self) -> None:
        self._gather = None
        self._away.clear()
        self._start()

    def _start(self) -> None:
        """Start a round of every due step, if none is running and the last one's streams
        are back (or GATHER seconds have passed)."""
        if self._running or not self._due:
            return
        if self._away:
            if self._gather is None:
                self._gather = asyncio.get_running_loop().call_later(GATHER, self._gathered)
            return
        if self._gather is not None:
            self._gather.cancel()
            self._gather = None
        tickets = sorted(self._due, key=lambda t: -t.need())  # the neediest first
        self._due = []
        self.round = next(self._rounds)
        key = self._batcher.round_key() if self._batcher is not None else None
        loop = asyncio.get_running_loop()
        self._running = len(tickets)
        self._away = {id(t.owner) for t in tickets}
        for ticket in tickets:
            ticket.round = self.round
            ticket.future = self._pool.submit(self._member, key, ticket.fn)
            ticket.future.add_done_callback(partial(self._back, loop, ticket))

    def _member(self, key: int | None, fn: Callable[[], T]) -> T:
        """On the pool: one step of the round, in the round's turn."""
        if key is None or self._batcher is None:
            return fn()
        with self._batcher.turn(key):
            return fn()

    def _back(self, loop: asyncio.AbstractEventLoop, ticket: Ticket, future: Future) -> None:
        """On the pool: hand the step's end to the loop (gone at shutdown: nothing to do)."""
        try:
            loop.call_soon_threadsafe(self._over, ticket, future)
        except RuntimeError:  # the loop is closed
            pass

    def _over(self, ticket: Ticket, future: Future) -> None:
        """On the loop: a step of the round is over; the last one starts the next round."""
        if not ticket.done.done():
            if future.cancelled():
                ticket.done.cancel()
            elif (e := future.exception()) is not None:
                ticket.done.set_exception(e)
            else:
                ticket.done.set_result(future.result())
        self._running -= 1
        self._start()


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
