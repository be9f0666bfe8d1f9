"""`python -m xattn.service` / `xattn-server`: run the xattn gRPC server (and, on ports of
their own, OpenAI's audio API over HTTP and Home Assistant's Wyoming protocol).

Every flag also reads an environment variable (XATTN_HOST, XATTN_PORT, XATTN_MODEL, ...);
a flag on the command line wins over the environment, which wins over the default. Tracing
reads OpenTelemetry's own OTEL_* variables (xattn.service.tracing).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence

from xattn.model.decode.beams import MAX_ROWS
from xattn.model.pipeline import COMPUTE_CHOICES, LIVE_COMPUTES, compute_help
from xattn.service import logs
from xattn.service.engine.tokens import SecurityConfigError, read_tokens
from xattn.service.server import LIVE_MAX_SECONDS, LIVE_WINDOWS, ServerConfig, serve

log = logging.getLogger("service")
DEFAULTS = ServerConfig()
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _env(var: str, default: object, kind: Callable[[str], object]) -> object:
    value = os.environ.get(var, "")
    if not value:
        return default
    try:
        return kind(value)
    except ValueError as e:
        raise SystemExit(f"bad {var}={value!r}: {e}") from e


def _bool(value: str) -> bool:
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="xattn-server", description="Whisper speech recognition that streams cross-attention."
    )

    def flag(name: str, kind: Callable[[str], object], default: object, text: str) -> None:
        env = f"XATTN_{name.upper().replace('-', '_')}"
        parser.add_argument(
            f"--{name}",
            type=kind,
            default=_env(env, default, kind),
            help=f"{text} (env {env}; default {default})",
        )

    flag("host", str, DEFAULTS.host, "address to listen on")
    flag("port", int, DEFAULTS.port, "port to listen on; 0 picks a free one")
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="tiny.en, base, a Hugging Face or CTranslate2 directory, or an openai .pt; give it "
        "again to serve several models (requests pick one by name; the first is the default) "
        f"(env XATTN_MODEL, comma-separated; default {DEFAULTS.model})",
    )
    flag("device", str, DEFAULTS.device, "torch device")
    flag("compute", str, DEFAULTS.compute, compute_help())
    flag(
        "workers",
        int,
        DEFAULTS.workers,
        "at most this many transcriptions decoded at once, their decoder steps batched "
        "(0: as many as --memory-budget-mb holds, up to 16)",
    )
    flag("max-queue", int, DEFAULTS.max_queue, "transcriptions that may wait for a worker")
    flag(
        "max-queue-wait",
        float,
        DEFAULTS.max_queue_wait,
        "refuse (RESOURCE_EXHAUSTED / 429, with a retry hint) a request that the work queued "
        "ahead would keep waiting longer than this many seconds",
    )
    flag(
        "memory-budget-mb",
        float,
        DEFAULTS.memory_budget_mb,
        "memory for the transcriptions in flight, MiB (0: half the memory available once "
        "the model has loaded)",
    )
    flag("max-audio-seconds", float, DEFAULTS.max_audio_seconds, "longest audio accepted")
    flag("max-message-mb", float, DEFAULTS.max_message_mb, "largest message, MiB")
    flag("grace", float, DEFAULTS.grace, "seconds to drain in-flight RPCs on SIGTERM")
    flag("port-file", str, None, "write the bound port to this file once listening")
    flag(
        "http-port",
        int,
        None,
        "also serve OpenAI's audio API (/v1/audio/transcriptions, /v1/realtime, ...) over "
        "HTTP on this port; 0 picks a free one",
    )
    flag("http-host", str, None, "address of the HTTP API (default: --host)")
    flag("http-port-file", str, None, "write the bound HTTP port to this file once listening")
    flag(
        "cors-origins",
        str,
        "",
        "comma-separated origins whose pages may call the HTTP API (default: none)",
    )
    flag(
        "wyoming-port",
        int,
        None,
        "also serve Home Assistant's Wyoming speech-to-text protocol on this port of --host "
        "(the convention is 10300; unset or 0: off)",
    )
    flag("wyoming-port-file", str, None, "write the bound Wyoming port to this file")
    flag(
        "wyoming-mode",
        str,
        "streamed",
        "streamed: words as transcript-chunks while they are spoken (the live path), then the "
        "transcript; batch: one transcript at audio-stop, equal to gRPC Transcribe's",
    )
    parser.add_argument(
        "--wyoming-zeroconf",
        nargs="?",
        const="xattn",
        default=os.environ.get("XATTN_WYOMING_ZEROCONF") or None,
        metavar="NAME",
        help="announce the Wyoming port over zeroconf (mDNS, _wyoming._tcp) as NAME, for Home "
        "Assistant to discover (env XATTN_WYOMING_ZEROCONF; default off; NAME: xattn)",
    )
    flag(
        "wyoming-max-connections",
        int,
        DEFAULTS.wyoming_max_connections,
        "Wyoming connections open at once (one more replaces the oldest that has sent no "
        "event yet, else it is refused with server_busy)",
    )
    flag(
        "header-timeout",
        float,
        DEFAULTS.header_timeout,
        "seconds a connection may take to send a request's line and headers (HTTP) or the "
        "HTTP/2 preface (gRPC); past it: 408 and closed",
    )
    flag(
        "idle-timeout",
        float,
        DEFAULTS.idle_timeout,
        "seconds a connection may idle: HTTP keep-alive between requests, a Realtime socket "
        "that sends no event, a gRPC connection with no call (GOAWAY; also its ping interval)",
    )
    flag(
        "http-body-timeout",
        float,
        DEFAULTS.http_body_timeout,
        "seconds an upload may send nothing before a 408 (the connection closes)",
    )
    flag("live-idle-timeout", float, DEFAULTS.live_idle_timeout, "seconds a live stream may idle")
    flag("live-workers", int, DEFAULTS.live_workers, "live decode steps run at once")
    flag(
        "live-lag-target",
        float,
        DEFAULTS.live_lag_target,
        "seconds of commit lag the live capacity is sized for (measured at start-up)",
    )
    flag(
        "max-live-streams",
        int,
        DEFAULTS.max_live_streams,
        "live streams at once, more are refused with server_busy (0: as many as the lag "
        "target holds, measured)",
    )
    flag(
        "live-compute",
        str,
        DEFAULTS.live_compute,
        "the encoder of live steps: model (as --compute), fp32, bf16 or int8 (APPROXIMATE: "
        "live finals have no exact reference; judged by lag and WER, docs/live.md), or auto "
        "(bf16 where the CPU runs it natively, AVX-512 BF16 or AMX, and --compute's encoder "
        "is fp32; else as --compute)",
    )
    flag(
        "live-window",
        str,
        DEFAULTS.live_window,
        "what a live step encodes: whole (the 30 s window) or short (the audio buffered + 2 s, "
        "at least 10 s, and the window's last second: APPROXIMATE, a step costs what its "
        "audio needs; docs/live.md)",
    )
    flag(
        "live-beam-size",
        int,
        DEFAULTS.live_beam_size,
        "beams of a live step's decode, 1..16 (1: greedy; a stream's policy may set its own): "
        "5 reads the words a file's beam-5 transcript reads, at a dearer step (docs/live.md)",
    )
    flag(
        "decode-processes",
        int,
        DEFAULTS.decode_processes,
        "encoded files decoded at once, each in a worker process that a crash in FFmpeg or "
        "libsndfile ends instead of the server (0: in the server's process)",
    )
    flag(
        "live-max-seconds",
        float,
        None,
        f"audio per live stream (default: --max-audio-seconds, at most {LIVE_MAX_SECONDS:g})",
    )
    flag("tls-cert", str, None, "PEM certificate chain: serve TLS (with --tls-key)")
    flag("tls-key", str, None, "PEM private key of --tls-cert")
    flag("auth-token", str, None, "require 'authorization: Bearer <token>' (prefer the file)")
    flag("auth-token-file", str, None, "file of accepted bearer tokens, one a line")
    for name, what in (("health", "grpc.health.v1.Health"), ("reflection", "server reflection")):
        env = f"XATTN_AUTH_EXEMPT_{name.upper()}"
        parser.add_argument(
            f"--auth-exempt-{name}",
            action=argparse.BooleanOptionalAction,
            default=_env(env, True, _bool),
            help=f"{what} needs no token (env {env}=1/0; default: exempt)",
        )
    parser.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=_env("XATTN_METRICS", True, _bool),
        help="Prometheus metrics on the HTTP port's /metrics (and --metrics-port) (env "
        "XATTN_METRICS=1/0; default: on)",
    )
    flag(
        "metrics-port",
        int,
        None,
        "also serve /metrics alone on this port (for a server without --http-port); 0 picks "
        "a free one",
    )
    flag("metrics-port-file", str, None, "write the bound metrics port to this file")
    flag("log-level", str, "INFO", "logging level")
    flag("log-format", str, "text", "text (for a terminal) or json (one object a line)")
    args = parser.parse_args(argv)
    if not args.model:
        env = os.environ.get("XATTN_MODEL", "")
        args.model = [m.strip() for m in env.split(",") if m.strip()] or [DEFAULTS.model]
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    try:
        args.auth_tokens = read_tokens(args.auth_token, args.auth_token_file)
    except SecurityConfigError as e:
        parser.error(str(e))
    if args.log_format not in logs.FORMATS:
        parser.error(f"--log-format must be one of {', '.join(logs.FORMATS)}")
    if args.metrics_port is not None and not 0 <= args.metrics_port < 65536:
        parser.error("--metrics-port must be in 0..65535")
    if args.workers < 0 or args.max_queue < 0 or args.max_audio_seconds <= 0:
        parser.error("--workers must be >= 0, --max-queue >= 0, --max-audio-seconds > 0")
    if args.max_queue_wait <= 0 or args.memory_budget_mb < 0:
        parser.error("--max-queue-wait must be > 0, --memory-budget-mb >= 0")
    if args.http_port is not None and not 0 <= args.http_port < 65536:
        parser.error("--http-port must be in 0..65535")
    if args.wyoming_port is not None and not 0 <= args.wyoming_port < 65536:
        parser.error("--wyoming-port must be in 0..65535")
    if args.wyoming_mode not in ("streamed", "batch"):
        parser.error("--wyoming-mode must be streamed or batch")
    if args.wyoming_max_connections < 1:
        parser.error("--wyoming-max-connections must be >= 1")
    if args.max_message_mb <= 0:
        parser.error("--max-message-mb must be > 0")
    if args.compute not in COMPUTE_CHOICES:
        parser.error(f"--compute must be one of {', '.join(COMPUTE_CHOICES)}")
    if args.live_compute not in LIVE_COMPUTES:
        parser.error(f"--live-compute must be one of {', '.join(LIVE_COMPUTES)}")
    if args.live_window not in LIVE_WINDOWS:
        parser.error(f"--live-window must be one of {', '.join(LIVE_WINDOWS)}")
    if not 1 <= args.live_beam_size <= MAX_ROWS:
        parser.error(f"--live-beam-size must be in 1..{MAX_ROWS}")
    if args.decode_processes < 0:
        parser.error("--decode-processes must be >= 0")
    if min(args.header_timeout, args.idle_timeout, args.http_body_timeout) <= 0:
        parser.error("--header-timeout, --idle-timeout and --http-body-timeout must be > 0")
    if args.live_idle_timeout <= 0 or (args.live_max_seconds or 1) <= 0 or args.live_workers < 1:
        parser.error("--live-idle-timeout, --live-max-seconds and --live-workers must be > 0")
    if args.live_lag_target <= 0 or args.max_live_streams < 0:
        parser.error("--live-lag-target must be > 0 and --max-live-streams >= 0")
    return args


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model[0],
        more_models=tuple(args.model[1:]),
        device=args.device,
        compute=args.compute,
        workers=args.workers,
        max_queue=args.max_queue,
        max_queue_wait=args.max_queue_wait,
        memory_budget_mb=args.memory_budget_mb,
        max_audio_seconds=args.max_audio_seconds,
        max_message_mb=args.max_message_mb,
        grace=args.grace,
        port_file=args.port_file,
        http_port=args.http_port,
        http_host=args.http_host,
        http_port_file=args.http_port_file,
        wyoming_port=args.wyoming_port or None,  # 0: off, as unset
        wyoming_port_file=args.wyoming_port_file,
        wyoming_streaming=args.wyoming_mode == "streamed",
        wyoming_zeroconf=args.wyoming_zeroconf,
        wyoming_max_connections=args.wyoming_max_connections,
        cors_origins=tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
        live_idle_timeout=args.live_idle_timeout,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        http_body_timeout=args.http_body_timeout,
        live_max_seconds=args.live_max_seconds,
        live_workers=args.live_workers,
        live_lag_target=args.live_lag_target,
        max_live_streams=args.max_live_streams,
        live_compute=args.live_compute,
        live_window=args.live_window,
        live_beam_size=args.live_beam_size,
        decode_processes=args.decode_processes,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        auth_tokens=args.auth_tokens,
        auth_exempt_health=args.auth_exempt_health,
        auth_exempt_reflection=args.auth_exempt_reflection,
        metrics=args.metrics,
        metrics_port=args.metrics_port,
        metrics_port_file=args.metrics_port_file,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    config = config_from_args(args)
    if config.auth_tokens and not config.tls_cert and config.host not in LOOPBACK:
        log.warning("bearer tokens travel in cleartext: serve TLS (--tls-cert) or behind a proxy")
    try:
        asyncio.run(serve(config))
    except (ValueError, OSError) as e:  # a model that cannot load, a port that cannot bind
        log.error("cannot serve: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
