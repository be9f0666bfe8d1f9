"""`xattn live --serve [--port N] [--open]`: the browser's microphone, recognized live.

One process on 127.0.0.1 serves the page (the inspector with clients/render/assets/live.js:
the page's JS and CSS inline, no network) and bridges each WebSocket to one
StreamingRecognize over the path `xattn stream -` takes (streaming.stream_chunks, on a
thread): the browser never speaks gRPC, and the events it gets back are the inspector's
(stream_inspect.PageEvents: window_start, token, segment, interim, done; error; with --vad
speech_activity, shown beside the record button), one JSON array per live result.

The page's side of the WebSocket (GET /ws), in order:
    {"type": "start", "language": "en"}   text, once; language optional ("" or absent: the
                                           server's default)
    binary messages                        16 kHz mono little-endian int16, whole samples,
                                           at most MAX_MESSAGE bytes each
    {"type": "stop"}                       text, once: the stream half-closes; the rest of the
                                           finals and `done` follow, then the bridge closes
Anything else closes that one connection with a reason (1007 malformed, 1008 out of order
or unknown, 1009 too big), never the process. A page of another origin, or a request for
another Host (DNS rebinding), is refused with 403 before any WebSocket exists. Every tab has
its own stream; the server's admission decides how many run (RESOURCE_EXHAUSTED: the page
says the server is full). A failed stream (server gone) ends with an `error` event: the
page keeps its finals and shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import threading
import time
import webbrowser
from http import HTTPStatus
from typing import Any

from rich.console import Console
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from xattn.clients.api import Client, ServerError, Unreachable, alignment_options, connect
from xattn.clients.pcm import PcmQueue, SourceError
from xattn.clients.stream_inspect import PageEvents
from xattn.clients.streaming import LiveDone, LiveResult, live_config, stream_chunks
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

WS_PATH = "/ws"
MAX_MESSAGE = 1 << 16  # bytes: ~2 s of 16 kHz int16 (the page sends 40 ms)
MAX_TEXT = 1024  # bytes of a control message
MAX_TABS = 16  # WebSockets at once; the server's own admission limits the streams first
MALFORMED, OUT_OF_ORDER, TOO_BIG = 1007, 1008, 1009


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--serve", action="store_true", help="serve the page (the default)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--open", action="store_true", help="open the page in a browser")
    parser.add_argument(
        "--commit-margin", type=float, help="seconds of audio a token's attention must leave"
    )
    parser.add_argument(
        "--vad", action="store_true", help="voice activity detection: shown on the page"
    )


class ProtocolError(Exception):
    """What a page sent that closes its connection: `code` and the reason."""

    def __init__(self, code: int, reason: str) -> None:
        reason = reason.encode()[:120].decode(errors="ignore")  # a close reason: <= 123 bytes
        super().__init__(reason)
        self.code, self.reason = code, reason


class Bridge:
    """The page and its WebSockets, each bridged to a StreamingRecognize of `client`."""

    def __init__(
        self, client: Client, config: pb.StreamingRecognitionConfig, token: str | None
    ) -> None:
        from xattn.clients.render.html import page

        self.client, self.config, self.token = client, config, token
        info = client.info()
        heads = [[la, h] for la in range(info.n_text_layer) for h in range(info.n_text_head)]
        self.page = page(
            info,
            [tuple(h) for h in heads],  # type: ignore[misc]
            [],
            None,
            "microphone",
            scripts=("live.js", "live.css"),
            extra={"mic": {"ws": WS_PATH, "max_message": MAX_MESSAGE, "vad": config.vad}},
        ).encode("utf-8")
        self.port = 0
        self.tabs = 0
        self.streams = 0  # started, for the console

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def _hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Plain HTTP (the page) and the checks before a WebSocket handshake."""
        path = request.path.split("?", 1)[0]
        if request.headers.get("Host", "") not in self._hosts():
            return _response(HTTPStatus.FORBIDDEN, b"wrong Host: open the page at 127.0.0.1\n")
        if path == WS_PATH:
            origin = request.headers.get("Origin", "")
            if origin not in {f"http://{h}" for h in self._hosts()}:
                body = b"WebSocket refused: only this bridge's own page may connect\n"
                return _response(HTTPStatus.FORBIDDEN, body)
            if self.tabs >= MAX_TABS:
                return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"too many tabs\n")
            return None
        if path in ("/", "/index.html"):
            return _response(HTTPStatus.OK, self.page, "text/html; charset=utf-8", self._csp())
        if path == "/favicon.ico":
            return _response(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        return _response(HTTPStatus.NOT_FOUND, b"not found\n")

    def _csp(self) -> str:
        ws = " ".join(f"ws://{h}" for h in sorted(self._hosts()))
        return (
            "default-src 'none'; script-src 'unsafe-inline' blob:; style-src 'unsafe-inline'; "
            f"connect-src {ws}; media-src blob: data:; img-src data: blob:; worker-src blob:"
        )

    async def handle(self, ws: ServerConnection) -> None:
        self.tabs += 1
        try:
            await Tab(self, ws).run()
        finally:
            self.tabs -= 1

    async def serve_forever(self, port: int, ready: asyncio.Future[str] | None = None) -> None:
        async with serve(
            self.handle,
            "127.0.0.1",
            port,
            process_request=self.process_request,
            max_size=MAX_MESSAGE,
            max_queue=64,
            compression=None,
        ) as server:
            self.port = server.sockets[0].getsockname()[1]
            if ready is not None:
                ready.set_result(self.url)
            await server.serve_forever()


def _response(
    status: HTTPStatus, body: bytes, kind: str = "text/plain; charset=utf-8", csp: str = ""
) -> Response:
    headers = Headers(
        [("Content-Type", kind), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
    )
    if csp:
        headers["Content-Security-Policy"] = csp
    return Response(status.value, status.phrase, headers, body)


class Tab:
    """One WebSocket: its messages in order, its stream on a thread, its events back."""

    def __init__(self, bridge: Bridge, ws: ServerConnection) -> None:
        self.bridge, self.ws = bridge, ws
        self.loop = asyncio.get_running_loop()
        self.out: asyncio.Queue[str | None] = asyncio.Queue()
        self.chunks = PcmQueue()
        self.abandoned = threading.Event()  # the page went away or broke the protocol
        self.state = "new"  # new -> streaming -> stopping

    async def run(self) -> None:
        sender = asyncio.create_task(self._send())
        try:
            async for message in self.ws:
                self._take(message)
            if self.state != "stopping":  # the page closed before stop: drop its stream
                self._abandon()
        except ProtocolError as e:
            log.info("closing a page's WebSocket: %s", e.reason)
            self._abandon()
            await self.ws.close(e.code, e.reason)
        except ConnectionClosed:  # the page went away, or sent too big a message (1009)
            self._abandon()
        if self.state == "new":
            sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)

    def _take(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            if self.state != "streaming":
                raise ProtocolError(OUT_OF_ORDER, f"audio while {self.state}: send start first")
            if len(message) % 2:
                raise ProtocolError(MALFORMED, f"audio of {len(message)} bytes: not int16 samples")
            self.chunks.put(message)
            return
        if len(message) > MAX_TEXT:
            raise ProtocolError(TOO_BIG, f"a control message over {MAX_TEXT} bytes")
        try:
            control = json.loads(message)
            kind = control["type"]
        except (ValueError, TypeError, KeyError) as e:
            raise ProtocolError(MALFORMED, f"not a control message: {e}") from e
        if kind == "start" and self.state == "new":
            language = control.get("language") or None
            if language is not None and not (isinstance(language, str) and len(language) < 16):
                raise ProtocolError(MALFORMED, "start.language must be a short string")
            self.state = "streaming"
            threading.Thread(target=self._pump, args=(language,), daemon=True).start()
        elif kind == "stop" and self.state == "streaming":
            self.state = "stopping"
            self.chunks.end()
        elif kind in ("start", "stop"):
            raise ProtocolError(OUT_OF_ORDER, f"{kind} while {self.state}")
        else:
            raise ProtocolError(OUT_OF_ORDER, f"unknown message type {str(kind)[:40]!r}")

    def _abandon(self) -> None:
        self.abandoned.set()
        self.chunks.stop.set()

    def _emit(self, events: list[dict[str, Any]] | None) -> None:
        """Send `events` as one text message (a JSON array); None ends the sending."""
        text = None if events is None else json.dumps(events, separators=(",", ":"))
        self.loop.call_soon_threadsafe(self.out.put_nowait, text)

    def _pump(self, language: str | None) -> None:
        """The stream, on its own thread: page events out, until done, failure or abandon."""
        config = pb.StreamingRecognitionConfig()
        config.CopyFrom(self.bridge.config)
        config.language = language or config.language
        translate = PageEvents(config.language)
        b = self.bridge
        b.streams += 1
        self._emit([{"type": "started", "stream": b.streams}])
        try:
            for event in stream_chunks(b.client, self.chunks, config, b.token):
                if self.abandoned.is_set():
                    break
                received = round(time.time() * 1000, 1)  # epoch ms: the page's delay after it
                events = translate(event)
                for ev in events:
                    if ev["type"] == "segment" and isinstance(event, LiveResult):
                        ev["bridge_ms"] = received
                        ev["bridge_sent_s"] = round(event.sent_seconds, 3)  # audio forwarded
                self._emit(events)  # one message: the page draws once per result
                if isinstance(event, LiveDone):
                    log.info("stream %d done: %s", b.streams, event.text.strip())
        except ServerError as e:
            self._emit([{"type": "error", "code": e.code, "message": e.details}])
        except Unreachable as e:
            self._emit([{"type": "error", "code": "UNAVAILABLE", "message": str(e)}])
        except Exception as e:  # the page shows it; this tab's stream only
            log.exception("stream failed")
            self._emit([{"type": "error", "code": type(e).__name__, "message": str(e)}])
        finally:
            self._emit(None)

    async def _send(self) -> None:
        while (text := await self.out.get()) is not None:
            try:
                await self.ws.send(text)
            except ConnectionClosed:
                return
        await self.ws.close(1000, "stream ended")


def run(args: argparse.Namespace, console: Console) -> int:
    """Serve until Ctrl-C; raises xattn.clients.api's errors (cli maps them)."""
    config = live_config(language=args.language, commit_margin=args.commit_margin, vad=args.vad)
    config.alignment.CopyFrom(alignment_options("all", "float16"))  # every head: the views
    with connect(args.server, ca_file=args.ca, timeout=args.timeout, token=args.token) as client:
        bridge = Bridge(client, config, args.token)

        async def main() -> None:
            ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            serving = asyncio.create_task(bridge.serve_forever(args.port, ready))
            done, _ = await asyncio.wait([ready, serving], return_when=asyncio.FIRST_COMPLETED)
            if serving in done:
                try:
                    serving.result()  # it ended before listening: it could not bind
                except OSError as e:
                    where = f"127.0.0.1:{args.port}"
                    raise SourceError(f"cannot listen on {where}: {e.strerror or e}") from e
            console.print(
                f"live page at {bridge.url} (press record there; Ctrl-C stops)",
                soft_wrap=True,
                highlight=False,
            )
            console.file.flush()
            if args.open:
                webbrowser.open(bridge.url)
            await serving

        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            console.print("stopped")
    return 0
