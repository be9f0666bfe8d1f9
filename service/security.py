"""Optional TLS and bearer-token authentication for the xattn server.

TLS: `server_credentials(cert, key)` reads a PEM certificate chain and its private key.
Auth: `AuthInterceptor` admits an RPC only when its metadata carries
`authorization: Bearer <token>` with one of the configured tokens (compared in constant
time); anything else ends in UNAUTHENTICATED before the request is even parsed. The health
and reflection services are exempt by default, so load balancers and grpcurl keep working.
Tokens come from a flag, the environment or a file (one token a line, for rotation); they
are never logged.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIXES = (
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
AUTHORIZATION = "authorization"
SCHEME = "bearer"  # case-insensitive, as in RFC 6750


class SecurityConfigError(ValueError):
    """A TLS or auth setting that cannot work (a missing file, an empty token)."""


def _read(path: str | Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    if not data.strip():
        raise SecurityConfigError(f"the {what} {path} is empty")
    return data


def server_credentials(cert_file: str | Path, key_file: str | Path) -> grpc.ServerCredentials:
    """TLS credentials from a PEM certificate chain and its PEM private key."""
    cert = _read(cert_file, "TLS certificate")
    key = _read(key_file, "TLS private key")
    if b"PRIVATE KEY" not in key:
        raise SecurityConfigError(f"{key_file} holds no PEM private key")
    if b"CERTIFICATE" not in cert:
        raise SecurityConfigError(f"{cert_file} holds no PEM certificate")
    return grpc.ssl_server_credentials([(key, cert)])


def read_tokens(token: str | None = None, token_file: str | Path | None = None) -> tuple[str, ...]:
    """The accepted tokens: `token`, plus each non-empty line of `token_file` ('#' comments)."""
    tokens: list[str] = []
    if token is not None:
        if not token.strip():
            raise SecurityConfigError("the auth token is empty")
        tokens.append(token.strip())
    if token_file is not None:
        lines = _read(token_file, "auth token file").decode("utf-8", "replace").splitlines()
        found = [t.strip() for t in lines if t.strip() and not t.lstrip().startswith("#")]
        if not found:
            raise SecurityConfigError(f"the auth token file {token_file} holds no token")
        tokens.extend(found)
    for t in tokens:
        if any(c.isspace() or not c.isprintable() for c in t):
            raise SecurityConfigError("an auth token must be printable, without spaces")
    return tuple(tokens)


def _bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the first `authorization: Bearer <token>` entry, if any."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, credential = text.strip().partition(" ")
        if scheme.lower() == SCHEME and credential.strip():
            return credential.strip().encode("utf-8", "replace")
        return None
    return None


@dataclass(frozen=True)
class AuthPolicy:
    tokens: tuple[str, ...]
    exempt_health: bool = True
    exempt_reflection: bool = True

    def exempt(self, method: str) -> bool:
        if self.exempt_health and method.startswith(HEALTH_PREFIX):
            return True
        return self.exempt_reflection and method.startswith(REFLECTION_PREFIXES)

    def accepts(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """Whether the metadata carries an accepted token (constant time in the token)."""
        given = _bearer(metadata)
        if given is None:
            return False
        ok = False
        for token in self.tokens:  # every token is compared: no early exit on a match
            ok |= hmac.compare_digest(given, token.encode("utf-8"))
        return ok


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
        given = _bearer(metadata) is not None
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
