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
import subprocess
from pathlib import Path

import pytest
import yaml
from grpc_health.v1 import health_pb2

from benchmarks.replicas import HAPROXY_CFG, Balancer
from xattn.clients.balancing import RETRY_POLICY, Target, channel_target, service_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def haproxy(request: pytest.FixtureRequest) -> None:
    if "haproxy" not in request.node.name or Balancer.binary() is not None:
        return
    message = "haproxy is not installed (apt-get install haproxy)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; .ci/run installs it")
    pytest.skip(message)


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


def test_compose_scale_profile() -> None:
    """The `scale` profile: replicas like `server`, behind the balancer built from
    deploy/haproxy/ (its files in its image, not .dockerignored), published on loopback."""
    from test_compose import docker_compose, dockerignore_excludes, load_compose

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
    ((sources, dest),) = [(c[0].split(), c[1]) for c in copies]
    for source in sources:
        assert (ROOT / source).is_file() and not dockerignore_excludes(source), source
    files = [w for w in balancer["command"] if w.endswith(".cfg")]
    assert files == [f"{dest}{Path(s).name}" for s in sources]
    assert "replica:50051" in (HAPROXY_CFG.parent / "servers-compose.cfg").read_text()
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
