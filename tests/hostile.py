"""Hostile clients, on raw sockets: each recipe opens one connection to a face, misbehaves,
and reports what the server did (what it sent back, whether and when it closed).

    seen = await RECIPES["http_half_headers"](host, port, wait=10.0)
    seen.closed, seen.seconds, seen.data

Used by tests/test_hostile.py (against each face of a real server on loopback) and by
benchmarks/hostile.py (the probe: many of them beside a steady valid client). Frames are
written by hand (HTTP/1.1, a WebSocket frame, HTTP/2 frames with literal HPACK headers, a
Wyoming header line) so that each is exactly as broken as its name says.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

MULTIPART = "multipart/form-data; boundary=xattnhostile"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(frozen=True)
class Seen:
    """What the server did to one hostile connection."""

    closed: bool  # the server closed it (EOF or reset) within the wait
    seconds: float  # from the misbehaviour to the close (or the end of the wait)
    data: bytes  # everything the server sent

    @property
    def status(self) -> int | None:
        """An HTTP/1.1 response's status, if the server sent one."""
        head = self.data.split(b"\r\n", 1)[0].split()
        return int(head[1]) if len(head) > 1 and head[0].startswith(b"HTTP/1.") else None


async def _open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port)


async def _until_close(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    wait: float,
    since: float,
    websocket: bool = False,
) -> Seen:
    """Read all the server sends until it closes the connection (or `wait` s pass); a
    `websocket` answers the server's pings and close frame, as a client does."""
    data = bytearray()
    echoed, pongs = False, 0
    closed = False
    deadline = since + wait
    try:
        while (left := deadline - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                closed = True
                break
            data += chunk
            if websocket:
                frames = ws_messages(bytes(data))
                for _, ping in [f for f in frames if f[0] == 9][pongs:]:
                    writer.write(ws_frame(0xA, ping))  # a live client answers pings
                    pongs += 1
                closes = [p for op, p in frames if op == 8]
                if closes and not echoed:
                    writer.write(ws_frame(0x8, closes[0][:2]))
                    echoed = True
    except TimeoutError:
        pass
    except ConnectionError:
        closed = True
    seconds = time.monotonic() - since
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    return Seen(closed, seconds, bytes(data))


async def _send_then_wait(host: str, port: int, data: bytes, wait: float) -> Seen:
    reader, writer = await _open(host, port)
    if data:
        writer.write(data)
        await writer.drain()
    return await _until_close(reader, writer, wait, time.monotonic())


# --- HTTP/1.1 (the HTTP face) ---
def _post_head(length: int | None, chunked: bool = False) -> bytes:
    head = f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: {MULTIPART}\r\n"
    if chunked:
        head += "Transfer-Encoding: chunked\r\n"
    elif length is not None:
        head += f"Content-Length: {length}\r\n"
    return (head + "\r\n").encode()


async def http_nothing(host: str, port: int, wait: float) -> Seen:
    """Connects and sends nothing."""
    return await _send_then_wait(host, port, b"", wait)


async def http_partial_request_line(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, b"POST /v1/audio/transcr", wait)


async def http_half_headers(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, _post_head(1000)[:60], wait)


async def http_stalled_body(host: str, port: int, wait: float) -> Seen:
    """Headers for a 1000-byte body, 100 bytes of it, then nothing."""
    body = b'--xattnhostile\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny'
    return await _send_then_wait(host, port, _post_head(1000) + body, wait)


async def http_broken_body(host: str, port: int, wait: float) -> Seen:
    """A chunked body whose second chunk's size is not a number."""
    data = _post_head(None, chunked=True) + b"10\r\n--xattnhostile\r\n\r\nzz-not-hex\r\n"
    return await _send_then_wait(host, port, data, wait)


async def http_hang_up_mid_body(host: str, port: int, wait: float) -> Seen:
    """Headers for a 1000-byte body, 10 bytes of it, then the client closes."""
    reader, writer = await _open(host, port)
    writer.write(_post_head(1000) + b"--xattnhos")
    await writer.drain()
    since = time.monotonic()
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass
    return Seen(True, time.monotonic() - since, b"")


async def http_idle_keep_alive(host: str, port: int, wait: float) -> Seen:
    """One valid request (GET /health), then an idle kept-alive connection."""
    reader, writer = await _open(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
    length = int(next(v for k, v in _headers(head) if k == b"content-length"))
    await asyncio.wait_for(reader.readexactly(length), wait)
    return await _until_close(reader, writer, wait, time.monotonic())


def _headers(head: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            out.append((k.strip().lower(), v.strip()))
    return out


# --- WebSocket (the Realtime face) ---
def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (FIN set)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    else:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _ws_open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await _open(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /v1/realtime?intent=transcription HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .encode()
    )  # fmt: skip
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise ConnectionError(f"no WebSocket upgrade: {head[:80]!r}")
    return reader, writer


def ws_messages(data: bytes) -> list[tuple[int, bytes]]:
    """The server's (unmasked) frames in `data`: (opcode, payload), whole ones only."""
    out, i = [], 0
    while i + 2 <= len(data):
        opcode, n = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if n == 126:
            (n,) = struct.unpack("!H", data[i : i + 2])
            i += 2
        elif n == 127:
            (n,) = struct.unpack("!Q", data[i : i + 8])
            i += 8
        if i + n > len(data):
            break
        out.append((opcode, data[i : i + n]))
        i += n
    return out


def ws_events(seen: Seen) -> list[dict]:
    """The JSON events of the text frames."""
    return [json.loads(p) for op, p in ws_messages(seen.data) if op == 1]


def ws_close_code(seen: Seen) -> int | None:
    closes = [p for op, p in ws_messages(seen.data) if op == 8]
    return struct.unpack("!H", closes[0][:2])[0] if closes and len(closes[0]) >= 2 else None


async def ws_binary_frame(host: str, port: int, wait: float) -> Seen:
    """Opens a Realtime session and sends a binary frame (events are JSON text)."""
    reader, writer = await _ws_open(host, port)
    writer.write(ws_frame(0x2, b"\x00\x01binary audio?"))
    await writer.drain()
    return await _until_close(reader, writer, wait, time.monotonic(), websocket=True)


async def ws_idle(host: str, port: int, wait: float) -> Seen:
    """Opens a Realtime session and sends nothing."""
    reader, writer = await _ws_open(host, port)
    return await _until_close(reader, writer, wait, time.monotonic(), websocket=True)


async def ws_hang_up(host: str, port: int, wait: float) -> Seen:
    """Opens a Realtime session, appends audio, and drops the TCP connection (no close)."""
    reader, writer = await _ws_open(host, port)
    event = {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()}
    writer.write(ws_frame(0x1, json.dumps(event).encode()))
    await writer.drain()
    since = time.monotonic()
    writer.transport.abort()
    return Seen(True, time.monotonic() - since, b"")


# --- HTTP/2 (the gRPC face) ---
def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream)


def _h2(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return h2_frame(kind, flags, stream, payload) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK: a literal header field without indexing, new name, no Huffman (short ones)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def grpc_call_head(path: bytes = b"/xattn.v1.Transcriber/Transcribe") -> bytes:
    """Preface, SETTINGS, and a HEADERS frame opening stream 1 for a call to `path`."""
    block = b"".join(
        _literal(k, v)
        for k, v in (
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
            (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        )
    )  # fmt: skip
    return H2_PREFACE + _h2(0x4, 0, 0, b"") + _h2(0x1, 0x4, 1, block)


async def grpc_no_preface(host: str, port: int, wait: float) -> Seen:
    """Connects and sends nothing (no HTTP/2 preface)."""
    return await _send_then_wait(host, port, b"", wait)


async def grpc_half_preface(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, H2_PREFACE[:10], wait)


async def grpc_garbage(host: str, port: int, wait: float) -> Seen:
    """An HTTP/1.1 request where the HTTP/2 preface is due."""
    return await _send_then_wait(host, port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", wait)


async def grpc_idle(host: str, port: int, wait: float) -> Seen:
    """The preface and SETTINGS, then nothing (no call)."""
    return await _send_then_wait(host, port, H2_PREFACE + _h2(0x4, 0, 0, b""), wait)


async def grpc_half_message(host: str, port: int, wait: float) -> Seen:
    """A Transcribe call whose message says 1000 bytes and brings 10; pings go unanswered."""
    data = grpc_call_head() + _h2(0x0, 0, 1, b"\x00" + struct.pack("!I", 1000) + bytes(10))
    return await _send_then_wait(host, port, data, wait)


async def grpc_hang_up(host: str, port: int, wait: float) -> Seen:
    """A Transcribe call with half its message, then the client drops the connection."""
    reader, writer = await _open(host, port)
    writer.write(grpc_call_head() + _h2(0x0, 0, 1, b"\x00" + struct.pack("!I", 1000) + bytes(10)))
    await writer.drain()
    since = time.monotonic()
    writer.transport.abort()
    return Seen(True, time.monotonic() - since, b"")


# --- Wyoming ---
async def wyoming_nothing(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, b"", wait)


async def wyoming_half_line(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, b'{"type": "audio-st', wait)


async def wyoming_not_json(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, b"GET / HTTP/1.1\r\n", wait)


async def wyoming_bad_event(host: str, port: int, wait: float) -> Seen:
    return await _send_then_wait(host, port, b'{"type": 7, "data_length": "x"}\n', wait)


async def wyoming_audio_before_start(host: str, port: int, wait: float) -> Seen:
    """An audio-chunk with no audio-start (an error; the connection goes on, then idles)."""
    chunk = json.dumps(
        {"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1},
         "payload_length": 320}
    ).encode()  # fmt: skip
    return await _send_then_wait(host, port, chunk + b"\n" + bytes(320), wait)


async def wyoming_drop_after_start(host: str, port: int, wait: float) -> Seen:
    """audio-start, then the client closes."""
    reader, writer = await _open(host, port)
    start = {"type": "audio-start", "data": {"rate": 16000, "width": 2, "channels": 1}}
    writer.write(json.dumps(start).encode() + b"\n")
    await writer.drain()
    since = time.monotonic()
    writer.transport.abort()
    return Seen(True, time.monotonic() - since, b"")


def wyoming_events(seen: Seen) -> list[dict]:
    """The events the server sent: the header line with its data (and payload) read by
    their lengths, as the protocol frames them; {type, data}."""
    out, data = [], seen.data
    while b"\n" in data:
        line, data = data.split(b"\n", 1)
        try:
            header = json.loads(line)
        except ValueError:
            break
        n, p = header.get("data_length") or 0, header.get("payload_length") or 0
        if len(data) < n + p:
            break
        fields = json.loads(data[:n]) if n else {}
        out.append({"type": header.get("type"), "data": {**header.get("data", {}), **fields}})
        data = data[n + p :]
    return out


Recipe = Callable[[str, int, float], Awaitable[Seen]]
RECIPES: dict[str, dict[str, Recipe]] = {
    "http": {
        "nothing": http_nothing,
        "partial_request_line": http_partial_request_line,
        "half_headers": http_half_headers,
        "stalled_body": http_stalled_body,
        "broken_body": http_broken_body,
        "hang_up_mid_body": http_hang_up_mid_body,
        "idle_keep_alive": http_idle_keep_alive,
    },
    "realtime": {"binary_frame": ws_binary_frame, "idle": ws_idle, "hang_up": ws_hang_up},
    "grpc": {
        "no_preface": grpc_no_preface,
        "half_preface": grpc_half_preface,
        "garbage": grpc_garbage,
        "idle": grpc_idle,
        "half_message": grpc_half_message,
        "hang_up": grpc_hang_up,
    },
    "wyoming": {
        "nothing": wyoming_nothing,
        "half_line": wyoming_half_line,
        "not_json": wyoming_not_json,
        "bad_event": wyoming_bad_event,
        "audio_before_start": wyoming_audio_before_start,
        "drop_after_start": wyoming_drop_after_start,
    },
}


# --- a valid request on each face (beside the hostile ones) ---
HOST = "127.0.0.1"


async def valid_http(port: int) -> bool:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    return data.startswith(b"HTTP/1.1 200") and b'"data"' in data


async def valid_realtime(port: int) -> bool:
    reader, writer = await _ws_open(HOST, port)
    head = await reader.readexactly(4)  # a text frame of 126..65535 bytes: session.created
    n = int.from_bytes(head[2:4], "big")
    created = json.loads(await reader.readexactly(n))
    writer.write(ws_frame(0x8, (1000).to_bytes(2, "big")))
    writer.close()
    return bool(created["type"] == "session.created")


async def valid_grpc(port: int) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def check() -> bool:
        with grpc.insecure_channel(f"{HOST}:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    return await asyncio.to_thread(check)


async def valid_wyoming(port: int) -> bool:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b'{"type": "describe"}\n')
    header = json.loads(await reader.readline())
    writer.close()
    return bool(header["type"] == "info")


VALID: dict[str, Callable[[int], Awaitable[bool]]] = {
    "http": valid_http,
    "realtime": valid_realtime,
    "grpc": valid_grpc,
    "wyoming": valid_wyoming,
}
