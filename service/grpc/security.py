"""TLS and bearer-token authentication on the gRPC face.

TLS: `server_credentials(cert, key)` reads a PEM certificate chain and its private key.
Auth: `AuthInterceptor` admits an RPC only when its metadata carries
`authorization: Bearer <token>` with one of the configured tokens (service.engine.tokens);
anything else ends in UNAUTHENTICATED before the request is even parsed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import grpc

from xattn.service.engine.tokens import AuthPolicy, SecurityConfigError, bearer, read_secret

log = logging.getLogger(__name__)


def server_credentials(cert_file: str | Path, key_file: str | Path) -> grpc.ServerCredentials:
    """TLS credentials from a PEM certificate chain and its PEM private key."""
    cert = read_secret(cert_file, "TLS certificate")
    key = read_secret(key_file, "TLS private key")
    if b"PRIVATE KEY" not in key:
        raise SecurityConfigError(f"{key_file} holds no PEM private key")
    if b"CERTIFICATE" not in cert:
        raise SecurityConfigError(f"{cert_file} holds no PEM certificate")
    return grpc.ssl_server_credentials([(key, cert)])


def _deny_handler(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts with UNAUTHENTICATED.

    The request stays unparsed (no deserializer): an unauthenticated caller's bytes are
    never handed to protobuf.
    """
    code = grpc.StatusCode.UNAUTHENTICATED

    async def unary(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def streaming(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await context.abort(code, message)
        yield  # pragma: no cover  (makes this an async generator)

    serialize = handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serialize)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, response_serializer=serialize)
    return grpc.stream_stream_rpc_method_handler(streaming, response_serializer=serialize)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every RPC without an accepted bearer token (exempt ones aside)."""

    def __init__(self, policy: AuthPolicy) -> None:
        if not policy.tokens:
            raise SecurityConfigError("auth is on but no token is configured")
        self.policy = policy
        self.denied = 0  # RPCs refused, for tests and operators

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or self.policy.exempt(method):
            return handler
        metadata = handler_call_details.invocation_metadata
        if self.policy.accepts(metadata):
            return handler
        self.denied += 1
        given = bearer(metadata) is not None
        log.warning("unauthenticated call to %s (%s token)", method, "wrong" if given else "no")
        why = "invalid bearer token" if given else "missing 'authorization: Bearer <token>'"
        return _deny_handler(handler, why)


def interceptors(
    tokens: Sequence[str], exempt_health: bool = True, exempt_reflection: bool = True
) -> list[grpc.aio.ServerInterceptor]:
    """The server's interceptors: [AuthInterceptor] when tokens are set, else none."""
    if not tokens:
        return []
    return [AuthInterceptor(AuthPolicy(tuple(tokens), exempt_health, exempt_reflection))]
