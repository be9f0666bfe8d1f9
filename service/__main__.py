"""`python -m service` / `xattn-server`: run the xattn gRPC server.

Every flag also reads an environment variable (XATTN_HOST, XATTN_PORT, XATTN_MODEL, ...);
a flag on the command line wins over the environment, which wins over the default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence

from service.server import ServerConfig, serve

log = logging.getLogger("service")
DEFAULTS = ServerConfig()


def _env(var: str, default: object, kind: Callable[[str], object]) -> object:
    value = os.environ.get(var, "")
    if not value:
        return default
    try:
        return kind(value)
    except ValueError as e:
        raise SystemExit(f"bad {var}={value!r}: {e}") from e


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
    flag("model", str, DEFAULTS.model, "tiny.en, base, a CTranslate2 dir or an openai .pt")
    flag("device", str, DEFAULTS.device, "torch device")
    flag("workers", int, DEFAULTS.workers, "transcriptions decoded at once")
    flag("max-queue", int, DEFAULTS.max_queue, "transcriptions that may wait for a worker")
    flag("max-audio-seconds", float, DEFAULTS.max_audio_seconds, "longest audio accepted")
    flag("max-message-mb", float, DEFAULTS.max_message_mb, "largest message, MiB")
    flag("grace", float, DEFAULTS.grace, "seconds to drain in-flight RPCs on SIGTERM")
    flag("port-file", str, None, "write the bound port to this file once listening")
    flag("log-level", str, "INFO", "logging level")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.max_queue < 0 or args.max_audio_seconds <= 0:
        parser.error("--workers must be >= 1, --max-queue >= 0, --max-audio-seconds > 0")
    if args.max_message_mb <= 0:
        parser.error("--max-message-mb must be > 0")
    return args


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        device=args.device,
        workers=args.workers,
        max_queue=args.max_queue,
        max_audio_seconds=args.max_audio_seconds,
        max_message_mb=args.max_message_mb,
        grace=args.grace,
        port_file=args.port_file,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        asyncio.run(serve(config_from_args(args)))
    except (ValueError, OSError) as e:  # a model that cannot load, a port that cannot bind
        log.error("cannot serve: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
