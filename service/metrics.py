"""The server's Prometheus metrics: one registry per server, its families, and what is read
when scraped (the engine's gauges, the process).

Names follow Prometheus' conventions (`xattn_` prefix, base units, `_total`, `_seconds`); the
labels and their values are the small sets of xattn.service.engine.observe, documented in
docs/operations.md#monitoring (the table there is the contract; tests/test_metrics.py checks
the families against it). Everything here is prometheus_client's: families, exposition,
exemplars (OpenMetrics, for a scraper that asks), the process collector.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    disable_created_metrics,
    gc_collector,
    make_asgi_app,
    platform_collector,
    process_collector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from xattn.model.pipeline import Pipeline
from xattn.service.engine.engine import Engine

# seconds of a request, a queue wait, a first token: tens of milliseconds to minutes
LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
AUDIO = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)  # seconds
RTF = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)  # compute seconds per audio second
ENCODER = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STEP = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROWS = (1, 2, 4, 8, 16, 32, 64)
LAG = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)  # seconds of audio

Exemplar = Callable[[], dict[str, str] | None]


class Metrics:
    """The families (`registry`); the record methods are called by xattn.service.instruments."""

    def __init__(self, engine: Engine, serving: Callable[[], bool]) -> None:
        disable_created_metrics()  # no `_created` series beside each counter and histogram
        r = self.registry = CollectorRegistry()
        process_collector.ProcessCollector(registry=r)
        platform_collector.PlatformCollector(registry=r)
        gc_collector.GCCollector(registry=r)
        r.register(EngineCollector(engine, serving))

        def counter(name: str, text: str, *labels: str) -> Counter:
            return Counter(name, text, labels, registry=r)

        def histogram(name: str, text: str, buckets: Iterable[float], *labels: str) -> Histogram:
            return Histogram(name, text, labels, registry=r, buckets=tuple(buckets))

        self.requests = counter(
            "xattn_requests", "Requests a face served, by its status code", "face", "method",
            "model", "code",
        )  # fmt: skip
        self.request_seconds = histogram(
            "xattn_request_duration_seconds", "Requests' time from arrival to the last byte",
            LATENCY, "face", "method", "model",
        )  # fmt: skip
        self.admitted = counter(
            "xattn_transcriptions_admitted", "Transcriptions and live streams admitted",
            "model", "decoding",
        )  # fmt: skip
        self.outcomes = counter(
            "xattn_transcriptions", "Admitted transcriptions and live streams that ended, by "
            "outcome", "model", "decoding", "outcome",
        )  # fmt: skip
        self.refusals = counter(
            "xattn_refusals", "Requests admission refused (server busy)", "model", "reason"
        )
        self.queue_wait = histogram(
            "xattn_queue_wait_seconds", "Time a transcription waited for a decode worker",
            LATENCY, "model",
        )  # fmt: skip
        self.first_token = histogram(
            "xattn_time_to_first_token_seconds", "Time from arrival to the first token",
            LATENCY, "model", "decoding",
        )  # fmt: skip
        self.request_audio = histogram(
            "xattn_request_audio_seconds", "Audio length of each transcription request",
            AUDIO, "model",
        )  # fmt: skip
        self.audio = counter(
            "xattn_audio_seconds", "Audio transcribed (finished files, live audio)", "model"
        )
        self.tokens = counter(
            "xattn_tokens", "Tokens decoded (files), committed (live finals)", "model"
        )
        self.windows = counter("xattn_windows", "30 s windows encoded for files", "model")
        self.rtf = histogram(
            "xattn_real_time_factor", "A finished transcription's seconds on a worker per "
            "second of its audio", RTF, "model",
        )  # fmt: skip
        self.encoder = histogram(
            "xattn_encoder_pass_seconds", "An encoder call on the model thread", ENCODER, "model"
        )
        self.step = histogram(
            "xattn_decoder_step_seconds", "A batched decoder step on the model thread",
            STEP, "model",
        )  # fmt: skip
        self.rows = histogram("xattn_batch_rows", "Rows in a batched decoder step", ROWS, "model")
        self.lag = histogram(
            "xattn_live_commit_lag_seconds", "Audio a live stream had sent past the end of a "
            "final's speech when the final was sent", LAG, "model",
        )  # fmt: skip
        self.live_decodes = counter("xattn_live_decodes", "Live decodes run", "model")
        self.live_spared = counter(
            "xattn_live_decodes_spared", "Live decodes the VAD spared (nobody spoke)", "model"
        )
        self.info = Info("xattn_model", "A served model", ["model"], registry=r)

    def model_loaded(self, pipe: Pipeline) -> None:
        d = pipe.dims
        self.info.labels(pipe.name).info(
            {
                "compute": pipe.compute,
                "device": pipe.device,
                "format": pipe.checkpoint_format,
                "multilingual": str(pipe.is_multilingual).lower(),
                "n_mels": str(d.n_mels),
                "n_audio_layer": str(d.n_audio_layer),
                "n_text_layer": str(d.n_text_layer),
                "n_state": str(d.n_audio_state),
                "n_vocab": str(d.n_vocab),
            }
        )


LOADS = {  # Engine.loads() key -> gauge, help
    "in_flight": ("xattn_requests_in_flight", "Transcriptions and live streams admitted, not over"),
    "queued": ("xattn_requests_queued", "Transcriptions whose audio is decoded, waiting for a "
               "worker"),
    "running": ("xattn_requests_running", "Transcriptions on a decode worker"),
    "live": ("xattn_live_streams_open", "Live streams open"),
    "workers": ("xattn_decode_workers", "Transcriptions a model decodes at once"),
    "capacity": ("xattn_admission_capacity", "Transcriptions a model admits at once (workers "
                 "and queue)"),
}  # fmt: skip


class EngineCollector(Collector):
    """Read when scraped: the engine's gauges by model, its audio decoders' crashes, whether
    it serves, and the process's threads (the process collector has no threads)."""

    def __init__(self, engine: Engine, serving: Callable[[], bool]) -> None:
        self.engine, self.serving = engine, serving

    def collect(self) -> Iterable[Metric]:
        loads = self.engine.loads()
        for key, (name, text) in LOADS.items():
            family = GaugeMetricFamily(name, text, labels=["model"])
            for model, values in loads.items():
                family.add_metric([model], values[key])
            yield family
        decoders = self.engine.decoders
        yield CounterMetricFamily(
            "xattn_audio_decoder_crashes",
            "Audio decoder processes that died decoding a file (the request got INVALID_ARGUMENT)",
            value=decoders.crashes if decoders is not None else 0,
        )
        yield GaugeMetricFamily("xattn_ready", "1 while the server serves", value=self.serving())
        threads = _threads()
        if threads is not None:
            yield GaugeMetricFamily("xattn_process_threads", "OS threads", value=threads)


def _threads() -> int | None:
    try:
        return len(os.listdir(Path("/proc/self/task")))
    except OSError:
        return None


def with_metrics(
    app: ASGIApp | None, registry: CollectorRegistry, authorized: Callable[[Scope], bool]
) -> ASGIApp:
    """`app` behind GET /metrics (the registry in the Prometheus text format, or OpenMetrics
    with exemplars for a scraper that asks for it); `app` None: /metrics alone."""
    exposition = make_asgi_app(registry)

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            if not authorized(scope):
                error = {"message": "missing or wrong bearer token", "code": "invalid_api_key"}
                return await JSONResponse({"error": error}, 401)(scope, receive, send)
            return await exposition(scope, receive, send)
        if app is None:
            return await PlainTextResponse("only /metrics here", 404)(scope, receive, send)
        return await app(scope, receive, send)

    return route
