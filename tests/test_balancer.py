"""The balancer's configuration and the client's channel, without servers (fast).

- deploy/haproxy/haproxy.cfg's gRPC health check: the tcp-check's bytes decoded frame by
  frame and HPACK field by field, against the protobuf messages of the health service;
- `haproxy -c` accepts it with each server list (compose's, and the loopback one the tests
  write) and refuses a broken one;
- docker-compose.yml's `scale` profile: the replicas like `server`, the balancer's image;
- xattn.clients.balancing: targets, and the retry policy is the one docs/running-many.md documents.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import threading
from pathlib import Path

import grpc
import pytest
import yaml
from conftest import requires_tool
from grpc_health.v1 import health_pb2

from benchmarks.replicas import HAPROXY_CFG, Balancer
from xattn.clients.balancing import (
    RETRY_POLICY,
    Target,
    channel_options,
    channel_target,
    service_config,
)
from xattn.v1 import transcriber_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def haproxy(request: pytest.FixtureRequest) -> None:
    if "haproxy" in request.node.name:
        Balancer.binary() or requires_tool("haproxy")


def frame(message: bytes) -> bytes:
    """A gRPC message on the wire: not compressed, 4-byte length, the bytes."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def test_haproxy_health_check_bytes_are_the_grpc_health_check() -> None:
    """The tcp-check's bytes, decoded: HTTP/2 preface, SETTINGS, HEADERS (HPACK literals)
    for POST /grpc.health.v1.Health/Check, DATA with an empty HealthCheckRequest; it expects
    the gRPC message of HealthCheckResponse{SERVING}."""
    text = HAPROXY_CFG.read_text()
    sent = bytes.fromhex("".join(re.findall(r"tcp-check send-binary (\w+)", text)))
    (expected,) = re.findall(r"tcp-check expect binary (\w+)", text)
    serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
    assert bytes.fromhex(expected) == frame(serving.SerializeToString())
    not_serving = health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
    assert bytes.fromhex(expected) not in frame(not_serving.SerializeToString())
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    assert sent.startswith(preface)
    frames, rest = [], sent[len(preface) :]
    while rest:
        length, kind, flags = int.from_bytes(rest[:3], "big"), rest[3], rest[4]
        stream = int.from_bytes(rest[5:9], "big")
        frames.append((kind, flags, stream, rest[9 : 9 + length]))
        rest = rest[9 + length :]
    (settings, headers, data) = frames
    assert settings == (0x4, 0, 0, b"")
    assert headers[:3] == (0x1, 0x4, 1)  # HEADERS, END_HEADERS, stream 1
    assert data[:3] == (0x0, 0x1, 1)  # DATA, END_STREAM, stream 1
    assert data[3] == frame(health_pb2.HealthCheckRequest().SerializeToString())
    block, fields = headers[3], []
    static = {1: ":authority", 2: ":method GET", 3: ":method POST", 4: ":path", 6: ":scheme http"}
    static[31] = "content-type"
    while block:  # indexed fields, and literals without indexing (4-bit name index prefix)
        if block[0] & 0x80:
            fields.append(static[block[0] & 0x7F])
            block = block[1:]
            continue
        index, block = block[0] & 0x0F, block[1:]
        if index == 0x0F:
            index, block = 15 + block[0], block[1:]
        if index == 0:
            name, block = block[1 : 1 + block[0]].decode(), block[1 + block[0] :]
        else:
            name = static[index]
        assert block[0] < 0x7F  # not Huffman-coded, one-byte length
        value, block = block[1 : 1 + block[0]].decode(), block[1 + block[0] :]
        fields.append(f"{name} {value}")
    assert fields == [
        ":method POST",
        ":scheme http",
        ":path /grpc.health.v1.Health/Check",
        ":authority xattn",
        "content-type application/grpc",
        "te trailers",
    ]


@pytest.mark.parametrize("servers", ["servers-compose.cfg", "loopback"])
def test_haproxy_accepts_the_config(servers: str, tmp_path: Path) -> None:
    if servers == "loopback":
        path = tmp_path / "servers.cfg"
        path.write_text(Balancer([50051, 50052], tmp_path).servers_cfg())
    else:
        path = HAPROXY_CFG.parent / servers
    done = subprocess.run(
        [str(Balancer.binary()), "-c", "-f", str(HAPROXY_CFG), "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.cfg"
    broken.write_text(path.read_text().replace("backend xattn", "backend xattm"))
    done = subprocess.run(
        [str(Balancer.binary()), "-c", "-f", str(HAPROXY_CFG), "-f", str(broken)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and "xattn" in done.stdout + done.stderr


def error_pages() -> list[Path]:
    """The files haproxy.cfg's errorfile lines name (relative to it: default-path config)."""
    text = HAPROXY_CFG.read_text()
    assert re.search(r"^\s+default-path config\b", text, re.M)
    return [HAPROXY_CFG.parent / f for f in re.findall(r"^\s+errorfile \d+ (\S+)", text, re.M)]


def section(name: str) -> str:
    """One section of haproxy.cfg (its header line to the next), comments dropped."""
    text = HAPROXY_CFG.read_text()
    match = re.search(rf"^{name}\n(.*?)(?=^\S|\Z)", text, re.M | re.S)
    assert match, name
    return "\n".join(line.split("#")[0].rstrip() for line in match[1].splitlines())


def test_haproxy_error_pages_are_grpc_and_openai_shaped() -> None:
    """HAProxy's own 502/503/504: on the gRPC side a trailers-only gRPC answer with
    grpc-status 14 (UNAVAILABLE, which the client's policy retries); on the HTTP side
    OpenAI's error shape with Retry-After. Each file parses as an HTTP response whose
    Content-Length is its body's."""
    grpc_side, http_side = section("defaults xattn"), section("defaults xattn_http")
    for side, kind in ((grpc_side, "grpc"), (http_side, "http")):
        codes = re.findall(rf"errorfile (\d+) errors/{kind}-(\d+)\.http", side)
        assert sorted(codes) == [("502", "502"), ("503", "503"), ("504", "504")], kind
    assert sorted(p.name for p in error_pages()) == sorted(
        f"{kind}-{code}.http" for kind in ("grpc", "http") for code in (502, 503, 504)
    )
    for path in error_pages():
        head, _, body = path.read_bytes().partition(b"\r\n\r\n")
        status, *lines = head.decode("ascii").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        code = path.stem.split("-")[1]
        assert status.startswith(f"HTTP/1.1 {code} "), path
        assert int(headers["content-length"]) == len(body), path
        if path.name.startswith("grpc-"):
            assert headers["content-type"] == "application/grpc" and body == b""
            assert headers["grpc-status"] == str(grpc.StatusCode.UNAVAILABLE.value[0])
            assert headers["grpc-message"].startswith("xattn balancer: ")
        else:
            assert headers["content-type"] == "application/json" and headers["retry-after"]
            error = json.loads(body)["error"]
            assert set(error) == {"message", "type", "param", "code"}, path
            assert error["type"] == "server_error" and error["message"].endswith(f"({code})")


def test_haproxy_http_frontend() -> None:
    """The HTTP API's frontend and backend: leastconn, GET /health checks, retries only where
    nothing can have run, a tunnel timeout for WebSockets (/v1/realtime)."""
    frontend, defaults = section("frontend http from xattn_http"), section("defaults xattn_http")
    assert 'bind "${XATTN_LB_HTTP_BIND}"' in frontend and "default_backend xattn_http" in frontend
    assert "balance leastconn" in defaults and "mode http" in defaults
    assert "http-check send meth GET uri /health" in defaults
    assert "http-check expect status 200" in defaults and "option httpchk" in defaults
    (retry_on,) = re.findall(r"retry-on (.+)", defaults)
    assert set(retry_on.split()) == {"conn-failure", "empty-response"}
    assert re.search(r"timeout tunnel \d+h", defaults)
    # `defaults xattn` stays the last: an unnamed `backend xattn` of one's own inherits it
    text = HAPROXY_CFG.read_text()
    assert text.rindex("\ndefaults xattn\n") > text.index("\ndefaults xattn_http\n")


def test_compose_scale_profile() -> None:
    """The `scale` profile: replicas like `server`, behind the balancer built from
    deploy/haproxy/ (its files in its image, not .dockerignored), published on loopback."""
    from test_compose import docker_compose, dockerignore_excludes, load_compose
    from test_compose import interpolate_defaults as interpolate

    services = load_compose()["services"]
    replica, balancer, server = services["replica"], services["balancer"], services["server"]
    assert replica["profiles"] == balancer["profiles"] == ["scale"]
    assert set(replica["environment"]) == set(server["environment"])
    assert replica["healthcheck"] == server["healthcheck"]
    assert "ports" not in replica  # reached through the balancer only
    assert balancer["depends_on"] == {"replica": {"condition": "service_healthy"}}
    assert all(p.startswith("127.0.0.1:") for p in balancer["ports"])
    assert balancer["stop_signal"] == "SIGUSR1"  # HAProxy's soft stop
    dockerfile = ROOT / balancer["build"]["dockerfile"]
    copies = re.findall(r"^COPY (.+) (\S+)$", dockerfile.read_text(), re.M)
    (sources, dest), (errors, errors_dest) = [(c[0].split(), c[1]) for c in copies]
    for source in sources:
        assert (ROOT / source).is_file() and not dockerignore_excludes(source), source
    files = [w for w in balancer["command"] if w.endswith(".cfg")]
    assert files == [f"{dest}{Path(s).name}" for s in sources]
    # the error pages, where haproxy.cfg's relative paths (default-path config) find them
    assert errors == ["deploy/haproxy/errors/"] and errors_dest == f"{dest}errors/"
    for path in error_pages():
        rel = path.relative_to(ROOT).as_posix()
        assert rel.startswith(errors[0]) and not dockerignore_excludes(rel), rel
    servers = (HAPROXY_CFG.parent / "servers-compose.cfg").read_text()
    assert "replica:50051" in servers and "replica:8000" in servers
    assert "backend xattn_http from xattn_http" in servers
    assert balancer["environment"]["XATTN_LB_HTTP_BIND"] == "0.0.0.0:8000"
    assert "127.0.0.1:${XATTN_LB_HTTP_PORT:-8001}:8000" in balancer["ports"]
    assert interpolate(str(replica["environment"]["XATTN_HTTP_PORT"])) == "8000"
    done = subprocess.run(
        [docker_compose(), "--profile", "scale", "-f", str(ROOT / "docker-compose.yml"), "config"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("XATTN_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    assert yaml.safe_load(done.stdout)["services"]["replica"]["scale"] == 3


def test_channel_targets() -> None:
    assert channel_target("10.0.0.1:50051") == Target("10.0.0.1:50051")
    assert channel_target("127.0.0.1:1,127.0.0.2:2") == Target("ipv4:127.0.0.1:1,127.0.0.2:2")
    assert channel_target("[::1]:5, [::1]:6") == Target("ipv6:[::1]:5,[::1]:6")
    named = channel_target("localhost:7,127.0.0.1:8")  # names resolved, the first names TLS
    assert named.authority == "localhost:7" and named.target.startswith("ipv4:127.0.0.1:7,")
    for target in ("dns:///xattn-headless.xattn.svc:50051", "ipv4:1.2.3.4:5,1.2.3.5:5"):
        assert channel_target(target) == Target(target)
    for bad in ("", "10.0.0.1:1,b", "10.0.0.1:1,::1:2", "10.0.0.1:1,10.0.0.2:99999"):
        with pytest.raises(ValueError):
            channel_target(bad)


def test_retry_policy_is_the_documented_one() -> None:
    """The service config documented in docs/running-many.md (where the README points for
    running several servers) is the one the client uses."""
    page = (ROOT / "docs" / "running-many.md").read_text()
    block = re.search(r"```json\n(\{\"loadBalancingConfig\".*?)```", page, re.S)
    assert block, "docs/running-many.md: the service config's JSON block"
    whole = json.loads(block[1])
    documented = whole["methodConfig"][0]
    config = json.loads(service_config())
    assert config["loadBalancingConfig"] == whole["loadBalancingConfig"] == [{"round_robin": {}}]
    assert (
        config["methodConfig"][0]
        == documented
        == {
            "name": [{"service": "xattn.v1.Transcriber"}],
            "retryPolicy": RETRY_POLICY,
        }
    )
    live = {"name": [{"service": "xattn.v1.Transcriber", "method": "StreamingRecognize"}]}
    assert config["methodConfig"][1:] == whole["methodConfig"][1:] == [live]  # never retried


class CancellingProxy(threading.Thread):
    """A minimal HTTP/2 peer on loopback, standing in for a balancer whose upstream died
    under a call: it answers the first `cancel` calls with RST_STREAM(CANCEL) once their
    request has fully arrived (what HAProxy sends when it has forwarded a request it cannot
    replay to a replica that dies before answering), and every later one with a
    trailers-only NOT_FOUND. It counts the calls (HEADERS frames) it sees."""

    def __init__(self, cancel: int) -> None:
        super().__init__(daemon=True)
        self.cancel, self.calls = cancel, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def run(self) -> None:
        with self.listener:
            conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as wire:
            wire.read(24)  # the client's preface
            # our SETTINGS (INITIAL_WINDOW_SIZE 2^31-1) and the connection's window: the
            # whole request may arrive
            conn.sendall(h2_frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1)))
            conn.sendall(h2_frame(8, 0, 0, struct.pack(">I", 2**31 - 2**16)))
            while head := wire.read(9):
                length, kind, flags, stream = struct.unpack(">IBBI", b"\0" + head)
                wire.read(length)
                stream &= 0x7FFFFFFF
                if kind == 4 and not flags & 1:  # their SETTINGS: ACK
                    conn.sendall(h2_frame(4, 1, 0))
                elif kind == 6 and not flags & 1:  # PING: ACK
                    conn.sendall(h2_frame(6, 1, 0, b"\0" * 8))
                elif kind == 1:
                    self.calls += 1
                elif kind == 0 and flags & 1:  # the request's last DATA frame
                    if self.calls <= self.cancel:
                        conn.sendall(h2_frame(3, 0, stream, struct.pack(">I", 8)))
                    else:  # HPACK: :status 200, content-type and grpc-status literals
                        block = b"\x88" + hpack(b"content-type", b"application/grpc")
                        block += hpack(b"grpc-status", b"5")
                        conn.sendall(h2_frame(1, 0x5, stream, block))


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def hpack(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 6.2.2)."""
    return b"\0" + bytes([len(name)]) + name + bytes([len(value)]) + value


@pytest.mark.parametrize("method", ["Transcribe", "StreamTranscribe"])
def test_a_call_a_proxy_cancels_before_any_answer_is_sent_again(method: str) -> None:
    """A balancer resets a call with CANCEL when the replica it forwarded the call to dies
    before answering and the request was too large to replay (seen in tests/test_scale.py).
    Transcription is idempotent and nothing has been answered yet, so the channel sends it
    again: here the second attempt gets the fake's NOT_FOUND, which is not retried."""
    proxy = CancellingProxy(cancel=1)
    proxy.start()
    request = pb.TranscribeRequest if method == "Transcribe" else pb.StreamTranscribeRequest
    with grpc.insecure_channel(proxy.address, options=channel_options()) as channel:
        rpc = (channel.unary_unary if method == "Transcribe" else channel.unary_stream)(
            f"/xattn.v1.Transcriber/{method}",
            request_serializer=request.SerializeToString,
            response_deserializer=lambda data: data,
        )
        with pytest.raises(grpc.RpcError) as error:
            list(rpc(request(audio=pb.Audio(encoded=b"\0" * 300_000)), timeout=20))
    assert error.value.code() == grpc.StatusCode.NOT_FOUND, error.value
    assert proxy.calls == 2


def test_haproxy_with_no_server_answers_grpc_unavailable_and_openai_503(tmp_path: Path) -> None:
    """The real HAProxy with the repository's config and no server up: it answers itself.
    A gRPC call (unary and streaming, small enough to have been sent whole) gets UNAVAILABLE
    with the balancer's grpc-message (HAProxy's HTML 503 reached a stream as UNKNOWN, which
    nothing retries), and the client's channel sends it again: every attempt is in the log.
    The HTTP frontend answers OpenAI's error shape with Retry-After."""
    import urllib.error
    import urllib.request

    with Balancer([], tmp_path) as lb:
        for options in ([("grpc.enable_retries", 0)], channel_options()):
            with grpc.insecure_channel(lb.address, options=options) as channel:
                for method, kind in (("Transcribe", "unary"), ("StreamTranscribe", "stream")):
                    rid = f"{method}-{len(options)}"
                    rpc = (channel.unary_unary if kind == "unary" else channel.unary_stream)(
                        f"/xattn.v1.Transcriber/{method}",
                        request_serializer=lambda r: r.SerializeToString(),
                        response_deserializer=lambda data: data,
                    )
                    request = pb.TranscribeRequest(audio=pb.Audio(encoded=b"\0" * 1000))
                    with pytest.raises(grpc.RpcError) as error:
                        list(rpc(request, timeout=30, metadata=(("x-request-id", rid),)))
                    assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value
                    assert error.value.details().startswith("xattn balancer: "), error.value
                    attempts = [line for line in lb.log_lines() if "{" + rid + "}" in line]
                    # the policy's 5 attempts (gRPC may add a transparent one)
                    assert len(attempts) >= (5 if len(options) > 1 else 1), attempts
                    assert len(attempts) <= (6 if len(options) > 1 else 1), attempts
                    assert all(" 503 " in line for line in attempts), attempts
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{lb.http_address}/v1/models", timeout=10)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
    error = json.loads(refused.value.read())["error"]
    assert error["type"] == "server_error" and "no server" in error["message"]
