"""What watching costs: requests/s at 8 clients with metrics on, and with traces exported over
OTLP, against the same server with neither.

    python -m benchmarks.metrics [--seconds 30] [--rounds 3] [--clients 8] [--clip-seconds 2]

Three `xattn-server --http-port 0` processes, started once, idle while the others run:
- `plain`: `--no-metrics` (no reports, no request middleware, no /metrics), no tracing;
- `metrics`: the default (the faces' request reports, the engine's, the model thread's);
  scraped every 5 s meanwhile, as Prometheus would;
- `tracing`: metrics and OTLP/HTTP traces (OTEL_EXPORTER_OTLP_ENDPOINT) to a receiver in this
  process on loopback that reads each export and answers 200 (what a collector's receiver
  does, minus the forwarding); every request sampled (the SDK's default).
Rounds take turns (plain, metrics, tracing, plain, ...) so that a shared machine's drift falls
on all three. In a round, `--clients` closed-loop clients (half gRPC Transcribe, half HTTP
transcriptions; greedy, the first `--clip-seconds` of the clip as 16 kHz WAV) run for
`--seconds`; requests/s counts those that ended in the window. The figures: each server's
median over the rounds, and its ratio to `plain` (goals: metrics >= 0.99, tracing >= 0.97).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import numpy as np
import soundfile as sf
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import results
from xattn.model.audio.features import decode_audio
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIP = ROOT.parent / "shared" / "audio" / "jfk.flac"
KINDS = ("plain", "metrics", "tracing")
BOUNDARY = "xattn-metrics-benchmark"
SERVING = health_pb2.HealthCheckResponse.SERVING


class Discard(BaseHTTPRequestHandler):
    """OTLP/HTTP's receiving end: reads the export, answers 200, keeps nothing."""

    exports = 0

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).exports += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Server:
    """One `python -m xattn.service` with its ports read from files."""

    def __init__(self, kind: str, folder: Path, otlp: str, workers: int) -> None:
        self.kind = kind
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "XATTN_"))}
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 2)
        command = [sys.executable, "-m", "xattn.service", "--port", "0", "--http-port", "0"]
        command += ["--workers", str(workers), "--max-queue", "64", "--max-queue-wait", "600"]
        command += ["--log-level", "WARNING"]
        self.files = {n: folder / f"{kind}.{n}" for n in ("port", "http")}
        command += ["--port-file", str(self.files["port"])]
        command += ["--http-port-file", str(self.files["http"])]
        if kind == "plain":
            command.append("--no-metrics")
        if kind == "tracing":
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
        self.log = (folder / f"{kind}.log").open("wb")
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)

    def wait(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(f.is_file() and f.read_text().strip() for f in self.files.values()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.kind}: the server did not start")
            time.sleep(0.1)
        self.address = f"127.0.0.1:{int(self.files['port'].read_text())}"
        self.http_port = int(self.files["http"].read_text())
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while health.Check(health_pb2.HealthCheckRequest(), timeout=30).status != SERVING:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{self.kind}: never SERVING")
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()


def form(wav: bytes) -> bytes:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="c.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    beam = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="beam_size"\r\n\r\n1\r\n'
    return head + wav + b"\r\n" + beam.encode() + f"--{BOUNDARY}--\r\n".encode()


def client(
    server: Server, face: str, wav: bytes, until: float, ends: list[float], errors: list[str]
) -> None:
    """Requests one after another until `until`; appends each one's end time (an error's
    kind to `errors`, then goes on after a pause)."""
    body = form(wav)
    url = f"http://127.0.0.1:{server.http_port}/v1/audio/transcriptions"
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    with grpc.insecure_channel(server.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        request = pb.TranscribeRequest(
            audio=pb.Audio(encoded=wav), options=pb.TranscriptionOptions(beam_size=1)
        )
        while time.monotonic() < until:
            try:
                if face == "grpc":
                    stub.Transcribe(request, timeout=300)
                else:
                    post = urllib.request.Request(url, data=body, headers=headers)
                    with urllib.request.urlopen(post, timeout=300) as reply:
                        reply.read()
                ends.append(time.monotonic())
            except (grpc.RpcError, OSError) as e:
                errors.append(type(e).__name__)
                time.sleep(0.5)


def scraper(server: Server, until: float) -> None:
    while time.monotonic() < until:
        url = f"http://127.0.0.1:{server.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as reply:
            reply.read()
        time.sleep(5.0)


def round_of(server: Server, clients: int, seconds: float, wav: bytes, errors: list[str]) -> float:
    """Requests/s of `clients` closed-loop clients over `seconds` (after a 3 s start)."""
    start = time.monotonic() + 3.0
    until = start + seconds
    ends: list[float] = []
    faces = ["grpc" if i % 2 == 0 else "http" for i in range(clients)]
    threads = [
        threading.Thread(target=client, args=(server, f, wav, until, ends, errors)) for f in faces
    ]
    if server.kind != "plain":
        threads.append(threading.Thread(target=scraper, args=(server, until)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(1 for t in ends if start <= t <= until) / seconds


def report_cost(tracing: bool, n: int = 2000) -> float:
    """Microseconds of CPU the reports of one transcription cost in this process: what a
    greedy jfk request makes (a request scope, admission, one window of 27 tokens, 26 batched
    steps, the outcome), through the process's Instruments (metrics; with `tracing` also its
    spans, to an SDK exporter that discards). Load hardly moves it: a bound for the ratios."""
    import contextvars

    from xattn.service.engine.engine import Engine, Limits
    from xattn.service.instruments import Instruments
    from xattn.service.metrics import Metrics

    spans = None
    if tracing:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult as Result

        from xattn.service.tracing import Spans

        class Nowhere(SpanExporter):
            def export(self, spans: object) -> Result:
                return Result.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(Nowhere()))
        spans = Spans(provider)
    o = Instruments(Metrics(Engine(Limits()), lambda: True), spans)
    batcher = o.batcher("tiny.en")
    assert batcher is not None

    def one() -> None:
        t = time.perf_counter()
        scope = o.request("grpc", "xattn.v1.Transcriber/Transcribe", None)
        with o.span("xattn.admission", model="tiny.en", decoding="greedy"):
            o.admitted("tiny.en", "greedy")
        with o.span("xattn.audio"):
            o.audio_decoded("tiny.en", 2.0)
        o.begin("xattn.queue", t).end(t)
        o.queue_waited("tiny.en", 0.001)
        window = o.begin("xattn.window", t, window=0, offset=0.0)
        o.begin("xattn.encode", t, window).end(t)
        decode = o.begin("xattn.decode", t, window)
        batcher.encoded(1, 0.1)
        o.first_token("tiny.en", "greedy", 0.2)
        for _ in range(27):
            o.token("tiny.en")
        for _ in range(26):
            batcher.stepped(1, 0.005)
        decode.end(t)
        window.end(t)
        o.window("tiny.en")
        o.transcribed("tiny.en", 2.0, 0.3)
        o.ended("tiny.en", "greedy", "finished")
        with o.span("xattn.response"):
            pass
        scope.end("OK")

    t0 = time.process_time()
    for _ in range(n):
        contextvars.copy_context().run(one)
    return (time.process_time() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument("--clip-seconds", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    samples = decode_audio(args.clip)[: int(args.clip_seconds * 16000)]
    buffer = io.BytesIO()
    sf.write(buffer, np.asarray(samples), 16000, format="WAV", subtype="PCM_16")
    wav = buffer.getvalue()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Discard)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    otlp = f"http://127.0.0.1:{receiver.server_port}"
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    loads: list[float] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="xattn-metrics-") as tmp:
        servers = [Server(k, Path(tmp), otlp, args.workers) for k in KINDS]
        try:
            for s in servers:
                s.wait()
            for s in servers:  # warm-up: a round's worth of threads, briefly
                round_of(s, args.clients, 3.0, wav, [])
            for r in range(args.rounds):
                for s in servers:
                    loads.append(os.getloadavg()[0])
                    rates[s.kind].append(round_of(s, args.clients, args.seconds, wav, errors))
                    print(f"round {r + 1} {s.kind}: {rates[s.kind][-1]:.2f} requests/s")
        finally:
            for s in servers:
                s.stop()
    receiver.shutdown()
    medians = {k: statistics.median(v) for k, v in rates.items()}
    rows = [
        {
            "server": k,
            "requests/s (median)": round(medians[k], 3),
            "rounds": [round(x, 3) for x in rates[k]],
            "vs plain": round(medians[k] / medians["plain"], 3),
            "goal": {"plain": "-", "metrics": ">= 0.99", "tracing": ">= 0.97"}[k],
        }
        for k in KINDS
    ]
    for row in rows:
        print(row)
    print(
        f"OTLP exports received: {Discard.exports}; load average {min(loads):.2f}-{max(loads):.2f}"
    )
    settings = {
        "clients": args.clients, "faces": "half gRPC Transcribe, half HTTP transcriptions",
        "clip": f"{args.clip.name}, first {args.clip_seconds:g} s, 16 kHz WAV, greedy",
        "seconds per round": args.seconds, "rounds": args.rounds, "workers": args.workers,
        "tracing": "OTLP/HTTP to a loopback receiver that reads and discards; all sampled",
        "load average during rounds": [round(min(loads), 2), round(max(loads), 2)],
    }  # fmt: skip
    cost = {
        "metrics": round(report_cost(False), 1),
        "metrics and spans": round(report_cost(True), 1),
    }
    print(f"reports of one request, CPU microseconds: {cost}")
    figures = {
        "requests/s at 8 clients": rows,
        "reports of one transcription, CPU microseconds (in process)": cost,
        "OTLP exports received": Discard.exports,
        "client errors (all rounds)": len(errors),
    }
    results.write_from(args, "metrics", settings, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
