"""The HTTP face's connections against clients that hold them: a header deadline.

uvicorn (h11) waits for a request's line and headers for as long as the client likes: a
connection that opens and sends nothing, half a request line or half its headers is held
until the client goes (a probe held 2,000 of them for over 130 s). `GuardedH11` is uvicorn's
h11 protocol with one deadline more: from the connection's start, and again from the first
byte of each next request on a kept-alive connection, its line and headers must arrive
within `header_timeout` seconds. Past it the connection gets `408 Request Timeout` (closed
silently when it sent nothing at all, as an idle keep-alive one is) and is closed.

The other deadlines are uvicorn's and the app's: idle keep-alive connections close after
`timeout_keep_alive` (--idle-timeout); a body that stalls gets 408 from the app's BodyLimit
(--http-body-timeout); a WebSocket is the Realtime session's (service.http.realtime).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from xattn.service.engine.errors import ClientTimeout, fault_of

log = logging.getLogger(__name__)


def timeout_response(message: str) -> bytes:
    """A whole `408` response with OpenAI's error body and `Connection: close`."""
    fault = fault_of(ClientTimeout())
    assert fault is not None
    body = json.dumps(
        {"error": {"message": message, "type": fault.kind, "param": None, "code": fault.code}}
    ).encode()
    head = (
        f"HTTP/1.1 {fault.http} Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's line and headers."""

    header_timeout: float = 20.0  # set on a subclass by `guarded`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._got_bytes = False  # of the request being read
        self.logger = _Quiet(self.logger)  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self.conn.their_state is h11.IDLE  # no request line and headers yet
        if waiting and data:
            self._got_bytes = True
            if self._header_timer is None:  # kept alive: the next request's deadline starts
                self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._disarm()  # the headers are in (or the protocol refused them)

    def send_400_response(self, msg: str) -> None:
        """h11 refused the bytes (a broken request or body): 400 and close, the request's
        app told the client is gone (it must not answer on the closed connection)."""
        log.info("http: %s sent a broken request (%s): 400, closed", self._peer(), msg)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        try:
            super().send_400_response(msg)
        except h11.LocalProtocolError:  # a response was started already: just close
            self.transport.close()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._disarm()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms the keep-alive (idle) timeout
        self._got_bytes = False

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport.is_closing() or transport.get_protocol() is not self:
            return
        if self.conn.their_state is not h11.IDLE:
            return
        peer = self._peer()
        if self._got_bytes:
            log.info(
                "http: %s sent half a request for %g s: 408, closed", peer, self.header_timeout
            )
            transport.write(
                timeout_response(
                    f"the request line and headers did not arrive within {self.header_timeout:g} s"
                )
            )
        else:
            log.debug("http: %s sent nothing for %g s: closed", peer, self.header_timeout)
        transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


class _Quiet(logging.LoggerAdapter):
    """uvicorn's logger, with its warning about bytes that are not HTTP at INFO: a client's
    garbage is no trouble of the server's (send_400_response logs what it was)."""

    @property
    def level(self) -> int:
        return self.logger.level

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        if msg == "Invalid HTTP request received.":
            return
        super().warning(msg, *args, **kwargs)


def guarded(header_timeout: float) -> type[GuardedH11]:
    """GuardedH11 with this header deadline (uvicorn builds its protocols from a class)."""
    return type("GuardedH11", (GuardedH11,), {"header_timeout": header_timeout})
