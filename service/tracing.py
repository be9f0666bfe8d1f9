"""OpenTelemetry traces (the extra `xattn[otel]`), imported only when tracing is on.

Tracing is on when the standard OTEL_* variables configure an exporter (`wanted` in
xattn.service.instruments): `OTEL_TRACES_EXPORTER` (otlp, console; none: off) or an OTLP
endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The exporters
read their own variables (endpoint, headers, timeout, `OTEL_EXPORTER_OTLP_PROTOCOL`:
http/protobuf by default, grpc with opentelemetry-exporter-otlp-proto-grpc installed), the
SDK its sampler (`OTEL_TRACES_SAMPLER`, parent-based always-on by default) and batching
(`OTEL_BSP_*`); `OTEL_SERVICE_NAME` defaults to "xattn".

The faces' server spans come from opentelemetry-python-contrib's gRPC and ASGI
instrumentations, which continue the caller's W3C `traceparent` (gRPC metadata, HTTP
header); the engine's spans (`Spans`) are their children.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from starlette.types import ASGIApp

Attribute = str | int | float | bool


class TracingConfigError(ValueError):
    """OTEL_* variables that ask for what this installation cannot do."""


def provider_from_env(environ: Mapping[str, str] = os.environ) -> TracerProvider:
    """A TracerProvider exporting as the OTEL_* variables say (the SDK reads the rest)."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "xattn"}))
    provider = TracerProvider(resource=resource)
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    for name in filter(None, names):
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    return provider


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={name!r}: xattn exports otlp or console")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as e:
            raise TracingConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc"
            ) from e
        return GrpcExporter()  # type: ignore[no-any-return]
    raise TracingConfigError(f"OTLP protocol {protocol!r}: use http/protobuf or grpc")


def grpc_interceptor(provider: trace.TracerProvider) -> grpc.aio.ServerInterceptor:
    """The gRPC face's server spans (opentelemetry-instrumentation-grpc)."""
    return aio_server_interceptor(tracer_provider=provider)


def asgi_middleware(app: ASGIApp, provider: trace.TracerProvider) -> ASGIApp:
    """The HTTP face's server spans (opentelemetry-instrumentation-asgi), without a span per
    ASGI message (an upload's chunks, a Realtime socket's events)."""
    return OpenTelemetryMiddleware(
        app,
        tracer_provider=provider,
        meter_provider=NoOpMeterProvider(),  # the metrics are Prometheus'
        exclude_spans=["receive", "send"],
    )


# epoch ns at perf_counter() == 0, read once: every span time converted with the same offset,
# so a child never starts before its parent by the jitter of reading two clocks (a thread
# preempted between the reads, on a busy machine)
_EPOCH_NS = time.time_ns() - time.perf_counter_ns()


def _ns(at: float | None) -> int:
    """A time.perf_counter() reading (None: now) as epoch nanoseconds."""
    return _EPOCH_NS + int((time.perf_counter() if at is None else at) * 1e9)


class _Span:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def set(self, key: str, value: Attribute) -> None:
        self.span.set_attribute(key, value)

    def end(self, at: float | None = None) -> None:
        self.span.end(end_time=_ns(at))


class Spans:
    """The engine's spans (xattn.service.engine.observe.Observer.span and .begin)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.tracer = provider.get_tracer("xattn")

    @contextlib.contextmanager
    def span(self, name: str, attributes: dict[str, Attribute]) -> Iterator[_Span]:
        with self.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield _Span(span)

    def begin(
        self, name: str, start: float, parent: object, attributes: dict[str, Attribute]
    ) -> _Span:
        context = trace.set_span_in_context(parent.span) if isinstance(parent, _Span) else None
        span = self.tracer.start_span(
            name, context=context, start_time=_ns(start), attributes=attributes
        )
        return _Span(span)


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), if a span is recording here."""
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None
