"""/metrics of a real server on loopback (tiny.en), parsed with prometheus_client's parser.

A mix of requests whose counts the test controls, on a server that admits one transcription
at a time (1 worker, no queue): a live stream (gRPC StreamingRecognize) holds the slot while
an HTTP transcription is refused (429); then, one after the other, a gRPC Transcribe and a
StreamTranscribe (greedy, word timestamps), an HTTP transcription of a file that is no audio
(400) and one of jfk.flac (200). Every family docs/operations.md lists is there with the
counts those requests must produce; each request histogram's count is its requests.
"""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from conftest import requires_tool
from http_client import http, multipart

from benchmarks.scrape import families, parse, text, value
from xattn.model.audio.features import decode_audio
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny.en"
GREEDY = pb.TranscriptionOptions(beam_size=1)
TRANSCRIBER = "xattn.v1.Transcriber"
HTTP_TRANSCRIPTIONS = "/v1/audio/transcriptions"
Request = pb.StreamingRecognizeRequest


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline(MODEL)


@pytest.fixture(scope="module")
def jfk_pcm(jfk_path: Path) -> bytes:
    return (decode_audio(jfk_path) * 32767).astype("<i2").tobytes()  # 16 kHz int16


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def wait_idle(server: BackgroundServer) -> None:
    """Until the engine holds nothing (a worker ends its run a moment after the reply)."""
    wait_until(lambda: server.engine.counters().in_flight == 0, "still in flight")


def transcription(server: BackgroundServer, audio: bytes, **headers: str) -> int:
    """POST /v1/audio/transcriptions of `audio`; the status."""
    body, kind = multipart([("file", "clip.flac", audio), ("model", None, MODEL.encode())])
    url = f"http://{server.http_address}{HTTP_TRANSCRIPTIONS}"
    status, _, _ = http("POST", url, {"Content-Type": kind, **headers}, body)
    return status


def metrics_url(server: BackgroundServer) -> str:
    return f"http://{server.http_address}/metrics"


class LiveCall:
    """A StreamingRecognize whose requests the test sends as it goes (`send`, `close`)."""

    def __init__(self, stub: transcriber_pb2_grpc.TranscriberStub, **metadata: str) -> None:
        self._requests: queue.Queue[Request | None] = queue.Queue()
        self.call = stub.StreamingRecognize(
            iter(self._requests.get, None), timeout=120, metadata=tuple(metadata.items())
        )
        self.send(Request(config=pb.StreamingRecognitionConfig(
            encoding=pb.PCM_ENCODING_INT16, sample_rate=16000, interim_results=True
        )))  # fmt: skip

    def send(self, request: Request) -> None:
        self._requests.put(request)

    def close(self) -> list[pb.StreamingRecognizeResponse]:
        self._requests.put(None)
        return list(self.call)


def mix(server: BackgroundServer, jfk: bytes, pcm: bytes) -> pb.StreamingRecognizeDone:
    """The requests above, in order (the server: workers=1, max_queue=0, HTTP on); the live
    stream's `done`."""
    with grpc.insecure_channel(server.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        live = LiveCall(stub)
        live.send(Request(audio_content=pcm[: 2 * 16000]))  # its first second
        opened = "xattn_live_streams_open"
        wait_until(lambda: value(families(metrics_url(server)), opened) == 1, "no live stream")
        assert transcription(server, jfk) == 429  # the one slot is the stream's: refused
        for at in range(2 * 16000, len(pcm), 16000):
            live.send(Request(audio_content=pcm[at : at + 16000]))
        responses = live.close()
        assert responses[-1].HasField("done")
        wait_idle(server)
        audio = pb.Audio(encoded=jfk)
        assert stub.Transcribe(pb.TranscribeRequest(audio=audio, options=GREEDY)).transcript.text
        wait_idle(server)
        words = pb.TranscriptionOptions(beam_size=1, word_timestamps=True)
        streamed = list(
            stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=audio, options=words))
        )
        assert streamed[-1].HasField("done")
        wait_idle(server)
    assert transcription(server, b"this is not audio at all" * 8) == 400
    wait_idle(server)
    assert transcription(server, jfk) == 200
    wait_idle(server)
    return responses[-1].done


@pytest.fixture(scope="module")
def mixed(pipeline: Pipeline, jfk_path: Path, jfk_pcm: bytes) -> Iterator[tuple]:
    """(server, its /metrics after the mix, the live stream's done)."""
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=0)
    with BackgroundServer(config, pipeline) as server:
        done = mix(server, jfk_path.read_bytes(), jfk_pcm)
        yield server, families(metrics_url(server)), done


def test_requests_by_face_method_model_code(mixed: tuple) -> None:
    _, found, _ = mixed
    requests = {
        (s.labels["face"], s.labels["method"], s.labels["model"], s.labels["code"]): s.value
        for s in found["xattn_requests"].samples
    }
    assert requests == {
        ("grpc", f"{TRANSCRIBER}/StreamingRecognize", MODEL, "OK"): 1,
        ("grpc", f"{TRANSCRIBER}/Transcribe", MODEL, "OK"): 1,
        ("grpc", f"{TRANSCRIBER}/StreamTranscribe", MODEL, "OK"): 1,
        ("http", HTTP_TRANSCRIPTIONS, MODEL, "429"): 1,
        ("http", HTTP_TRANSCRIPTIONS, MODEL, "400"): 1,
        ("http", HTTP_TRANSCRIPTIONS, MODEL, "200"): 1,
    }


def test_a_histogram_counts_its_requests(mixed: tuple) -> None:
    _, found, _ = mixed
    for face, method in (("grpc", f"{TRANSCRIBER}/Transcribe"), ("http", HTTP_TRANSCRIPTIONS)):
        n = value(found, "xattn_requests_total", face=face, method=method)
        count = value(found, "xattn_request_duration_seconds_count", face=face, method=method)
        inf = value(
            found, "xattn_request_duration_seconds_bucket", face=face, method=method, le="+Inf"
        )
        assert n == count == inf > 0, (face, method)
    assert value(found, "xattn_request_duration_seconds_count") == 6
    # the three transcriptions that reached a worker, each once
    for name in ("xattn_queue_wait_seconds", "xattn_real_time_factor"):
        assert value(found, f"{name}_count", model=MODEL) == 3, name
    assert value(found, "xattn_time_to_first_token_seconds_count", decoding="greedy") == 2
    assert value(found, "xattn_time_to_first_token_seconds_count", decoding="beam") == 1
    assert value(found, "xattn_request_audio_seconds_count") == 3  # the 400's had none
    assert value(found, "xattn_request_audio_seconds_sum") == pytest.approx(33.0, abs=0.01)


def test_engine_outcomes_refusals_and_gauges(mixed: tuple) -> None:
    server, found, done = mixed
    outcomes = {
        (s.labels["decoding"], s.labels["outcome"]): s.value
        for s in found["xattn_transcriptions"].samples
    }
    # HTTP's default is beam search (5), gRPC's is asked greedy here
    assert outcomes == {
        ("live", "finished"): 1,
        ("greedy", "finished"): 2,
        ("beam", "finished"): 1,
        ("beam", "invalid"): 1,
    }
    admitted = {
        s.labels["decoding"]: s.value for s in found["xattn_transcriptions_admitted"].samples
    }
    assert admitted == {"live": 1, "greedy": 2, "beam": 2}
    assert value(found, "xattn_refusals_total", model=MODEL, reason="queue_full") == 1
    assert value(found, "xattn_refusals_total") == 1
    for gauge in ("in_flight", "queued", "running"):
        assert value(found, f"xattn_requests_{gauge}", model=MODEL) == 0, gauge
    assert value(found, "xattn_live_streams_open", model=MODEL) == 0
    assert value(found, "xattn_decode_workers", model=MODEL) == 1
    assert value(found, "xattn_admission_capacity", model=MODEL) == 1
    assert value(found, "xattn_audio_decoder_crashes_total") == 0
    assert value(found, "xattn_ready") == 1
    counters = server.engine.counters()
    assert value(found, "xattn_windows_total", model=MODEL) == counters.windows == 3
    # file tokens as decoded, live tokens as committed
    assert value(found, "xattn_tokens_total") == counters.tokens_decoded + done.tokens
    live_audio = done.audio_seconds
    assert value(found, "xattn_audio_seconds_total") == pytest.approx(33.0 + live_audio, 1e-3)


def test_model_thread_and_live(mixed: tuple) -> None:
    _, found, done = mixed
    decodes = value(found, "xattn_live_decodes_total", model=MODEL)
    assert decodes == done.decode_steps >= 1
    assert value(found, "xattn_live_decodes_spared_total", model=MODEL) == 0  # no VAD asked
    assert value(found, "xattn_live_commit_lag_seconds_count", model=MODEL) == done.final_results
    # one encoder pass per file window and per live decode
    assert value(found, "xattn_encoder_pass_seconds_count", model=MODEL) == 3 + decodes
    steps = value(found, "xattn_decoder_step_seconds_count", model=MODEL)
    assert steps == value(found, "xattn_batch_rows_count", model=MODEL) > 0
    assert value(found, "xattn_batch_rows_sum", model=MODEL) >= steps  # beams: 5 rows a step
    info = found["xattn_model_info"].samples[0]
    assert info.name == "xattn_model_info" and info.labels["model"] == MODEL
    assert {"compute": "fp32", "device": "cpu", "n_mels": "80", "n_vocab": "51864"}.items() <= (
        info.labels.items()
    )


def test_process_families(mixed: tuple) -> None:
    _, found, _ = mixed
    for name in ("process_resident_memory_bytes", "process_open_fds", "xattn_process_threads"):
        assert value(found, name) > 0, name
    assert value(found, "process_cpu_seconds_total") > 0


def test_promtool_lints_the_exposition(mixed: tuple) -> None:
    """Prometheus' own linter (promtool check metrics): names, units, help texts."""
    promtool = requires_tool("promtool")
    server, _, _ = mixed
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text(metrics_url(server)), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_grpc_only_server_serves_its_metrics_port(pipeline: Pipeline) -> None:
    config = ServerConfig(port=0, metrics_port=0, workers=1)
    with BackgroundServer(config, pipeline) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            assert stub.GetModelInfo(pb.GetModelInfoRequest()).model_name == MODEL
            with pytest.raises(grpc.RpcError):
                stub.GetModelInfo(pb.GetModelInfoRequest(model="no-such-model"))
        url = f"http://{server.metrics_address}/metrics"
        method = f"{TRANSCRIBER}/GetModelInfo"

        def counted(code: str) -> bool:
            return value(families(url), "xattn_requests_total", method=method, code=code) == 1

        # a refused call is counted as its handler ends, which may come after the client
        # has its status (a loaded CI read 0 at once)
        wait_until(lambda: counted("OK") and counted("INVALID_ARGUMENT"), "not counted")
        status, _, _ = http("GET", f"http://{server.metrics_address}/v1/models")
        assert status == 404  # the metrics port serves /metrics alone


def test_metrics_off_leaves_no_trace(pipeline: Pipeline) -> None:
    """--no-metrics: no /metrics, no request reports, the engine's observer the no-op one."""
    config = ServerConfig(port=0, http_port=0, metrics=False, workers=1)
    with BackgroundServer(config, pipeline) as server:
        status, _, _ = http("GET", metrics_url(server))
        assert status == 404
        assert not server.engine.observer.active


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from xattn.service.__main__ import config_from_args, parse_args

    config = config_from_args(parse_args(["--metrics-port", "9100", "--log-format", "json"]))
    assert config.metrics and config.metrics_port == 9100
    monkeypatch.setenv("XATTN_METRICS_PORT", "9200")
    monkeypatch.setenv("XATTN_METRICS", "0")
    config = config_from_args(parse_args([]))
    assert config.metrics_port == 9200 and not config.metrics
    with pytest.raises(SystemExit):
        parse_args(["--log-format", "xml"])


def test_text_parses_as_prometheus_does() -> None:
    """benchmarks.scrape reads the parser's families (a counter's name without _total)."""
    found = parse('# TYPE a_total counter\na_total{x="1"} 2\na_total{x="2"} 3\n')
    assert value(found, "a_total") == 5 and value(found, "a_total", x="2") == 3
    assert value(found, "missing_total") == 0


def test_metrics_follow_the_health_exemption(pipeline: Pipeline) -> None:
    """With bearer tokens, /metrics needs none (as /health), unless health is not exempt."""
    token = "metrics-test-token-0123456789"
    config = ServerConfig(port=0, http_port=0, workers=1, auth_tokens=(token,))
    with BackgroundServer(config, pipeline) as server:
        assert http("GET", metrics_url(server))[0] == 200
    strict = ServerConfig(
        port=0, http_port=0, workers=1, auth_tokens=(token,), auth_exempt_health=False
    )
    with BackgroundServer(strict, pipeline) as server:
        status, _, body = http("GET", metrics_url(server))
        assert status == 401 and b"invalid_api_key" in body
        authorized = {"Authorization": f"Bearer {token}"}
        assert http("GET", metrics_url(server), authorized)[0] == 200


def test_health_watch_streams_through_the_reports(pipeline: Pipeline) -> None:
    """A streaming handler that writes to its context (Health/Watch) and returns, not an
    async generator, is reported too and still streams."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with BackgroundServer(ServerConfig(port=0, metrics_port=0, workers=1), pipeline) as server:
        with grpc.insecure_channel(server.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            first = next(watch)
            watch.cancel()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        url = f"http://{server.metrics_address}/metrics"
        watched = {"method": "grpc.health.v1.Health/Watch", "code": "CANCELLED"}
        wait_until(lambda: value(families(url), "xattn_requests_total", **watched) == 1, "no Watch")
