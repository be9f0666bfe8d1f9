"""`xattn inspect --serve`: a local HTTP server (127.0.0.1) with the inspection page and a
Server-Sent Events endpoint that forwards the gRPC stream's events as they arrive.

GET /        the page (live mode: it opens /events)
GET /events  `id: n` / `data: {json}` per event; resumes after Last-Event-ID on reconnect;
             ends after the `done` (or `error`) event.

The transcription starts when the first page subscribes, so the heatmap grows in front of
whoever opened it; later pages get the events so far, then the rest as they come.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

KEEPALIVE_S = 10.0


class EventLog:
    """The events so far, shared between the stream thread and the HTTP handlers."""

    def __init__(self) -> None:
        self._events: list[str] = []
        self._closed = False
        self._cond = threading.Condition()

    def publish(self, event_json: str) -> None:
        with self._cond:
            self._events.append(event_json)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def wait(self, start: int, timeout: float) -> tuple[list[str], bool]:
        """Events from `start` on (waiting up to `timeout` s for one) and whether it ended."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._events) > start or self._closed, timeout)
            return self._events[start:], self._closed


def make_handler(
    page: bytes, events: EventLog, on_subscribe: Callable[[], None]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("http %s: " + format, self.address_string(), *args)

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", page)
            elif path == "/events":
                self._stream()
            elif path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, "image/x-icon", b"")
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _stream(self) -> None:
            try:
                start = int(self.headers.get("Last-Event-ID", "-1")) + 1
            except ValueError:
                start = 0
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            on_subscribe()
            try:
                while True:
                    batch, ended = events.wait(start, KEEPALIVE_S)
                    for i, data in enumerate(batch, start):
                        self.wfile.write(f"id: {i}\ndata: {data}\n\n".encode())
                    if not batch:
                        self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
                    start += len(batch)
                    if ended and not batch:
                        return
            except (BrokenPipeError, ConnectionResetError):
                log.debug("SSE client went away")

    return Handler


class LiveServer:
    """The HTTP server; `source` (JSON events) is pumped on a thread from the first
    subscription on, and `on_error` turns its failure into a last event."""

    def __init__(
        self,
        page: str,
        source: Callable[[], Iterable[str]],
        on_error: Callable[[BaseException], str],
        port: int = 0,
    ) -> None:
        self.events = EventLog()
        self._source = source
        self._on_error = on_error
        self._started = threading.Event()
        self._lock = threading.Lock()
        handler = make_handler(page.encode("utf-8"), self.events, self.start)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> None:
        """Start pumping events (once; later calls do nothing)."""
        with self._lock:
            if self._started.is_set():
                return
            self._started.set()
        threading.Thread(target=self._pump, name="xattn-live-pump", daemon=True).start()

    def _pump(self) -> None:
        try:
            for event_json in self._source():
                self.events.publish(event_json)
        except Exception as e:  # shown on the page; the CLI reports it too
            self.events.publish(self._on_error(e))
        finally:
            self.events.close()

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
