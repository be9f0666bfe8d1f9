"""The gRPC face's requests, reported to the engine's observer (xattn.service.engine.observe).

`RequestInterceptor` reports every RPC of a registered method: face "grpc", the method's full
name without its leading slash (`xattn.v1.Transcriber/Transcribe`, `grpc.health.v1.Health/
Check`, ...), and the status the client got: the code an abort set, OK, CANCELLED when the
client went away (a hang-up is cancelled, not failed), DEADLINE_EXCEEDED when its deadline
passed, UNKNOWN for an exception that escaped. An `x-request-id` in the metadata names the
request in the logs (one is made otherwise). An unregistered method is not reported (gRPC
answers UNIMPLEMENTED before any handler runs).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from xattn.service.engine.observe import Observer, RequestScope

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
Context = grpc.aio.ServicerContext
REQUEST_ID = "x-request-id"
# (request streaming, response streaming) -> the handler's field that holds the behavior
KINDS = {
    (False, False): "unary_unary",
    (False, True): "unary_stream",
    (True, False): "stream_unary",
    (True, True): "stream_stream",
}


def _code(context: Any, error: BaseException | None) -> str:
    """The status the client gets, by how the handler ended."""
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        return "DEADLINE_EXCEEDED" if expired else "CANCELLED"
    code = context.code()
    if code is not None and code != grpc.StatusCode.OK:
        return str(code.name)
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return "UNKNOWN"  # what gRPC answers for an exception that escaped the handler
    return "OK"


class RequestInterceptor(grpc.aio.ServerInterceptor):
    """Reports each RPC's method, status and duration (see the module's text)."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = (details.method or "").lstrip("/")
        metadata = dict(details.invocation_metadata or ())
        given = metadata.get(REQUEST_ID)
        request_id = given if isinstance(given, str) else None

        def start() -> RequestScope:
            return self.observer.request("grpc", method, request_id)

        kind = KINDS[handler.request_streaming, handler.response_streaming]
        behavior = getattr(handler, kind)
        # a streaming handler either yields (an async generator) or writes to its context
        # and returns (a coroutine: the health service's Watch)
        observe = _streaming if inspect.isasyncgenfunction(behavior) else _unary
        return handler._replace(**{kind: observe(behavior, start)})


def _unary(behavior: Callable[..., Awaitable[Any]], start: Callable[[], RequestScope]) -> Any:
    async def observed(request: Any, context: Context) -> Any:
        scope, error = start(), None
        try:
            return await behavior(request, context)
        except BaseException as e:
            error = e
            raise
        finally:
            scope.end(_code(context, error))

    return observed


def _streaming(
    behavior: Callable[..., AsyncIterator[Any]], start: Callable[[], RequestScope]
) -> Any:
    async def observed(request: Any, context: Context) -> AsyncIterator[Any]:
        scope, error = start(), None
        try:
            async for response in behavior(request, context):
                yield response
        except BaseException as e:
            error = e
            raise
        finally:
            scope.end(_code(context, error))

    return observed
