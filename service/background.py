"""A Server on its own event loop in a background thread, for synchronous callers
(tests, benchmarks, notebooks): `with BackgroundServer(config, pipeline) as s: s.address`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from xattn.model.pipeline import Pipeline
from xattn.service.engine.engine import Engine
from xattn.service.server import Server, ServerConfig

T = TypeVar("T")


class BackgroundServer:
    """Starts at construction (model loaded and warmed up); `stop()` drains and joins."""

    def __init__(self, config: ServerConfig, pipeline: Pipeline | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="xattn-server", daemon=True
        )
        self._thread.start()
        try:
            self.server: Server = self.call(self._start(config, pipeline))
        except BaseException:
            self._end()
            raise
        self.address = f"{config.host}:{self.server.port}"
        self.http_address = f"{config.http_host or config.host}:{self.server.http_port}"

    @property
    def engine(self) -> Engine:
        return self.server.engine

    async def _start(self, config: ServerConfig, pipeline: Pipeline | None) -> Server:
        server = Server(config, pipeline)  # the grpc.aio server binds to this loop
        await server.start()
        await server.wait_ready()
        return server

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 300.0) -> T:
        """Run `coro` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, grace: float = 1.0) -> None:
        self.call(self.server.stop(grace))
        self._end()

    def _end(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
