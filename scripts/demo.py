"""The main job, as `make demo` runs it: start the server, stream a clip through the client.

Starts `xattn-server` on a free loopback port, waits for its health check to say SERVING,
runs `xattn transcribe CLIP --words --html out/inspector.html` (tokens and their attention
appear live in the terminal; the inspection page is written), then stops the server with
SIGTERM and waits for its drain. Exit status: the client's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def wait_serving(port_file: Path, server: subprocess.Popen, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"xattn-server exited with status {server.returncode}")
        if port_file.exists() and port_file.read_text().strip():
            address = f"127.0.0.1:{port_file.read_text().strip()}"
            with grpc.insecure_channel(address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return address
                except grpc.RpcError:
                    pass
        time.sleep(0.2)
    raise SystemExit(f"xattn-server was not SERVING within {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("clip", nargs="?", default=str(ROOT / "samples" / "hello.wav"))
    parser.add_argument("--model", default=os.environ.get("XATTN_MODEL", "tiny.en"))
    parser.add_argument("--html", default=str(ROOT / "out" / "inspector.html"))
    args = parser.parse_args()
    Path(args.html).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen(
            [BIN / "xattn-server", "--port", "0", "--port-file", port_file, "--model", args.model]
        )
        try:
            address = wait_serving(port_file, server)
            client = [BIN / "xattn", "transcribe", args.clip, "--server", address, "--words"]
            status = subprocess.call([*client, "--html", args.html])
            if status == 0:
                sys.stdout.write(f"\ninspection page: {args.html} (open it in a browser)\n")
            return status
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
