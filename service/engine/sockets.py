"""The faces' listening sockets: bound by the process before the model loads, so a port is
taken (or its error said) at once."""

from __future__ import annotations

import socket


def listen(host: str, port: int, face: str, backlog: int) -> socket.socket:
    """A non-blocking listening TCP socket on host:port (OSError naming the address and the
    face when it cannot bind)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({face}): {e.strerror or e}") from e
    sock.setblocking(False)
    return sock
