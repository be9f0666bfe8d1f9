"""Cases timed in worker processes of their own, one implementation a process, run in turn.

Loaded into one process, implementations disturb each other: with faster-whisper's
CTranslate2 model loaded beside ours, each of our end-to-end runs took ~13,700 page faults
instead of ~10 and 0.52 s instead of 0.36 (same CPU time: the threads waited), and the gap
closed when the model was deleted. So each implementation gets its own process, all of them
stay up, and only one runs at a time: the cases are still interleaved (round robin), so drift
on a shared machine falls on all of them alike.

    with Workers({"ours": ("benchmarks.end_to_end:our_cases", args), ...}, threads=2) as w:
        texts = w.warm_up()
        seconds = w.round_robin(repeats=5)
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Self

from benchmarks.replicas import Started

Builder = tuple[str, tuple]  # "module:function" returning {case: run() -> text}, its arguments


class Workers(Started):
    """One spawned process per builder, started on entering; every case of every process, by
    name."""

    def __init__(self, builders: dict[str, Builder], threads: int) -> None:
        self.builders, self.threads = builders, threads
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        self.cases: dict[str, Connection] = {}

    def start(self) -> Self:
        ctx = mp.get_context("spawn")  # no fork: a fresh interpreter, nothing inherited
        for target, args in self.builders.values():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, target, args, self.threads), daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        for conn in self._conns:  # they load in parallel; collect their case names
            for name in _reply(conn):
                self.cases[name] = conn
        return self

    def run(self, name: str) -> tuple[float, str]:
        """Seconds of one run of case `name` (timed in its process) and its text."""
        conn = self.cases[name]
        conn.send(name)
        return _reply(conn)

    def warm_up(self) -> dict[str, str]:
        """Every case once (untimed); their texts."""
        return {name: self.run(name)[1] for name in self.cases}

    def round_robin(self, repeats: int) -> dict[str, list[float]]:
        """Seconds of each case, `repeats` times, the cases interleaved."""
        times: dict[str, list[float]] = {name: [] for name in self.cases}
        for _ in range(repeats):
            for name in self.cases:
                times[name].append(self.run(name)[0])
        return times

    def stop(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a worker that failed has gone already
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


def _reply(conn: Connection):
    ok, value = conn.recv()
    if not ok:
        raise RuntimeError(f"benchmark worker failed:\n{value}")
    return value


def _serve(conn: Connection, target: str, args: tuple, threads: int) -> None:
    """A worker: build the cases, send their names, then run what is asked until None."""
    import traceback

    import torch

    torch.set_num_threads(threads)
    try:
        module, function = target.split(":")
        cases: dict[str, Callable[[], str]] = getattr(importlib.import_module(module), function)(
            *args
        )
        conn.send((True, list(cases)))
        while (name := conn.recv()) is not None:
            t0 = time.perf_counter()
            text = cases[name]()
            conn.send((True, (time.perf_counter() - t0, text)))
    except Exception:  # noqa: BLE001 - the parent raises it with this traceback
        conn.send((False, traceback.format_exc()))
