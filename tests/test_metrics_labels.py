"""/metrics' families and labels are the ones docs/operations.md documents, and label values
stay within their small documented sets under a fuzzed workload (hypothesis): gRPC and HTTP
requests with random models, request ids, paths, audio, options, deadlines and live streams.
A client's request id, model name or path never becomes a label value.
"""

from __future__ import annotations

import io
import os
import re
import string
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf
from http_client import http, multipart
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_metrics import wait_idle

from benchmarks.scrape import families
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.engine.errors import INTERNAL, TABLE
from xattn.service.engine.observe import DECODINGS, FACES, OUTCOMES, REFUSALS
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = ROOT / "docs" / "operations.md"
MODEL = "tiny.en"
TRANSCRIBER = pb.DESCRIPTOR.services_by_name["Transcriber"]
GRPC_METHODS = {f"{TRANSCRIBER.full_name}/{m.name}" for m in TRANSCRIBER.methods} | {
    "grpc.health.v1.Health/Check",
    "grpc.health.v1.Health/Watch",
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
}
HTTP_ROUTES = {"/v1/audio/transcriptions", "/v1/audio/translations", "/v1/models",
               "/v1/models/{model}", "/v1/realtime", "/health", "other"}  # fmt: skip
ALLOWED = {
    "face": set(FACES),
    "method": GRPC_METHODS | HTTP_ROUTES,
    "model": {"", MODEL},
    "decoding": set(DECODINGS),
    "outcome": set(OUTCOMES),
    "reason": set(REFUSALS),
}
GRPC_CODES = {c.name for c in grpc.StatusCode}
# faces without statuses of their own (Wyoming): ok, cancelled, or the errors table's code
OTHER_CODES = {"ok", "cancelled", INTERNAL.code} | {fault.code for _, fault in TABLE}
TOKEN = st.text(string.ascii_letters + string.digits + "-_.:;/= ", min_size=1, max_size=80)
PCM = pb.Audio(pcm=pb.Pcm(data=bytes(8000), sample_rate=16000, encoding=1))  # 0.25 s


def documented() -> dict[str, set[str]]:
    """docs/operations.md's metric table: an xattn_ metric -> its labels."""
    rows = re.findall(r"^\| `(xattn_\w+)` \| (\w+) \|([^|]*)\|", OPERATIONS.read_text(), re.M)
    assert len(rows) >= 25, rows
    return {name: {w.strip() for w in labels.split(",") if w.strip()} for name, _, labels in rows}


def test_documented_label_values_are_the_code_s() -> None:
    text = OPERATIONS.read_text()
    table = text[text.index("| label | values |") :]
    for values in (FACES, DECODINGS, OUTCOMES, REFUSALS):
        for v in values:
            assert f"`{v}`" in table, v


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline(MODEL)


@pytest.fixture(scope="module")
def server(pipeline: Pipeline) -> Iterator[BackgroundServer]:
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=1, max_audio_seconds=5)
    with BackgroundServer(config, pipeline) as running:
        yield running


def check_exposition(server: BackgroundServer, secrets: set[str]) -> None:
    text = http("GET", f"http://{server.http_address}/metrics")[2].decode()
    for secret in secrets - {MODEL, ""}:
        if len(secret.strip()) >= 6 and not secret.strip().isdigit():
            assert f'"{secret}"' not in text, f"a client's value became a label: {secret!r}"
    docs = documented()
    found = {n: f for n, f in families(f"http://{server.http_address}/metrics").items()
             if n.startswith("xattn_")}  # fmt: skip
    for name, family in found.items():
        full = next((d for d in docs if d in (name, f"{name}_total", f"{name}_info")), None)
        assert full is not None, f"{name} is not in docs/operations.md's table"
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == docs[full], (name, labels, docs[full])
            for key, value in sample.labels.items():
                if key in ALLOWED:
                    assert value in ALLOWED[key], (name, key, value)
                elif key == "code":
                    known = GRPC_CODES | OTHER_CODES
                    assert value in known or re.fullmatch(r"[1-5]\d\d", value), value


def grpc_request(server: BackgroundServer, kind: str, model: str, rid: str, fast: bool) -> None:
    timeout = 0.05 if fast else 60
    metadata = (("x-request-id", rid),)
    with grpc.insecure_channel(server.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        try:
            if kind == "info":
                stub.GetModelInfo(pb.GetModelInfoRequest(model=model), metadata=metadata)
            elif kind == "transcribe":
                options = pb.TranscriptionOptions(beam_size=2 if fast else 1)
                request = pb.TranscribeRequest(audio=PCM, model=model, options=options)
                stub.Transcribe(request, timeout=timeout, metadata=metadata)
            elif kind == "live":
                config = pb.StreamingRecognitionConfig(
                    encoding=pb.PCM_ENCODING_INT16, sample_rate=16000, model=model
                )
                requests = [pb.StreamingRecognizeRequest(config=config),
                            pb.StreamingRecognizeRequest(audio_content=PCM.pcm.data)]  # fmt: skip
                list(stub.StreamingRecognize(iter(requests), timeout=timeout, metadata=metadata))
            else:  # a stream the client cancels after its first message
                call = stub.StreamTranscribe(
                    pb.StreamTranscribeRequest(audio=PCM, model=model), metadata=metadata
                )
                next(call, None)
                call.cancel()
        except grpc.RpcError:
            pass


def http_request(server: BackgroundServer, path: str, model: str, rid: str, audio: bool) -> None:
    base = f"http://{server.http_address}"
    if path == "transcribe":
        wav = io.BytesIO()
        sf.write(wav, np.zeros(4000, np.float32), 16000, format="WAV")
        data = wav.getvalue() if audio else b"\x00garbage" * 10
        body, kind = multipart([("file", "a.wav", data), ("model", None, model.encode())])
        headers = {"Content-Type": kind, "X-Request-Id": rid}
        http("POST", f"{base}/v1/audio/transcriptions", headers, body)
    else:
        http("GET", base + urllib.parse.quote(path, safe="/"), {"X-Request-Id": rid})


REQUEST = st.one_of(
    st.tuples(st.just("grpc"), st.sampled_from(["info", "transcribe", "live", "cancel"]),
              st.sampled_from(["", MODEL]) | TOKEN, TOKEN, st.booleans()),
    st.tuples(st.just("http"), st.sampled_from(["transcribe", "/v1/models", "/health"])
              | st.builds(lambda p: "/v1/models/" + p, TOKEN)
              | st.builds(lambda p: "/" + p.replace(" ", ""), TOKEN),
              st.sampled_from(["", MODEL]) | TOKEN, TOKEN, st.booleans()),
)  # fmt: skip
EXAMPLES = int(os.environ.get("XATTN_FUZZ_EXAMPLES", "12"))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(requests=st.lists(REQUEST, min_size=1, max_size=4))
def test_labels_stay_within_their_sets(
    server: BackgroundServer, requests: list[tuple], fuzz_tried: dict
) -> None:
    threads = []
    for face, kind, model, rid, flag in requests:
        if face == "grpc":
            target, args = grpc_request, (server, kind, model, rid, flag)
        else:
            target, args = http_request, (server, kind, model, rid, flag)
        threads.append(threading.Thread(target=target, args=args))  # at once: some refused
        fuzz_tried[f"metrics labels: {face} requests"] += 1
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wait_idle(server)
    check_exposition(server, {r[2] for r in requests} | {r[3] for r in requests})
