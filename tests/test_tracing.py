"""OpenTelemetry traces of a real server (tiny.en) and its logs' ids.

With the SDK's in-memory exporter: one HTTP transcription and one gRPC StreamTranscribe, each
with a caller's W3C `traceparent`, give the span tree docs/operations.md draws, under the
caller's span; a live stream gives one `xattn.live_step` per step; exemplars and log lines
carry the trace id. With no OTEL_* variable set a server process never imports
opentelemetry (no tracer, no span); with an OTLP endpoint set it exports over OTLP/HTTP to a
receiver on loopback.
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from http_client import http, multipart
from test_metrics import LiveCall, wait_idle

from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service import instruments, logs
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

otel = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

ROOT = Path(__file__).resolve().parents[1]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
WINDOW = {"xattn.encode", "xattn.decode"}


class Exporter(InMemorySpanExporter):
    """The in-memory exporter, and a wait for a span to end: a server's request span ends
    after its response is sent, so a client may read the response first."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = threading.Condition()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.ended:
            result = super().export(spans)
            self.ended.notify_all()
        return result

    def wait_for(self, name: str, timeout: float = 60.0) -> None:
        with self.ended:
            spans = self.get_finished_spans
            self.ended.wait_for(lambda: any(s.name == name for s in spans()), timeout)


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline("tiny.en")


@pytest.fixture(scope="module")
def traced(pipeline: Pipeline) -> Iterator[tuple[BackgroundServer, InMemorySpanExporter]]:
    exporter = Exporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=2)
    with BackgroundServer(config, pipeline, tracer_provider=provider) as server:
        yield server, exporter


def tree(spans: list[ReadableSpan], root: ReadableSpan) -> dict[str, list[ReadableSpan]]:
    """Each span name under `root` -> the spans of that name, children of its parent."""
    by_parent: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        if s.parent is not None:
            by_parent.setdefault(s.parent.span_id, []).append(s)
    return {"": [root], **_below(root, by_parent)}


def _below(span: ReadableSpan, by_parent: dict) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for child in by_parent.get(span.context.span_id, []):
        out.setdefault(child.name, []).append(child)
        for name, found in _below(child, by_parent).items():
            out.setdefault(f"{child.name}/{name}", []).extend(found)
    return out


def roots(exporter: Exporter, name: str) -> list[ReadableSpan]:
    """The ended spans called `name`, once one has ended."""
    exporter.wait_for(name)
    return [s for s in exporter.get_finished_spans() if s.name == name]


def check_request_tree(exporter: InMemorySpanExporter, root_name: str, align: bool) -> None:
    (root,) = roots(exporter, root_name)
    assert f"{root.context.trace_id:032x}" == TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == PARENT  # the caller's
    assert root.parent.is_remote
    found = tree([s for s in exporter.get_finished_spans()], root)
    children = {k for k in found if "/" not in k and k}
    assert children == {
        "xattn.admission", "xattn.audio", "xattn.queue", "xattn.window", "xattn.response"
    }, children  # fmt: skip
    assert len(found["xattn.window"]) == 1  # jfk: one window
    inside = {k.split("/", 1)[1] for k in found if k.startswith("xattn.window/")}
    assert inside == (WINDOW | {"xattn.align"} if align else WINDOW), inside
    (admission,) = found["xattn.admission"]
    assert admission.attributes["model"] == "tiny.en"
    window = found["xattn.window"][0]
    for child in (found[f"xattn.window/{n}"][0] for n in inside):  # inside their window
        assert window.start_time <= child.start_time <= child.end_time <= window.end_time
    assert all(s.context.trace_id == root.context.trace_id for v in found.values() for s in v)


def test_http_transcription_span_tree(traced: tuple, jfk_path: Path) -> None:
    server, exporter = traced
    exporter.clear()
    body, kind = multipart([
        ("file", "jfk.flac", jfk_path.read_bytes()), ("response_format", None, b"verbose_json"),
        ("timestamp_granularities[]", None, b"word"),
    ])  # fmt: skip
    url = f"http://{server.http_address}/v1/audio/transcriptions"
    headers = {"Content-Type": kind, "traceparent": TRACEPARENT}
    status, _, _ = http("POST", url, headers, body)
    assert status == 200
    wait_idle(server)
    check_request_tree(exporter, "POST /v1/audio/transcriptions", align=True)


def test_grpc_stream_transcribe_span_tree(traced: tuple, jfk_path: Path) -> None:
    server, exporter = traced
    exporter.clear()
    request = pb.StreamTranscribeRequest(
        audio=pb.Audio(encoded=jfk_path.read_bytes()),
        options=pb.TranscriptionOptions(beam_size=1),
    )
    with grpc.insecure_channel(server.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        responses = list(stub.StreamTranscribe(request, metadata=(("traceparent", TRACEPARENT),)))
    assert responses[-1].HasField("done")
    wait_idle(server)
    check_request_tree(exporter, "/xattn.v1.Transcriber/StreamTranscribe", align=False)


def test_live_stream_has_a_span_per_step(traced: tuple, jfk_path: Path) -> None:
    from xattn.model.audio.features import decode_audio

    server, exporter = traced
    exporter.clear()
    pcm = (decode_audio(jfk_path)[: 3 * 16000] * 32767).astype("<i2").tobytes()
    lines = io.StringIO()
    level = logging.getLogger().level
    handler = logs.setup("DEBUG", "json", lines)
    try:
        with grpc.insecure_channel(server.address) as channel:
            live = LiveCall(transcriber_pb2_grpc.TranscriberStub(channel), traceparent=TRACEPARENT)
            for at in range(0, len(pcm), 16000):
                live.send(pb.StreamingRecognizeRequest(audio_content=pcm[at : at + 16000]))
            done = live.close()[-1].done
        wait_idle(server)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    (root,) = roots(exporter, "/xattn.v1.Transcriber/StreamingRecognize")
    found = tree(exporter.get_finished_spans(), root)
    assert set(found) - {""} == {"xattn.admission", "xattn.live_step"}
    steps = found["xattn.live_step"]
    assert sum(s.attributes["decodes"] for s in steps) == done.decode_steps
    assert sum(s.attributes["audio_seconds"] for s in steps) == pytest.approx(3.0)
    # the stream's log line (its end, at DEBUG) carries its request and trace ids
    ended = [json.loads(x) for x in lines.getvalue().splitlines() if "live stream" in x]
    assert ended and ended[-1]["trace_id"] == TRACE and ended[-1]["request_id"]
    assert set(ended[-1]) >= {"time", "level", "logger", "message", "request_id", "trace_id"}


def test_exemplars_carry_the_trace_id(traced: tuple) -> None:
    server, _ = traced
    url = f"http://{server.http_address}/metrics"
    status, headers, body = http("GET", url, {"Accept": "application/openmetrics-text"})
    assert status == 200 and "openmetrics" in headers["Content-Type"]
    assert f'trace_id="{TRACE}"' in body.decode()


def test_text_logs_name_the_ids() -> None:
    from xattn.service.engine.observe import NULL

    def inside() -> None:
        NULL.request("wyoming", "transcribe", "caller-id-1")  # current in this context only
        logging.getLogger("xattn.test").info("inside")

    lines = io.StringIO()
    level = logging.getLogger().level
    handler = logs.setup("INFO", "text", lines)
    try:
        logging.getLogger("xattn.test").info("outside")
        contextvars.copy_context().run(inside)
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    outside, inside = lines.getvalue().splitlines()
    assert outside.endswith("xattn.test: outside")
    assert inside.endswith("inside [request_id=caller-id-1]")


def test_tracing_wanted_only_when_otel_variables_say_so() -> None:
    assert not instruments.wanted({})
    assert not instruments.wanted({"OTEL_SERVICE_NAME": "xattn"})
    assert instruments.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert instruments.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not instruments.wanted(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}
    )
    assert not instruments.wanted({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


NO_TRACING = """
import sys, grpc
from xattn.model.pipeline import load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb, transcriber_pb2_grpc
with BackgroundServer(ServerConfig(port=0, http_port=0), load_pipeline("tiny.en")) as s:
    stub = transcriber_pb2_grpc.TranscriberStub(grpc.insecure_channel(s.address))
    audio = pb.Audio(pcm=pb.Pcm(data=bytes(16000), sample_rate=16000, encoding=1))
    stub.Transcribe(pb.TranscribeRequest(audio=audio), metadata=(("traceparent", {tp!r}),))
    print(s.server.tracer_provider, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_no_otel_variables_no_tracer_no_span() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", NO_TRACING.format(tp=TRACEPARENT)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "[]"], done.stdout  # opentelemetry never imported


class _Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP's trace endpoint: takes the protobuf export, keeps it, answers 200."""

    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_otlp_export_to_a_receiver_on_loopback(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "xattn-test")
    try:
        with BackgroundServer(ServerConfig(port=0, workers=1), pipeline) as server:
            with grpc.insecure_channel(server.address) as channel:
                stub = transcriber_pb2_grpc.TranscriberStub(channel)
                audio = pb.Audio(pcm=pb.Pcm(data=bytes(16000), sample_rate=16000, encoding=1))
                stub.Transcribe(pb.TranscribeRequest(audio=audio))
            wait_idle(server)
        # stopped: the server's own provider flushed its spans
    finally:
        receiver.shutdown()
    names, services = set(), set()
    for body in _Receiver.bodies:
        export = ExportTraceServiceRequest.FromString(body)
        for resource in export.resource_spans:
            services |= {a.value.string_value for a in resource.resource.attributes
                         if a.key == "service.name"}  # fmt: skip
            names |= {s.name for scope in resource.scope_spans for s in scope.spans}
    assert services == {"xattn-test"}
    assert {"/xattn.v1.Transcriber/Transcribe", "xattn.window", "xattn.encode"} <= names
