"""The HTTP face's listener: uvicorn on the gRPC server's event loop.

The socket is bound before the model loads (as the gRPC port is), so its port is known at
once; `stop(grace)` stops accepting, lets in-flight requests finish for up to `grace`
seconds, then cancels the rest. The server process's own SIGTERM/SIGINT handling
(service.server.serve) drives it: uvicorn installs no signal handlers here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

from xattn.service.engine.sockets import listen
from xattn.service.http.connections import guarded

log = logging.getLogger(__name__)


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the gRPC server owns the signals
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket for this face (OSError naming the address when it cannot bind)."""
    return listen(host, port, "HTTP", 1024)


@dataclass(frozen=True)
class Timeouts:
    """Seconds a client may hold a connection: to send a request's line and headers
    (`header`), and idle between requests (`idle`, nginx's 75 s by default)."""

    header: float = 20.0
    idle: float = 75.0


class HttpServer:
    """`start()`, later `stop(grace)`."""

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        grace: float,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        timeouts = timeouts or Timeouts()
        self.sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http=guarded(timeouts.header),  # h11 with a deadline on each request's headers
            timeout_keep_alive=timeouts.idle,  # type: ignore[arg-type]  # a float will do
            ws="websockets-sansio",
            ws_max_size=16 << 20,  # a realtime event: base64 audio chunks
            timeout_graceful_shutdown=max(1, int(round(grace))),
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
        )
        self._server = _Uvicorn(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]))

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; in-flight requests get up to `grace` s (the config's when None)."""
        if self._task is None:
            return
        if grace is not None:
            self._server.config.timeout_graceful_shutdown = max(0, int(round(grace)))
        self._server.should_exit = True
        if grace == 0:
            self._server.force_exit = True
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
