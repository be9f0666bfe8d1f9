"""The HTTP face: OpenAI's audio API on the same Engine as the gRPC servicer.

    POST /v1/audio/transcriptions, /v1/audio/translations   (multipart; stream=true: SSE)
    GET  /v1/models, /v1/models/{id}                           (OpenAI's list shape)
    WS   /v1/realtime?intent=transcription                     (service.http.realtime)
    GET  /health                                               (200 SERVING, else 503)

A request goes through service.engine.admit.start_transcription, as a gRPC one does: the same
checks, defaults, admission and decoding; this module only reads forms and writes OpenAI's
shapes. Bearer tokens, body limits and CORS are the server's (ServerConfig).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from xattn.model.pipeline import Pipeline
from xattn.service.engine.admit import start_transcription
from xattn.service.engine.engine import Engine, Run
from xattn.service.engine.errors import ClientGone
from xattn.service.engine.live import LiveSettings
from xattn.service.engine.tokens import AuthPolicy
from xattn.service.http import shapes
from xattn.service.http.errors import ApiError, api_error, bad_param
from xattn.service.http.forms import FormRequest, check_model_language, parse_form
from xattn.service.http.models import pipeline_named
from xattn.service.http.observe import RequestReports
from xattn.service.http.realtime import realtime_session
from xattn.service.http.stream import Deltas, sse_events
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

MAX_FORM_FIELDS = 64  # the form's text fields
MAX_FIELD_BYTES = 64 << 10  # one text field (a prompt is at most 224 tokens)
BODY_IDLE_SECONDS = 30.0  # an upload that sends nothing for this long is cut off (408)


@dataclass(frozen=True)
class HttpSettings:
    """The server's side of the HTTP face."""

    max_body_bytes: int  # the same limit as a gRPC message
    auth_tokens: tuple[str, ...] = ()
    auth_exempt_health: bool = True
    cors_origins: tuple[str, ...] = ()  # none: no CORS headers, browsers of other origins refused
    live: LiveSettings = LiveSettings()
    body_idle_seconds: float = BODY_IDLE_SECONDS
    idle_seconds: float = 75.0  # a Realtime socket that sends no event is closed after this


class BodyLimit:
    """ASGI middleware: 413 for a body over the limit (by Content-Length, or counted as it
    arrives), 408 for an upload that stalls; the parsers never see more."""

    def __init__(self, app: ASGIApp, max_bytes: int, idle_seconds: float) -> None:
        self.app, self.max_bytes, self.idle = app, max_bytes, idle_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _too_large(self.max_bytes).response()(scope, receive, send)
        seen, complete = 0, False

        async def limited() -> Message:
            nonlocal seen, complete
            if complete:  # after the body: waiting for the disconnect (a stream's listener)
                return await receive()
            try:
                async with asyncio.timeout(self.idle):  # (wait_for may lose a cancel)
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408,
                    f"the upload sent nothing for {self.idle:g} s",
                    param="file",
                    code="upload_timeout",
                    close=True,  # the rest of the body is never read
                ) from None
            if message["type"] == "http.disconnect":  # mid-body: a hang-up (or a broken body)
                raise ClientGone("the client hung up before the whole request arrived")
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise dataclasses.replace(_too_large(self.max_bytes), close=True)
            complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited, send)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"the request is over the server's limit of {limit / 2**20:g} MiB: send a shorter "
        "or compressed file (FLAC, MP3, Opus)", param="file", code="request_too_large",
    )  # fmt: skip


class Api:
    """The routes, bound to one Engine."""

    def __init__(self, engine: Engine, settings: HttpSettings, serving: Callable[[], bool]) -> None:
        self.engine = engine
        self.settings = settings
        self.serving = serving
        self._auth = AuthPolicy(settings.auth_tokens)

    # --- auth ---
    def _authorized(self, headers: Headers) -> bool:
        """No tokens configured, or `Authorization: Bearer <one of them>` (engine.tokens)."""
        return not self._auth.tokens or self._auth.accepts(headers.items())

    def _check_auth(self, request: Request) -> None:
        if not self._authorized(request.headers):
            raise ApiError(
                401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                code="invalid_api_key",
            )  # fmt: skip

    # --- models ---
    def pipeline(self, name: str) -> Pipeline:
        return pipeline_named(self.engine, name)

    async def models(self, request: Request) -> Response:
        self._check_auth(request)
        return JSONResponse({"object": "list", "data": [_model(p) for p in self.engine.pipelines]})

    async def model(self, request: Request) -> Response:
        self._check_auth(request)
        return JSONResponse(_model(self.pipeline(request.path_params["model"])))

    async def health(self, request: Request) -> Response:
        if not self.settings.auth_exempt_health:
            self._check_auth(request)
        ready = self.serving()
        return JSONResponse(
            {"status": "SERVING" if ready else "NOT_SERVING"}, status_code=200 if ready else 503
        )

    # --- transcriptions ---
    async def transcriptions(self, request: Request) -> Response:
        return await self._transcribe(request, "transcribe")

    async def translations(self, request: Request) -> Response:
        return await self._transcribe(request, "translate")

    async def _transcribe(self, request: Request, task: str) -> Response:
        try:
            self._check_auth(request)
            form = await request.form(
                max_files=1, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES
            )
            try:
                parsed = await parse_form(form, task)
            finally:
                await form.close()
            pipe = self.pipeline(parsed.model)
            check_model_language(parsed, pipe.languages, pipe.name)
            if parsed.stream:
                return self._stream(parsed, pipe)
            return await self._unary(parsed, pipe)
        except (ClientGone, ClientDisconnect):
            log.info("http: the client hung up during its upload")
            return NoAnswer()
        except HTTPException as e:  # the multipart parser's: too many files or fields, ...
            return bad_param("file", f"bad multipart form: {e.detail}", "bad_form").response()
        except Exception as e:
            return api_error(e).response()

    def _start(self, parsed: FormRequest, pipe: Pipeline, stream: bool) -> Run:
        mode = (
            pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS if parsed.attention else pb.ALIGNMENT_MODE_NONE
        )
        return start_transcription(
            self.engine,
            pb.Audio(encoded=parsed.audio),
            parsed.options,
            parsed.alignment,
            pipe.name,
            mode,
            stream,
        )

    async def _unary(self, parsed: FormRequest, pipe: Pipeline) -> Response:
        if parsed.logprobs:
            raise bad_param("include", "include[]=logprobs is sent with stream=true")
        run = self._start(parsed, pipe, stream=False)
        async with aclosing(run.events()) as events:
            results = [r async for r in events]
        with self.engine.observer.span("xattn.response"):
            return _shaped(results[0], parsed, pipe)

    def _stream(self, parsed: FormRequest, pipe: Pipeline) -> Response:
        run = self._start(parsed, pipe, stream=True)  # admitted now: a 429 comes as a status
        return EventStream(run, sse_events(run.events(), parsed, Deltas(pipe.tokenizer)))

    # --- realtime ---
    async def realtime(self, websocket: WebSocket) -> None:
        if not self._authorized(websocket.headers):
            await websocket.close(code=1008, reason="missing or wrong bearer token")
            return
        await realtime_session(
            websocket, self.engine, self.settings.live, self.settings.idle_seconds
        )


class NoAnswer(Response):
    """No response at all: the client is gone (uvicorn closes the connection)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


class EventStream(StreamingResponse):
    """text/event-stream of a run's events; the run ends even if they are never read (the
    client went away before the first one)."""

    def __init__(self, run: Run, events: AsyncIterator[str]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self.run.abandon()


def _shaped(response: pb.TranscribeResponse, parsed: FormRequest, pipe: Pipeline) -> Response:
    """A transcription's result in the response_format asked for."""
    fmt = parsed.response_format
    if fmt in shapes.TEXT_TYPES:
        return PlainTextResponse(
            shapes.subtitles(response.transcript, fmt), media_type=shapes.TEXT_TYPES[fmt]
        )
    if fmt == "verbose_json":
        heads = shapes.heads_of(parsed.alignment, pipe.dims)
        return JSONResponse(shapes.verbose(response, parsed, heads))
    return JSONResponse(shapes.plain(response))


def _model(pipe: Pipeline) -> dict:
    return {"id": pipe.name, "object": "model", "created": 0, "owned_by": "xattn"}


def _guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as e:
            return api_error(e).response()

    return endpoint


def build_app(
    engine: Engine, settings: HttpSettings, serving: Callable[[], bool] | None = None
) -> ASGIApp:
    """The ASGI app of the HTTP face; `serving` tells /health (default: a model is loaded)."""
    api = Api(engine, settings, serving or (lambda: engine.ready))
    routes = [
        Route("/v1/audio/transcriptions", api.transcriptions, methods=["POST"]),
        Route("/v1/audio/translations", api.translations, methods=["POST"]),
        Route("/v1/models", _guarded(api.models), methods=["GET"]),
        Route("/v1/models/{model:path}", _guarded(api.model), methods=["GET"]),
        Route("/health", _guarded(api.health), methods=["GET"]),
        WebSocketRoute("/v1/realtime", api.realtime),
    ]
    middleware = []
    if settings.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type"],
            )
        )
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={404: _not_found})
    limited = BodyLimit(app, settings.max_body_bytes, settings.body_idle_seconds)
    if not engine.observer.active:
        return limited
    return RequestReports(limited, engine.observer, routes)  # every request, 413s included


async def _not_found(request: Request, exc: Exception) -> Response:
    return ApiError(
        404, f"no route {request.method} {request.url.path}", code="not_found"
    ).response()
