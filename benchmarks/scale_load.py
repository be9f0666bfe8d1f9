"""A bounded load of StreamTranscribe and Transcribe calls over one channel, recorded call by
call: for tests/test_scale.py (faults in the middle) and benchmarks/scale.py (throughput).

The channel is `xattn.clients.api.open_channel`'s: round_robin over the target's addresses
and gRPC's retries of UNAVAILABLE / RESOURCE_EXHAUSTED before the first response. Every call
carries an `x-request-id` (HAProxy logs it) and a deadline, so nothing waits forever.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np

from xattn.clients.api import open_channel
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

KINDS = ("stream", "unary")


@dataclass(frozen=True)
class Outcome:
    """One call: what it was, when it ran (time.monotonic), how it ended."""

    rid: str  # its x-request-id
    kind: str  # "stream" (StreamTranscribe) or "unary" (Transcribe)
    start: float
    end: float
    status: str  # "OK" or the gRPC status name
    events: int  # stream messages received before it ended (unary: 1 when OK)
    text: str  # the transcript ("" unless OK)
    detail: str = ""  # the error's details and debug string

    @property
    def seconds(self) -> float:
        return self.end - self.start


def options() -> pb.TranscriptionOptions:
    """English, greedy where the contract has beam_size (the load is about the service)."""
    opts = pb.TranscriptionOptions(language="en")
    if "beam_size" in pb.TranscriptionOptions.DESCRIPTOR.fields_by_name:
        opts.beam_size = 1
    return opts


def call(
    stub: transcriber_pb2_grpc.TranscriberStub,
    kind: str,
    data: bytes,
    rid: str,
    timeout: float,
    on_event: Callable[[int], None] | None = None,
) -> Outcome:
    """One call of `kind`, never raising: its Outcome. `on_event(n)` after each message."""
    metadata = (("x-request-id", rid),)
    audio, alignment = pb.Audio(encoded=data), pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_NONE)
    start, events, text = time.monotonic(), 0, ""
    try:
        if kind == "unary":
            request = pb.TranscribeRequest(audio=audio, options=options(), alignment=alignment)
            reply = stub.Transcribe(request, timeout=timeout, metadata=metadata)
            events, text = 1, reply.transcript.text
        else:
            request = pb.StreamTranscribeRequest(
                audio=audio, options=options(), alignment=alignment
            )
            for message in stub.StreamTranscribe(request, timeout=timeout, metadata=metadata):
                events += 1
                if on_event is not None:
                    on_event(events)
                if message.HasField("done"):
                    text = message.done.transcript.text
        return Outcome(rid, kind, start, time.monotonic(), "OK", events, text)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        detail = f"{e.details()} | {e.debug_error_string()}" if hasattr(e, "details") else str(e)
        return Outcome(rid, kind, start, time.monotonic(), code.name, events, "", detail)


class Load:
    """`clients` threads calling back to back over one channel to `target`, alternating the
    kinds, until `stop()` or `total` calls have started; `outcomes` grows as calls end."""

    def __init__(
        self,
        target: str,
        data: bytes,
        clients: int,
        total: int,
        timeout: float = 120.0,
        kinds: Iterable[str] = KINDS,
        prefix: str = "call",
    ) -> None:
        self.channel = open_channel(target)
        self.stub = transcriber_pb2_grpc.TranscriberStub(self.channel)
        self.data, self.clients, self.total, self.timeout = data, clients, total, timeout
        self._kinds = itertools.cycle(tuple(kinds))
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.outcomes: list[Outcome] = []
        self.started: dict[str, float] = {}  # rid -> start, also of calls still running
        self._pool: ThreadPoolExecutor | None = None

    def _next(self) -> tuple[str, str] | None:
        with self._lock:
            n = next(self._numbers)
            if self._stopped.is_set() or n >= self.total:
                return None
            rid = f"{n:04d}"
            self.started[rid] = time.monotonic()
            return rid, next(self._kinds)

    def _client(self, _: int) -> None:
        while (job := self._next()) is not None:
            rid, kind = job
            outcome = call(self.stub, kind, self.data, rid, self.timeout)
            with self._lock:
                self.outcomes.append(outcome)

    def start(self) -> Load:
        self._pool = ThreadPoolExecutor(self.clients, thread_name_prefix="load")
        self._futures = [self._pool.submit(self._client, i) for i in range(self.clients)]
        return self

    def wait_for(self, predicate: Callable[[Load], bool], timeout: float) -> None:
        """Until `predicate(self)` holds (TimeoutError after `timeout` s)."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"load: condition not met after {timeout:g} s")
            time.sleep(0.02)

    def in_flight(self) -> list[str]:
        with self._lock:
            done = {o.rid for o in self.outcomes}
            return [rid for rid in self.started if rid not in done]

    def stop(self) -> None:
        self._stopped.set()

    def join(self, timeout: float) -> list[Outcome]:
        """Wait for every call to end (TimeoutError: something hangs), close the channel."""
        deadline = time.monotonic() + timeout
        for future in self._futures:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        assert self._pool is not None
        self._pool.shutdown()
        self.channel.close()
        return sorted(self.outcomes, key=lambda o: o.rid)


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def summary(outcomes: list[Outcome]) -> dict[str, object]:
    """Calls, outcomes by status and kind, p50/p99 seconds of the successful ones."""
    ok = [o.seconds for o in outcomes if o.status == "OK"]
    by_status = Counter(f"{o.kind} {o.status}" for o in outcomes)
    p50, p99 = percentile(ok, 50), percentile(ok, 99)
    return {
        "calls": len(outcomes),
        "by status": dict(sorted(by_status.items())),
        "p50 s": None if p50 is None else round(p50, 3),
        "p99 s": None if p99 is None else round(p99, 3),
    }
