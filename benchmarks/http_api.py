"""What the HTTP face costs: the same clip over OpenAI's API and over gRPC, one server.

    python -m benchmarks.http_api [--clip ../shared/audio/jfk.flac] [--rounds 7]

One `xattn-server --http-port 0` process (defaults: tiny.en, beam 5, one worker); the clients
run in this process, one request at a time, the four kinds taking turns each round so that
drift in the machine's speed falls on all of them alike:
1. unary: `POST /v1/audio/transcriptions` (response_format=json, nothing else set) against
   gRPC `Transcribe` of the same bytes with nothing set: median wall time, ratio (goal at
   most 1.05);
2. streaming: `stream=true`, the time to the first `transcript.text.delta`, against gRPC
   `StreamTranscribe`'s first text token (a delta is text: a beam search's first shared
   token is often the timestamp <|0.00|>, which has none).
An HTTP connection is kept alive between requests (as the SDKs do); the gRPC channel too.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import results
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIP = ROOT.parent / "shared" / "audio" / "jfk.flac"
BOUNDARY = "xattn-benchmark-boundary"


def form(data: bytes, fields: dict[str, str]) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="clip"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + data + b"\r\n" + b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


class Http:
    """One kept-alive connection to the HTTP face."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def post(self, body: bytes) -> http.client.HTTPResponse:
        headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        self.conn.request("POST", "/v1/audio/transcriptions", body, headers)
        return self.conn.getresponse()

    def unary(self, body: bytes) -> float:
        t0 = time.perf_counter()
        reply = self.post(body)
        reply.read()
        assert reply.status == 200, reply.status
        return time.perf_counter() - t0

    def first_delta(self, body: bytes) -> float:
        t0 = time.perf_counter()
        reply = self.post(body)
        first = None
        for line in reply:  # SSE: "data: {...}" lines
            if first is None and line.startswith(b"data:") and b"text.delta" in line:
                first = time.perf_counter() - t0
        assert reply.status == 200 and first is not None
        return first


def grpc_unary(stub: transcriber_pb2_grpc.TranscriberStub, audio: pb.Audio) -> float:
    t0 = time.perf_counter()
    stub.Transcribe(pb.TranscribeRequest(audio=audio), timeout=300)
    return time.perf_counter() - t0


def grpc_first_token(stub: transcriber_pb2_grpc.TranscriberStub, audio: pb.Audio) -> float:
    t0 = time.perf_counter()
    first = None
    request = pb.StreamTranscribeRequest(
        audio=audio, alignment=pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_NONE)
    )
    for response in stub.StreamTranscribe(request, timeout=300):
        kind = response.WhichOneof("event")
        if first is None and kind == "token" and response.token.kind == pb.TOKEN_KIND_TEXT:
            first = time.perf_counter() - t0
    assert first is not None
    return first


def start_server(folder: Path) -> tuple[subprocess.Popen, int, int]:
    ports = folder / "grpc", folder / "http"
    command = [sys.executable, "-m", "xattn.service", "--port", "0", "--http-port", "0",
               "--port-file", str(ports[0]), "--http-port-file", str(ports[1]),
               "--log-level", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 300
    while not all(p.is_file() and p.read_text().strip() for p in ports):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.05)
    grpc_port, http_port = (int(p.read_text()) for p in ports)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for reply in health.Watch(health_pb2.HealthCheckRequest(), timeout=300):
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                break
    return proc, grpc_port, http_port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument("--rounds", type=int, default=7)
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    data = args.clip.read_bytes()
    audio = pb.Audio(encoded=data)
    with tempfile.TemporaryDirectory() as folder:
        proc, grpc_port, http_port = start_server(Path(folder))
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            client = Http(http_port)
            unary_body, stream_body = form(data, {}), form(data, {"stream": "true"})
            cases: dict[str, Callable[[], float]] = {
                "gRPC Transcribe": lambda: grpc_unary(stub, audio),
                "HTTP json": lambda: client.unary(unary_body),
                "gRPC StreamTranscribe, first text token": lambda: grpc_first_token(stub, audio),
                "HTTP stream=true, first delta": lambda: client.first_delta(stream_body),
            }
            for case in cases.values():  # warm-up: the first request of each kind
                case()
            times: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name, case in cases.items():
                    times[name].append(case())
            channel.close()
        finally:
            proc.terminate()
            proc.wait(60)
    median = {name: statistics.median(t) for name, t in times.items()}
    rows = [
        {"request": name, "median seconds": round(m, 4), "min seconds": round(min(times[name]), 4)}
        for name, m in median.items()
    ]
    names = list(median)
    ratios = {
        "HTTP json / gRPC Transcribe": round(median[names[1]] / median[names[0]], 3),
        "HTTP first delta / gRPC first text token": round(median[names[3]] / median[names[2]], 3),
    }
    for row in rows:
        print(f"{row['request']:40s} {row['median seconds']:.4f} s (min {row['min seconds']:.4f})")
    for name, value in ratios.items():
        print(f"{name:40s} {value:.3f}")
    settings = {"clip": args.clip.name, "rounds": args.rounds, "server": "defaults (tiny.en, "
                "beam 5, 1 worker), one process; clients one request at a time"}  # fmt: skip
    results.write_from(args, "http_api", settings, {"requests": rows, "ratios": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
