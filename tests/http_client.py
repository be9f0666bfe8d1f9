"""Plain HTTP for the HTTP API's tests, below the SDK: forms built byte for byte, requests
whose errors are answers."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from email.message import Message


def multipart(parts: list[tuple[str, str | None, bytes]]) -> tuple[bytes, str]:
    """(body, content type) of a form: (name, filename or None, value) per part."""
    boundary = uuid.uuid4().hex
    body = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        body += value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def http(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Message, bytes]:
    """(status, headers, body) of one request; an error status is returned, not raised."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()
