"""`serve()`: the gRPC server around the engine, with health, reflection and signals, and
the faces beside it on the same engine: HTTP (--http-port) and Wyoming (--wyoming-port).

The port is bound (and reported) before the model loads; health says NOT_SERVING until the
model is loaded and warmed up, SERVING after, and NOT_SERVING again once shutdown starts.
SIGTERM/SIGINT drain in-flight RPCs for up to `grace` seconds (new RPCs: UNAVAILABLE), then
the process exits 0; a second signal, or the grace running out, cancels the rest at once.
Optional TLS and bearer-token auth: see xattn.service.grpc.security. What an operator sees:
Prometheus metrics on the HTTP port's /metrics (or `metrics_port`), OpenTelemetry traces when
OTEL_* variables configure an exporter (xattn.service.instruments).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from xattn.model.live.window import SHORT, SHORT_BUFFER
from xattn.model.pipeline import Pipeline, load_pipeline, resolve_live_precision
from xattn.service import instruments
from xattn.service.engine.engine import Engine
from xattn.service.engine.limits import LIVE_BEAMS, Limits
from xattn.service.engine.live import live_settings
from xattn.service.engine.tokens import AuthPolicy
from xattn.service.grpc import security
from xattn.service.grpc.connections import connection_options
from xattn.service.grpc.observe import RequestInterceptor
from xattn.service.grpc.servicer import TranscriberServicer
from xattn.service.http.app import HttpSettings, build_app
from xattn.service.http.server import HttpServer, Timeouts, bind
from xattn.service.metrics import Metrics, with_metrics
from xattn.service.wyoming.discovery import Discovery, announcement
from xattn.service.wyoming.handler import WyomingSettings
from xattn.service.wyoming.server import WyomingServer
from xattn.service.wyoming.server import bind as bind_wyoming
from xattn.v1 import transcriber_pb2, transcriber_pb2_grpc

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger(__name__)

MIB = 1 << 20
LIVE_MAX_SECONDS = 3600.0  # the default cap of a live stream's audio
TRANSCRIBER = transcriber_pb2.DESCRIPTOR.services_by_name["Transcriber"].full_name
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# how long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The
# model thread gives the GIL up inside every torch op and must take it back after each: with
# the workers' and the event loop's Python waiting, 5 ms turns could cost a batched step more
# than its arithmetic (8 streams of jfk, beam 5: 0.5 ms gave 0.82-0.94 requests/s, 5 ms
# 0.73-0.75, the model thread's busy time a request 1.03-1.17 s against 1.29-1.32)
SWITCH_INTERVAL = 0.0005
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


LIVE_WINDOWS = ("whole", "short")  # --live-window: the 30 s window, or SHORT's margin


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0: any free port (see port_file)
    model: str = "tiny.en"
    more_models: tuple[str, ...] = ()  # served beside `model` (--model given again)
    device: str = "cpu"
    compute: str = "auto"  # a key of xattn.model.net.whisper.COMPUTES, or "auto" (resolve_compute)
    workers: int = 0  # transcriptions decoded at once, steps batched; 0: auto (memory budget)
    max_queue: int = 64  # transcriptions that may wait for a worker, at most
    max_queue_wait: float = 30.0  # refuse a request the queue would keep waiting longer (s)
    memory_budget_mb: float = 0.0  # memory for the requests in flight; 0: half the available
    max_audio_seconds: float = 1800.0
    # 30 min of 16 kHz 16-bit mono WAV is ~55 MiB; 64 MiB leaves room for the rest.
    max_message_mb: float = 64.0
    grace: float = 10.0  # seconds to drain in-flight RPCs on shutdown
    port_file: str | None = None  # written with the bound port once listening
    tls_cert: str | None = None  # PEM certificate chain; with tls_key: serve TLS only
    tls_key: str | None = None
    auth_tokens: tuple[str, ...] = ()  # when set: `authorization: Bearer <one of them>`
    auth_exempt_health: bool = True
    auth_exempt_reflection: bool = True
    metrics: bool = True  # Prometheus metrics (/metrics); False: none, and no reports at all
    metrics_port: int | None = None  # /metrics on a port of its own (None: off, 0: any)
    metrics_port_file: str | None = None  # written with the bound metrics port once listening
    live_idle_timeout: float = 10.0  # seconds a live stream may send nothing
    live_workers: int = 8  # live decode steps in flight (their decoder steps batched)
    live_lag_target: float = 1.0  # seconds of commit lag the live capacity is sized for
    max_live_streams: int = 0  # live streams at once; 0: measured at start-up
    # the encoder of live steps (xattn.model.pipeline.LIVE_COMPUTES; resolve_live_precision)
    live_compute: str = "auto"
    # what a live step encodes: "whole" (the 30 s window) or "short" (the buffer + 2 s, at
    # least 10 s, and the window's last second: APPROXIMATE, cheaper; xattn.model.live.window)
    live_window: str = "whole"  # one of LIVE_WINDOWS
    live_beam_size: int = LIVE_BEAMS  # beams of a live step's decode (1: greedy)
    live_max_seconds: float | None = None  # audio per live stream; None: max_audio_seconds,
    # at most LIVE_MAX_SECONDS
    decode_processes: int = 2  # encoded files decoded at once, in worker processes (0: here)
    http_port: int | None = None  # OpenAI's audio API over HTTP (service.http); None: off, 0: any
    http_host: str | None = None  # None: `host`
    http_port_file: str | None = None  # written with the bound HTTP port once listening
    cors_origins: tuple[str, ...] = ()  # origins whose pages may call the HTTP API
    http_body_timeout: float = 30.0  # seconds an upload may send nothing before a 408
    # hostile clients (docs/operations.md): seconds a connection may take to send a request's
    # headers (HTTP) or the HTTP/2 preface (gRPC), and may idle (HTTP keep-alive, a Realtime
    # socket, a gRPC connection with no call)
    header_timeout: float = 20.0
    idle_timeout: float = 75.0
    wyoming_port: int | None = None  # Home Assistant's Wyoming protocol (service.wyoming);
    # None: off, 0: any free port
    wyoming_port_file: str | None = None  # written with the bound Wyoming port once listening
    wyoming_streaming: bool = True  # transcript-chunks from the live path; False: batch
    wyoming_zeroconf: str | None = None  # announce the Wyoming port under this mDNS name
    wyoming_max_connections: int = 64

    @property
    def max_live_seconds(self) -> float:
        if self.live_max_seconds is not None:
            return self.live_max_seconds
        return min(self.max_audio_seconds, LIVE_MAX_SECONDS)

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * MIB)


class Server:
    """A started server: `start()`, then `wait_ready()`, then `stop()`."""

    def __init__(
        self,
        config: ServerConfig,
        pipeline: Pipeline | tuple[Pipeline, ...] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """`tracer_provider`: where spans go (None: as the OTEL_* variables say, if they do;
        one made from them is shut down with the server)."""
        self.config = config
        self._pipeline = pipeline
        limits = Limits(
            max_audio_seconds=config.max_audio_seconds,
            workers=config.workers,
            max_queue=config.max_queue,
            max_queue_wait=config.max_queue_wait,
            memory_budget_mb=config.memory_budget_mb,
            max_receive_message_bytes=config.max_message_bytes,
            max_send_message_bytes=config.max_message_bytes,
            max_live_seconds=config.max_live_seconds,
            live_idle_timeout=config.live_idle_timeout,
            live_workers=config.live_workers,
            live_lag_target=config.live_lag_target,
            max_live_streams=config.max_live_streams,
            live_precision=resolve_live_precision(
                config.live_compute, config.compute, config.device
            ),
            live_margin=SHORT if config.live_window == "short" else None,
            live_beam_size=config.live_beam_size,
            decode_processes=config.decode_processes,
        )
        if limits.live_precision is not None:
            log.info(
                "live steps encode in %s (--live-compute %s)",
                *(limits.live_precision, config.live_compute),
            )
        if limits.live_margin is not None:
            log.info(
                "live steps encode short windows: the audio + %g s, at least 10 s, and the "
                "window's last second, over a buffer of at most %g s (--live-window short)",
                limits.live_margin,
                SHORT_BUFFER,
            )
        self.engine = Engine(limits)
        self._own_tracer = tracer_provider is None and instruments.wanted()
        self.tracer_provider = tracer_provider
        if self._own_tracer:
            from xattn.service import tracing

            self.tracer_provider = tracing.provider_from_env()
        self.metrics = Metrics(self.engine, lambda: self.serving) if config.metrics else None
        spans = None
        if self.tracer_provider is not None:
            from xattn.service import tracing

            spans = tracing.Spans(self.tracer_provider)
        if self.metrics is not None or spans is not None:
            self.engine.observer = instruments.Instruments(self.metrics, spans)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._grpc = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared port
                *connection_options(config.header_timeout, config.idle_timeout),
            ],
            interceptors=[
                *self._observing(),
                *security.interceptors(
                    config.auth_tokens, config.auth_exempt_health, config.auth_exempt_reflection
                ),
            ],
        )
        self._loading: asyncio.Task[None] | None = None
        self.http: HttpServer | None = None
        self.http_port = 0
        self.metrics_server: HttpServer | None = None
        self.metrics_port = 0
        self.serving = False  # health SERVING (the HTTP face's /health follows it)
        self.wyoming: WyomingServer | None = None
        self.wyoming_port = 0
        self._discovery: Discovery | None = None

    def _observing(self) -> list[grpc.aio.ServerInterceptor]:
        """The gRPC face's server spans (outermost, so that the rest runs in them) and its
        request reports."""
        out: list[grpc.aio.ServerInterceptor] = []
        if self.tracer_provider is not None:
            from xattn.service import tracing

            out.append(tracing.grpc_interceptor(self.tracer_provider))
        if self.engine.observer.active:
            out.append(RequestInterceptor(self.engine.observer))
        return out

    def _metrics_authorized(self, scope: dict) -> bool:
        """/metrics follows /health: exempt from bearer tokens unless --no-auth-exempt-health."""
        policy = AuthPolicy(self.config.auth_tokens)
        if not policy.tokens or self.config.auth_exempt_health:
            return True
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        return policy.accepts(headers)

    async def start(self) -> int:
        """Listen (health NOT_SERVING) and start loading the model; return the bound port."""
        sys.setswitchinterval(SWITCH_INTERVAL)
        transcriber_pb2_grpc.add_TranscriberServicer_to_server(
            TranscriberServicer(self.engine), self._grpc
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._grpc)
        reflection.enable_server_reflection(
            (TRANSCRIBER, HEALTH, reflection.SERVICE_NAME), self._grpc
        )
        await self._set_health(NOT_SERVING)
        address = f"{self.config.host}:{self.config.port}"
        try:
            if self.config.tls_cert or self.config.tls_key:
                if not (self.config.tls_cert and self.config.tls_key):
                    raise security.SecurityConfigError("TLS needs both a certificate and a key")
                creds = security.server_credentials(self.config.tls_cert, self.config.tls_key)
                self.port = self._grpc.add_secure_port(address, creds)
            else:
                self.port = self._grpc.add_insecure_port(address)
        except RuntimeError as e:  # grpc: "Failed to bind to address ..."
            raise OSError(f"cannot listen on {address}: {e}") from e
        if not self.port:
            raise OSError(f"cannot listen on {address}")
        await self._grpc.start()
        tls = "TLS" if self.config.tls_cert else "plaintext"
        auth = "bearer-token auth" if self.config.auth_tokens else "no auth"
        log.info("xattn listening on %s:%d (%s, %s)", self.config.host, self.port, tls, auth)
        if self.config.http_port is not None:
            await self._start_http()
        if self.config.metrics_port is not None and self.metrics is not None:
            await self._start_metrics()
        if self.config.wyoming_port is not None:
            await self._start_wyoming()
        _write_port(self.config.port_file, self.port)
        self._loading = asyncio.create_task(self._load())
        return self.port

    async def _start_http(self) -> None:
        config = self.config
        host = config.http_host or config.host
        sock = bind(host, config.http_port or 0)
        settings = HttpSettings(
            max_body_bytes=config.max_message_bytes,
            auth_tokens=config.auth_tokens,
            auth_exempt_health=config.auth_exempt_health,
            cors_origins=config.cors_origins,
            live=live_settings(self.engine.limits),
            body_idle_seconds=config.http_body_timeout,
            idle_seconds=config.idle_timeout,
        )
        app = build_app(self.engine, settings, lambda: self.serving)
        if self.tracer_provider is not None:
            from xattn.service import tracing

            app = tracing.asgi_middleware(app, self.tracer_provider)
        if self.metrics is not None:
            app = with_metrics(app, self.metrics.registry, self._metrics_authorized)
        self.http = HttpServer(
            app, sock, config.grace, config.tls_cert, config.tls_key, self._timeouts()
        )
        await self.http.start()
        self.http_port = self.http.port
        scheme = "https" if config.tls_cert else "http"
        log.info("OpenAI-compatible API on %s://%s:%d/v1", scheme, host, self.http_port)
        _write_port(config.http_port_file, self.http_port)

    def _timeouts(self) -> Timeouts:
        return Timeouts(header=self.config.header_timeout, idle=self.config.idle_timeout)

    async def _start_metrics(self) -> None:
        """/metrics alone on `metrics_port` (for a server without the HTTP face)."""
        assert self.metrics is not None
        config = self.config
        sock = bind(config.host, config.metrics_port or 0)
        app = with_metrics(None, self.metrics.registry, self._metrics_authorized)
        self.metrics_server = HttpServer(
            app, sock, 0, config.tls_cert, config.tls_key, self._timeouts()
        )
        await self.metrics_server.start()
        self.metrics_port = self.metrics_server.port
        log.info("Prometheus metrics on %s:%d/metrics", config.host, self.metrics_port)
        _write_port(config.metrics_port_file, self.metrics_port)

    async def _start_wyoming(self) -> None:
        config = self.config
        settings = WyomingSettings(
            streaming=config.wyoming_streaming,
            idle_timeout=config.live_idle_timeout,
            max_connections=config.wyoming_max_connections,
            live=live_settings(self.engine.limits),
        )
        sock = bind_wyoming(config.host, config.wyoming_port or 0)
        self.wyoming = WyomingServer(self.engine, settings, sock)
        await self.wyoming.start()
        self.wyoming_port = self.wyoming.port
        mode = "streamed" if config.wyoming_streaming else "batch"
        log.info("Wyoming on tcp://%s:%d (%s transcripts)", config.host, self.wyoming_port, mode)
        _write_port(config.wyoming_port_file, self.wyoming_port)
        if config.wyoming_zeroconf:
            name = config.wyoming_zeroconf
            self._discovery = Discovery(announcement(name, config.host, self.wyoming_port))
            await self._discovery.start()

    def _loaders(self) -> list[Callable[[], Pipeline]]:
        """One loader per model, the default first (given pipelines, or config's models)."""
        given = self._pipeline
        if given is not None:
            pipes = given if isinstance(given, tuple) else (given,)
            return [lambda p=p: p for p in pipes]
        config = self.config
        return [
            lambda m=m: load_pipeline(m, device=config.device, compute=config.compute)
            for m in (config.model, *config.more_models)
        ]

    async def _load(self) -> None:
        for loader in self._loaders():
            pipe = await self.engine.load(loader)
            log.info("serving %s (%s on %s)", pipe.name, pipe.compute, pipe.device)
        await self._set_health(SERVING)
        self.serving = True
        if self.engine.decoders is not None:  # after the warm-up: its start-up takes a core
            threading.Thread(target=self.engine.decoders.start, daemon=True).start()

    async def wait_ready(self) -> None:
        """Wait for the model (raises what loading raised)."""
        if self._loading is not None:
            await self._loading

    async def _set_health(self, status: int) -> None:
        for service in ("", TRANSCRIBER):
            await self.health.set(service, status)

    async def stop(self, grace: float | None = None) -> None:
        """NOT_SERVING, refuse new RPCs, drain in-flight ones for `grace` s, then stop."""
        grace = self.config.grace if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.serving = False
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        log.info("draining in-flight RPCs for up to %.1f s", grace)
        if self._discovery is not None:
            await self._discovery.stop()
        http = self.http.stop(grace) if self.http is not None else asyncio.sleep(0)
        wyoming = self.wyoming.stop(grace) if self.wyoming is not None else asyncio.sleep(0)
        await asyncio.gather(self._grpc.stop(grace), http, wyoming)
        await self.engine.close()
        if self.metrics_server is not None:  # scraped until the end
            await self.metrics_server.stop(0)
        if self._own_tracer and self.tracer_provider is not None:
            await asyncio.to_thread(self.tracer_provider.shutdown)  # type: ignore[attr-defined]
        # the last word on what was served, for whoever reads the log after the process
        log.info("stopped; counters: %s", json.dumps(asdict(self.engine.counters())))

    async def cancel_all(self) -> None:
        """Cancel every in-flight RPC now (a `stop()` in progress then ends at once)."""
        log.info("cancelling in-flight RPCs")
        http = self.http.stop(0) if self.http is not None else asyncio.sleep(0)
        wyoming = self.wyoming.stop(0) if self.wyoming is not None else asyncio.sleep(0)
        await asyncio.gather(self._grpc.stop(None), http, wyoming)

    async def wait_for_termination(self) -> None:
        await self._grpc.wait_for_termination()


def _write_port(path: str | None, port: int) -> None:
    if path:
        tmp = Path(path + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.replace(path)  # readers never see a half-written file


async def serve(config: ServerConfig, pipeline: Pipeline | None = None) -> None:
    """Run until SIGTERM or SIGINT, then drain and return (exit 0)."""
    server = Server(config, pipeline)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def on_signal() -> None:
        if stopping.is_set():  # the second signal: do not wait for the grace period
            task = asyncio.ensure_future(server.cancel_all())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loading = asyncio.ensure_future(server.wait_ready())
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({loading, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.exception() is not None:
        stop_wait.cancel()
        await server.stop(0)
        raise loading.exception()  # type: ignore[misc]
    await stop_wait
    log.info("shutdown signal received")
    await server.stop()
