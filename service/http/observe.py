"""The HTTP face's requests, reported to the engine's observer (xattn.service.engine.observe).

`RequestReports` (ASGI middleware, outermost in the face) reports every HTTP request and
WebSocket session: face "http", the route's path as the method (`/v1/audio/transcriptions`,
`/v1/models/{model}`, ...; `other` for a path with no route), and the status code it ended
with: the response's status once its body is complete; 499 when the client hung up first (a
hang-up is cancelled, not failed); 500 when the app raised before answering. A WebSocket
session that was accepted counts as 101 (its duration: the session's), one closed before it
was accepted as 403. An `X-Request-Id` header names the request (one is made otherwise) and
comes back on the response.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from xattn.service.engine.observe import Observer

HUNG_UP = "499"  # nginx's "client closed request"
REQUEST_ID = b"x-request-id"


class RequestReports:
    def __init__(self, app: ASGIApp, observer: Observer, routes: Sequence[BaseRoute]) -> None:
        self.app, self.observer, self.routes = app, observer, routes

    def _route(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:  # its path without convertors: /v1/models/{model}
                return re.sub(r":\w+\}", "}", str(getattr(route, "path", "other")))
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(REQUEST_ID)
        request_id = given.decode("latin-1") if given else None
        scope_ = self.observer.request("http", self._route(scope), request_id)
        status: str | None = None
        complete = hung_up = False

        async def watched_receive() -> Message:
            nonlocal hung_up
            message = await receive()
            if message["type"] in ("http.disconnect", "websocket.disconnect"):
                hung_up = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal status, complete
            kind = message["type"]
            if kind == "http.response.start":
                status = str(message["status"])
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID, scope_.request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            elif kind == "http.response.body":
                complete = not message.get("more_body", False)
            elif kind == "websocket.accept":
                status, complete = "101", True
            elif kind == "websocket.close" and status is None:
                status, complete = "403", True
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        except BaseException:
            scope_.end(HUNG_UP if hung_up else (status if complete and status else "500"))
            raise
        if scope["type"] == "websocket":
            scope_.end(status or "500")
        else:
            scope_.end(status if complete and status else HUNG_UP if hung_up else "500")
