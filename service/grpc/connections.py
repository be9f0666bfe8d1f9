"""The gRPC face's deadlines on connections, against clients that hold them (hostile clients,
docs/operations.md): options for grpc.aio.server, all of them gRPC core's own."""

from __future__ import annotations


def connection_options(header_timeout: float, idle_timeout: float) -> list[tuple[str, int]]:
    """gRPC core's deadlines on connections (hostile clients, docs/operations.md): the TLS
    handshake and the client's HTTP/2 preface and SETTINGS within `header_timeout`; a
    connection with no call open for `idle_timeout` gets GOAWAY; one whose peer does not
    acknowledge our SETTINGS or a ping (keepalive every `idle_timeout`) within
    `header_timeout` is closed, a call open or not: half a message from a peer that is gone
    or speaks no HTTP/2 is not held. (A peer that answers pings and sends half a message is
    held as long as it keeps the connection: grpc has no per-message deadline.)"""
    header_ms = int(header_timeout * 1000)
    idle_ms = int(idle_timeout * 1000)
    return [
        ("grpc.server_handshake_timeout_ms", header_ms),
        ("grpc.max_connection_idle_ms", idle_ms),
        ("grpc.keepalive_time_ms", idle_ms),
        ("grpc.keepalive_timeout_ms", header_ms),
        ("grpc.http2.ping_timeout_ms", header_ms),  # any ping: BDP probes hold keepalive's
        ("grpc.http2.settings_timeout", header_ms),  # our SETTINGS unacknowledged: closed
        ("grpc.http2.max_pings_without_data", 0),  # keep pinging a call that sends nothing
        ("grpc.keepalive_permit_without_calls", 1),
    ]
