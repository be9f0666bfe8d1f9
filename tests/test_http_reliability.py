"""Hostile HTTP requests get their status and the server keeps serving: a huge field, many
files, many fields, a truncated multipart body, a stalled upload, a lying Content-Length,
and random multipart forms (hypothesis); after each, a good request is served."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_client import multipart
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig

BODY_TIMEOUT = 0.5  # seconds a stalled upload is given here (the server's default is 30)
FORMS = 60  # random forms per run


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    pipe: Pipeline = load_pipeline("tiny.en")
    config = ServerConfig(
        port=0, http_port=0, max_message_mb=2, http_body_timeout=BODY_TIMEOUT, max_queue=16
    )
    with BackgroundServer(config, pipe) as running:
        yield running


def raw(address: str, head: bytes, body: bytes = b"") -> bytes:
    """Send bytes as they are, return what the server answered (until it closes)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and _complete(answer):
                break
        return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def post(address: str, body: bytes, content_type: str, length: int | None = None) -> bytes:
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body) if length is None else length}"
        "\r\nConnection: close\r\n\r\n"
    ).encode()
    return raw(address, head, body)


def status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body).get("error", {}) if body.startswith(b"{") else {}


def served(address: str, jfk: bytes) -> None:
    """A good request after the hostile one: 200 and the text."""
    body, kind = multipart([("file", "jfk.flac", jfk), ("beam_size", None, b"1")])
    status, _ = status_and_error(post(address, body, kind))
    assert status == 200


@pytest.fixture(scope="module")
def jfk(jfk_path: Path) -> bytes:
    return jfk_path.read_bytes()


def test_huge_field(server: BackgroundServer, jfk: bytes) -> None:
    body, kind = multipart([("file", "a.flac", jfk), ("prompt", None, b"x" * (200 << 10))])
    status, error = status_and_error(post(server.http_address, body, kind))
    assert status == 400 and "exceeded maximum size" in error["message"]
    served(server.http_address, jfk)


def test_many_files_and_fields(server: BackgroundServer, jfk: bytes) -> None:
    body, kind = multipart([("file", f"{i}.flac", b"abc") for i in range(5)])
    status, error = status_and_error(post(server.http_address, body, kind))
    assert status == 400 and "files" in error["message"].lower()
    body, kind = multipart([("file", "a.flac", jfk), *((f"f{i}", None, b"1") for i in range(500))])
    status, error = status_and_error(post(server.http_address, body, kind))
    assert status == 400 and "fields" in error["message"].lower()
    served(server.http_address, jfk)


def test_over_the_limit_is_413_by_header_or_by_count(server: BackgroundServer, jfk: bytes) -> None:
    big = b"\0" * (3 << 20)
    body, kind = multipart([("file", "big.wav", big)])
    status, error = status_and_error(post(server.http_address, body, kind))
    assert status == 413 and error["code"] == "request_too_large"
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    chunks = b"".join(b"%x\r\n" % len(body[i : i + 65536]) + body[i : i + 65536] + b"\r\n"
                      for i in range(0, len(body), 65536)) + b"0\r\n\r\n"  # fmt: skip
    status, error = status_and_error(raw(server.http_address, head, chunks))
    assert status == 413 and error["code"] == "request_too_large"  # counted, no length given
    served(server.http_address, jfk)


def test_truncated_multipart(server: BackgroundServer, jfk: bytes) -> None:
    body, kind = multipart([("file", "jfk.flac", jfk), ("model", None, b"whisper-1")])
    cut = body[: len(body) // 2]  # the body ends inside the file part, its length says so
    status, error = status_and_error(post(server.http_address, cut, kind))
    assert status == 400 and error["param"] == "file"
    served(server.http_address, jfk)


def test_stalled_upload_is_408(server: BackgroundServer, jfk: bytes) -> None:
    body, kind = multipart([("file", "jfk.flac", jfk)])
    status, error = status_and_error(post(server.http_address, body[:1000], kind, len(body)))
    assert status == 408 and error["code"] == "upload_timeout"
    served(server.http_address, jfk)


def test_not_a_form(server: BackgroundServer, jfk: bytes) -> None:
    status, error = status_and_error(post(server.http_address, b'{"file": 1}', "application/json"))
    assert status == 400 and error["param"] == "file"
    status, error = status_and_error(
        post(server.http_address, b"--x\r\ngarbage", "multipart/form-data; boundary=x")
    )
    assert status == 400
    served(server.http_address, jfk)


FIELD_NAMES = st.sampled_from(
    ["file", "model", "language", "prompt", "response_format", "temperature", "stream",
     "timestamp_granularities[]", "include[]", "beam_size", "vad_filter", "chunking_strategy",
     "attention_heads", "hotwords", "suppress_tokens", "x\"y", ""]
)  # fmt: skip
VALUES = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"json", b"verbose_json", b"word", b"true", b"en", b"-1", b"1e309",
                     b"attention", b"auto", b'{"type": "server_vad"}', b"0:0", b"nan"]),
)  # fmt: skip


@settings(max_examples=FORMS, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    parts=st.lists(st.tuples(FIELD_NAMES, st.one_of(st.none(), st.just("a.wav")), VALUES),
                   max_size=8)
)  # fmt: skip
def test_random_forms_get_a_status_never_a_crash(server: BackgroundServer, parts: list) -> None:
    body, kind = multipart(parts)
    status, error = status_and_error(post(server.http_address, body, kind))
    assert status in (200, 400, 404, 413), (status, error)
    if status != 200:
        assert error["message"] and error["type"] == "invalid_request_error"


def test_serving_after_the_random_forms(server: BackgroundServer, jfk: bytes) -> None:
    served(server.http_address, jfk)
    assert server.engine.counters().in_flight == 0


def test_a_stream_outlives_the_upload_timeout(
    server: BackgroundServer, multilingual_path: Path
) -> None:
    """The body timeout is for uploads: a stream of 60 s of audio (several seconds of
    decoding, many times BODY_TIMEOUT) runs to its done while the server listens for the
    client's disconnect."""
    body, kind = multipart([("file", "m.mp3", multilingual_path.read_bytes()),
                            ("stream", None, b"true")])  # fmt: skip
    answer = post(server.http_address, body, kind)
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"type":"transcript.text.done"' in answer and b'"type":"error"' not in answer
