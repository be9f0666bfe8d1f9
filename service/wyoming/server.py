"""The Wyoming face's listener: the `wyoming` library's AsyncServer on a socket bound before
the model loads (as the gRPC and HTTP ports are), a handler per connection on the engine.

At most `max_connections` connections at once: one more takes the place of the oldest that
has not sent a whole event yet (that one gets an `error`, server_busy, and is closed: a flood
of silent connections cannot lock out clients that speak), or, when every connection has
spoken, gets the `error` itself and is closed. `stop(grace)` stops accepting, closes the
connections with nothing in progress, gives those with a command in progress up to `grace`
seconds to finish it (each closes once its answer is sent), then closes the rest.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from functools import partial

from wyoming.error import Error
from wyoming.event import async_write_event
from wyoming.server import AsyncServer, HandlerFactory

from xattn.service.engine.engine import Engine, Overloaded
from xattn.service.engine.errors import fault_of
from xattn.service.engine.sockets import listen
from xattn.service.wyoming.handler import LINE_LIMIT, WyomingHandler, WyomingSettings

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket for this face (OSError naming the address when it cannot bind)."""
    return listen(host, port, "Wyoming", 256)


class WyomingServer(AsyncServer):
    """`start()`, later `stop(grace)`; `port` is known from construction on."""

    def __init__(self, engine: Engine, settings: WyomingSettings, sock: socket.socket) -> None:
        super().__init__()
        self.engine, self.settings, self.sock = engine, settings, sock
        self.port: int = sock.getsockname()[1]
        self.refused = 0  # connections refused at the limit
        self._server: asyncio.Server | None = None

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> WyomingHandler:
        return WyomingHandler(reader, writer, self.engine, self.settings)

    async def start(self, handler_factory: HandlerFactory | None = None) -> None:
        accept = partial(self._accept, handler_factory or self.handler)
        self._server = await asyncio.start_server(accept, sock=self.sock, limit=LINE_LIMIT)

    async def run(self, handler_factory: HandlerFactory) -> None:
        await self.start(handler_factory)
        assert self._server is not None
        await self._server.serve_forever()

    async def _accept(
        self, factory: HandlerFactory, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(self._handlers) < self.settings.max_connections:
            await self._handler_callback(factory, reader, writer)
            return
        silent = self._silent()
        if silent is not None:  # full of connections that said nothing: make room
            log.debug("wyoming: closed %s (no event yet) to make room", silent.peer)
            await silent.evict(
                Overloaded(
                    "server full: this connection sent no event yet and was closed to make "
                    "room for another; send an event (describe) as soon as you connect",
                    1000,
                )
            )
            await self._handler_callback(factory, reader, writer)
            return
        self.refused += 1
        busy = Overloaded(
            f"server busy: {len(self._handlers)} Wyoming connections open, this server's "
            "limit; retry in about 1000 ms",
            1000,
        )
        fault = fault_of(busy)
        assert fault is not None
        log.info("wyoming: refused a connection (%d open, the limit)", len(self._handlers))
        try:
            await async_write_event(Error(text=str(busy), code=fault.code).event(), writer)
        except ConnectionError:
            pass
        writer.close()

    def _silent(self) -> WyomingHandler | None:
        """The oldest connection that has not sent a whole event (nor been evicted)."""
        for handler in self._handlers.values():
            if isinstance(handler, WyomingHandler) and handler.silent:
                return handler
        return None

    @property
    def connections(self) -> int:
        return len(self._handlers)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop accepting; commands in progress get up to `grace` s; then close every
        connection."""
        if self._server is not None:
            self._server.close()
        handlers = dict(self._handlers)
        busy = [t for t, h in handlers.items() if isinstance(h, WyomingHandler) and h.busy]
        for task, handler in handlers.items():
            if isinstance(handler, WyomingHandler):
                handler.draining = True
            if task not in busy:
                await handler.stop()
        if busy and grace > 0:
            log.info("wyoming: %d commands in progress get up to %.1f s", len(busy), grace)
            await asyncio.wait(busy, timeout=grace)
        await super().stop()  # the rest, at once
        if handlers:
            await asyncio.gather(*handlers, return_exceptions=True)
