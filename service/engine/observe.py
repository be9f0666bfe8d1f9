"""What the engine and the faces report, and to whom: the `Observer` interface (no-op here).

The engine (admission, queue, workers, live sessions), the model thread (through
xattn.model.decode.step_batcher.BatchObserver) and each face report what happens to the
engine's `observer`. This one does nothing with the reports; the process gives the engine one
that turns them into Prometheus metrics and OpenTelemetry spans (xattn.service.instruments).
Nothing here imports either library, and nothing here computes a metric: whoever does the work
reports it, once.

A face reports each request it serves in two calls, wherever its protocol ends a request:

    scope = engine.observer.request("wyoming", "transcribe", request_id)
    ...                      # the engine fills scope.model when it admits the request
    scope.end("ok")          # the face's own status: a gRPC code name, an HTTP status, ...

`request` makes the scope current (a context variable) for the code that runs in that context,
threads the engine starts for the request included: log lines carry its request id, and the
engine names its model. Label values stay within small documented sets: faces, methods of
their protocol, status codes, the server's model names (never a name a client sent), decoding
kinds, outcomes and refusal reasons below.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.step_batcher import BatchObserver
from xattn.model.pipeline import Pipeline

FACES = ("grpc", "http", "wyoming")
DECODINGS = ("greedy", "beam", "sampling", "live")
OUTCOMES = ("finished", "cancelled", "failed", "invalid")  # an admitted transcription's end
REFUSALS = ("queue_full", "queue_wait", "live_full")  # why admission refused (Overloaded)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def decoding_of(options: DecodeOptions) -> str:
    """The decoding kind a transcription's options ask for (a label value of DECODINGS)."""
    if options.beam_size > 1:
        return "beam"
    return "sampling" if options.temperatures and options.temperatures[0] > 0 else "greedy"


def request_id_from(given: str | None) -> str:
    """The caller's request id (an `x-request-id` header or metadata) when it is a short plain
    token, else a new one."""
    if given and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex[:16]


class Span(Protocol):
    """A span being recorded: attributes may be added until it ends."""

    def set(self, key: str, value: str | int | float | bool) -> None: ...
    def end(self, at: float | None = None) -> None: ...


class _NoSpan:
    def set(self, key: str, value: str | int | float | bool) -> None:
        pass

    def end(self, at: float | None = None) -> None:
        pass


NO_SPAN = _NoSpan()


@dataclass
class RequestScope:
    """One request a face serves: `end(code)` once when it is over (later calls no-op)."""

    observer: Observer
    face: str
    method: str
    request_id: str
    model: str = ""  # set by the engine: the name of the model it admitted the request to
    started: float = field(default_factory=time.perf_counter)
    ended: bool = False

    def end(self, code: str) -> None:
        if not self.ended:
            self.ended = True
            self.observer.request_ended(self, code, time.perf_counter() - self.started)


_current: ContextVar[RequestScope | None] = ContextVar("xattn_request", default=None)


def current_request() -> RequestScope | None:
    """The request whose work runs in this context, if a face reported one."""
    return _current.get()


class Observer:
    """Takes every report and does nothing with it (metrics and tracing off).

    Times are seconds; `start`/`at` are time.perf_counter() readings. Methods are called on
    the event loop, on decode workers, on the live pool and on the model thread: an
    implementation is thread-safe and quick."""

    active = False  # False: the faces need not report their requests at all

    # --- the faces ---
    def request(self, face: str, method: str, request_id: str | None = None) -> RequestScope:
        """A request begins: the scope of FACES[i] and one of its methods, made current."""
        scope = RequestScope(self, face, method, request_id_from(request_id))
        _current.set(scope)
        return scope

    def request_ended(self, scope: RequestScope, code: str, seconds: float) -> None:
        """`scope` ended with the face's status `code` after `seconds`."""

    # --- the engine: admission and outcomes ---
    def admitted(self, model: str, decoding: str) -> None:
        """A transcription (decoding "live": a live stream) was admitted."""

    def refused(self, model: str, reason: str) -> None:
        """Admission refused a request: a reason of REFUSALS."""

    def ended(self, model: str, decoding: str, outcome: str) -> None:
        """An admitted transcription or live stream ended: an outcome of OUTCOMES."""

    # --- the engine: one file transcription's path ---
    def audio_decoded(self, model: str, audio_seconds: float) -> None:
        """A request's audio is decoded: its duration."""

    def queue_waited(self, model: str, seconds: float) -> None:
        """A transcription left the queue for a decode worker after `seconds`."""

    def first_token(self, model: str, decoding: str, seconds: float) -> None:
        """A transcription's first token, `seconds` after it arrived."""

    def token(self, model: str) -> None:
        """A token was decoded (a file's, or a live stream's final)."""

    def window(self, model: str) -> None:
        """A transcription's 30 s window was encoded."""

    def transcribed(self, model: str, audio_seconds: float, compute_seconds: float) -> None:
        """A transcription finished: its audio, and the seconds it spent on a worker."""

    # --- the engine: live streams ---
    def live_step(self, model: str, audio_seconds: float, decodes: int, spared: int) -> None:
        """A live step took `audio_seconds` of new audio and ran `decodes` decodes (0 or 1,
        more at the stream's end); `spared`: decodes its VAD skipped while nobody spoke."""

    def live_final(self, model: str, lag: float) -> None:
        """A live final was sent `lag` seconds of audio after the end of its speech."""

    # --- the model ---
    def model_loaded(self, pipe: Pipeline, workers: int, capacity: int) -> None:
        """A model is served: `workers` decode at once, `capacity` admitted at once."""

    def batcher(self, model: str) -> BatchObserver | None:
        """What watches `model`'s model thread (its encoder calls and batched steps)."""
        return None

    # --- spans ---
    @contextlib.contextmanager
    def span(self, name: str, **attributes: str | int | float | bool) -> Iterator[Span]:
        """A span around the block, a child of the current one."""
        yield NO_SPAN

    def begin(
        self, name: str, start: float, parent: Span | None = None, **attributes: str | int | float
    ) -> Span:
        """A span that began at `start` (a child of `parent`, else of the current span); the
        caller ends it with end(at)."""
        return NO_SPAN


NULL = Observer()
