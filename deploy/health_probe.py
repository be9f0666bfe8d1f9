#!/usr/bin/env python3
"""Container health probe: exit 0 only when the local xattn server answers SERVING.

    python deploy/health_probe.py [--host 127.0.0.1] [--port $XATTN_PORT] [--service NAME]
                                  [--ca PEM] [--server-name NAME] [--timeout 3]

Asks the standard gRPC health service (grpc.health.v1.Health/Check) of the server in the
same container. Exit status: 0 SERVING; 1 anything else (NOT_SERVING while the model loads
or once shutdown has begun, UNKNOWN, no answer within --timeout, connection refused,
UNAUTHENTICATED). One line on stdout/stderr says which, so `docker inspect` shows it in the
health log. Used by the Dockerfile's HEALTHCHECK and docker-compose.yml's server healthcheck.

It reads the server's own environment, so it follows the server when TLS or auth is on:
- TLS when XATTN_TLS_CERT is set (or --ca / XATTN_PROBE_CA), trusting --ca, else the server's
  certificate chain itself (right for a self-signed certificate); --server-name
  (XATTN_PROBE_SERVER_NAME) when the certificate does not name 127.0.0.1;
- a bearer token, the first of XATTN_AUTH_TOKEN or XATTN_AUTH_TOKEN_FILE, when one is set
  (the health service needs none unless the server runs with --no-auth-exempt-health).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


def env(name: str) -> str | None:
    return os.environ.get(name) or None


def bearer_token() -> str | None:
    """The first token the server accepts, from its own environment; None without auth."""
    if token := env("XATTN_AUTH_TOKEN"):
        return token.strip()
    if path := env("XATTN_AUTH_TOKEN_FILE"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            return None
        tokens = (line.strip() for line in lines)  # as the server reads it: no blanks, no #
        return next((t for t in tokens if t and not t.startswith("#")), None)
    return None


def channel_for(args: argparse.Namespace) -> grpc.Channel:
    target = f"{args.host}:{args.port}"
    ca = args.ca or env("XATTN_TLS_CERT")
    if ca is None:
        return grpc.insecure_channel(target)
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes())
    return grpc.secure_channel(target, credentials, options=options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="health_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("XATTN_PORT") or 50051),
        help="default $XATTN_PORT, else 50051",
    )
    parser.add_argument(
        "--service", default="", help='health service name; "" (default) is the whole server'
    )
    parser.add_argument(
        "--ca", default=env("XATTN_PROBE_CA"), help="PEM roots for TLS (env XATTN_PROBE_CA)"
    )
    parser.add_argument(
        "--server-name",
        default=env("XATTN_PROBE_SERVER_NAME"),
        help="TLS name to expect (env XATTN_PROBE_SERVER_NAME)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    args = parser.parse_args(argv)

    target = f"{args.host}:{args.port}"
    request = health_pb2.HealthCheckRequest(service=args.service)
    token = bearer_token()
    metadata = [("authorization", f"Bearer {token}")] if token else None
    try:
        with channel_for(args) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = stub.Check(request, timeout=args.timeout, metadata=metadata)
    except OSError as e:  # an unreadable CA file
        print(f"unhealthy: {target}: {e}", file=sys.stderr)
        return 1
    except grpc.RpcError as e:
        code = e.code().name if hasattr(e, "code") else "ERROR"
        print(f"unhealthy: {target}: {code}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != SERVING:
        print(f"unhealthy: {target}: {status}", file=sys.stderr)
        return 1
    print(f"healthy: {target}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
