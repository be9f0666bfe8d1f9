"""Several servers behind one channel: the target, `round_robin` and gRPC's retry policy.

`xattn.clients.api.connect` takes one address or several. The channel it opens balances
every call (not every connection) over all the addresses with gRPC's `round_robin`, and
gRPC itself retries a call that failed with UNAVAILABLE (a replica loading, draining for a
deploy, or gone), RESOURCE_EXHAUSTED (a full replica) or CANCELLED from the other end (a
balancer that reset the call because the replica it forwarded it to died before answering:
HAProxy's RST_STREAM(CANCEL); a cancel of the caller's own is never retried), as long as no
response has arrived: for `Transcribe` that is the whole call (it answers once, at the end), for a
stream until its first event. A RESOURCE_EXHAUSTED carries the server's
`grpc-retry-pushback-ms`, which gRPC's retries obey instead of their own backoff. A stream
that has already sent events is not retried: its caller gets the error.

Targets (what `channel_target` makes of an address):

- `host:port`: one name; gRPC's DNS resolver uses every address it resolves to;
- `h1:port,h2:port,...`: several; IP literals become an `ipv4:`/`ipv6:` target, names are
  resolved here, once (a name that resolves to nothing raises ValueError);
- a gRPC target with a scheme, used as it is: `dns:///xattn-headless.default.svc:50051`
  (a Kubernetes headless Service: one address per ready pod, re-resolved when a connection
  fails), `ipv4:10.0.0.1:50051,10.0.0.2:50051`, `unix:/run/xattn.sock`.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any

SERVICE = "xattn.v1.Transcriber"
SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
# gRPC's own cap is 5 attempts; the backoff between them is random in [0, current) and
# grows 2x from 0.5 s to at most 5 s, unless the server's pushback says how long to wait: the
# 5 attempts span ~4 s on average (7.5 s at most), which rides out a balancer that has no
# server up for a few seconds (a drain and a crash at once on a busy host)
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.5s",
    "maxBackoff": "5s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED"],
}
# a request is replayed from a buffer: room for the largest audio a server accepts (64 MiB)
RETRY_BUFFER_BYTES = 64 << 20


@dataclass(frozen=True)
class Target:
    target: str  # what grpc.insecure_channel / secure_channel take
    authority: str | None = None  # the :authority (and TLS name) when the target has none


def service_config() -> str:
    """The channel's service config (JSON): round_robin, and RETRY_POLICY on every method but
    StreamingRecognize (its own entry, the more specific, has none): live audio cannot wait
    out a full server's pushback, so its caller hears RESOURCE_EXHAUSTED at once."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "methodConfig": [
                {"name": [{"service": SERVICE}], "retryPolicy": RETRY_POLICY},
                {"name": [{"service": SERVICE, "method": "StreamingRecognize"}]},
            ],
        }
    )


def channel_options() -> list[tuple[str, Any]]:
    """Channel arguments that turn on the service config's balancing and retries."""
    return [
        ("grpc.service_config", service_config()),
        ("grpc.enable_retries", 1),
        ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
    ]


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port); ValueError when it is neither."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not HOST:PORT: {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"an IPv6 address needs brackets, [{host}]:{port}: {address!r}")
    return host, int(port)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve {host!r}: {e.strerror}") from e
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def channel_target(address: str) -> Target:
    """The gRPC target of `address` (see the module's docstring); ValueError if it is bad."""
    address = address.strip()
    if not address:
        raise ValueError("no server address")
    if address.startswith(SCHEMES):
        return Target(address)
    parts = [p.strip() for p in address.split(",") if p.strip()]
    if len(parts) == 1:  # gRPC's default: DNS, every address of the name
        return Target(parts[0])
    endpoints: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
    names = []
    for part in parts:
        host, port = split_host_port(part)
        ip = _ip(host)
        if ip is None:
            names.append(part)
        endpoints += [(ip, port)] if ip is not None else [(a, port) for a in _resolve(host, port)]
    endpoints = list(dict.fromkeys(endpoints))
    families = {ip.version for ip, _ in endpoints}
    if families == {6}:
        target = "ipv6:" + ",".join(f"[{ip}]:{port}" for ip, port in endpoints)
    else:  # gRPC's ipv4:/ipv6: targets hold one family: mixed lists keep the IPv4 ones
        target = "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in endpoints if ip.version == 4)
    return Target(target, names[0] if names else None)
