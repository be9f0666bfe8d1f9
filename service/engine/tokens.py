"""Bearer tokens, the same for every face: where they come from and how a request's are checked.

Tokens come from a flag, the environment or a file (one token a line, for rotation); they are
never logged. `AuthPolicy.accepts` compares in constant time; the gRPC health and reflection
services are exempt by default, so load balancers and grpcurl keep working.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIXES = (
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
AUTHORIZATION = "authorization"
SCHEME = "bearer"  # case-insensitive, as in RFC 6750


class SecurityConfigError(ValueError):
    """A TLS or auth setting that cannot work (a missing file, an empty token)."""


def read_secret(path: str | Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SecurityConfigError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    if not data.strip():
        raise SecurityConfigError(f"the {what} {path} is empty")
    return data


def read_tokens(token: str | None = None, token_file: str | Path | None = None) -> tuple[str, ...]:
    """The accepted tokens: `token`, plus each non-empty line of `token_file` ('#' comments)."""
    tokens: list[str] = []
    if token is not None:
        if not token.strip():
            raise SecurityConfigError("the auth token is empty")
        tokens.append(token.strip())
    if token_file is not None:
        lines = read_secret(token_file, "auth token file").decode("utf-8", "replace").splitlines()
        found = [t.strip() for t in lines if t.strip() and not t.lstrip().startswith("#")]
        if not found:
            raise SecurityConfigError(f"the auth token file {token_file} holds no token")
        tokens.extend(found)
    for t in tokens:
        if any(c.isspace() or not c.isprintable() for c in t):
            raise SecurityConfigError("an auth token must be printable, without spaces")
    return tuple(tokens)


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> bytes | None:
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
        given = bearer(metadata)
        if given is None:
            return False
        ok = False
        for token in self.tokens:  # every token is compared: no early exit on a match
            ok |= hmac.compare_digest(given, token.encode("utf-8"))
        return ok
