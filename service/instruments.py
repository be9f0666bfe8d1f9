"""The process's observer: the engine's and the faces' reports (xattn.service.engine.observe)
as Prometheus metrics (xattn.service.metrics) and OpenTelemetry spans (xattn.service.tracing).

Either half may be off: `--no-metrics` leaves no metrics, and tracing is off unless OTEL_*
variables configure an exporter (`wanted`), in which case opentelemetry is never imported,
no tracer is installed and no span is made. A histogram observed where a span is current
carries the trace id as an exemplar.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from xattn.model.pipeline import Pipeline
from xattn.service.engine.observe import NO_SPAN, Observer, RequestScope, Span
from xattn.service.metrics import Metrics

if TYPE_CHECKING:
    from xattn.service.tracing import Spans


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTEL_* variables configure a trace exporter (the SDK's own rules:
    OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")} - {""}
    if exporters:
        return exporters != {"none"}
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return any(environ.get(name) for name in endpoints)


class _Batcher:
    """One model's model thread, watched (xattn.model.decode.step_batcher.BatchObserver)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._encoder = metrics.encoder.labels(model)
        self._step = metrics.step.labels(model)
        self._rows = metrics.rows.labels(model)

    def encoded(self, windows: int, seconds: float) -> None:
        self._encoder.observe(seconds)

    def stepped(self, rows: int, seconds: float) -> None:
        self._step.observe(seconds)
        self._rows.observe(rows)


class Instruments(Observer):
    """Metrics when `metrics` is given, spans when `spans` is."""

    active = True

    def __init__(self, metrics: Metrics | None, spans: Spans | None = None) -> None:
        self.metrics = metrics
        self.spans = spans
        self._trace_id: Callable[[], str | None] = lambda: None
        if spans is not None:
            from xattn.service.tracing import trace_id

            self._trace_id = trace_id

    def trace_id(self) -> str | None:
        return self._trace_id()

    def _exemplar(self) -> dict[str, str] | None:
        trace = self._trace_id()
        return {"trace_id": trace} if trace else None

    # --- the faces ---
    def request_ended(self, scope: RequestScope, code: str, seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.requests.labels(scope.face, scope.method, scope.model, code).inc()
            m.request_seconds.labels(scope.face, scope.method, scope.model).observe(
                seconds, self._exemplar()
            )

    # --- the engine ---
    def admitted(self, model: str, decoding: str) -> None:
        if (m := self.metrics) is not None:
            m.admitted.labels(model, decoding).inc()

    def refused(self, model: str, reason: str) -> None:
        if (m := self.metrics) is not None:
            m.refusals.labels(model, reason).inc()

    def ended(self, model: str, decoding: str, outcome: str) -> None:
        if (m := self.metrics) is not None:
            m.outcomes.labels(model, decoding, outcome).inc()

    def audio_decoded(self, model: str, audio_seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.request_audio.labels(model).observe(audio_seconds)

    def queue_waited(self, model: str, seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.queue_wait.labels(model).observe(seconds, self._exemplar())

    def first_token(self, model: str, decoding: str, seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.first_token.labels(model, decoding).observe(seconds, self._exemplar())

    def token(self, model: str) -> None:
        if (m := self.metrics) is not None:
            m.tokens.labels(model).inc()

    def window(self, model: str) -> None:
        if (m := self.metrics) is not None:
            m.windows.labels(model).inc()

    def transcribed(self, model: str, audio_seconds: float, compute_seconds: float) -> None:
        if (m := self.metrics) is not None:
            m.audio.labels(model).inc(audio_seconds)
            if audio_seconds > 0:
                m.rtf.labels(model).observe(compute_seconds / audio_seconds, self._exemplar())

    def live_step(self, model: str, audio_seconds: float, decodes: int, spared: int) -> None:
        if (m := self.metrics) is not None:
            m.audio.labels(model).inc(audio_seconds)
            m.live_decodes.labels(model).inc(decodes)
            m.live_spared.labels(model).inc(spared)

    def live_final(self, model: str, lag: float) -> None:
        if (m := self.metrics) is not None:
            m.lag.labels(model).observe(lag, self._exemplar())

    def model_loaded(self, pipe: Pipeline, workers: int, capacity: int) -> None:
        if (m := self.metrics) is not None:
            m.model_loaded(pipe)

    def batcher(self, model: str) -> _Batcher | None:
        return _Batcher(self.metrics, model) if self.metrics is not None else None

    # --- spans ---
    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        if self.spans is None:
            yield NO_SPAN
            return
        with self.spans.span(name, attributes) as span:
            yield span

    def begin(self, name: str, start: float, parent: Span | None = None, **attributes: Any) -> Span:
        if self.spans is None:
            return NO_SPAN
        return self.spans.begin(name, start, parent, attributes)
