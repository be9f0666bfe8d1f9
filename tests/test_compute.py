"""The bf16-encoder compute path against the exact fp32 path: token-identical transcripts,
the same words, word times within 0.02 s; and the server's --compute flag."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import grpc
import numpy as np
import pytest

from model.audio import decode_audio
from model.decoding import DecodeOptions
from model.pipeline import Pipeline, _cpu_has_bf16, load_pipeline, resolve_compute
from model.results import TokenEvent, Transcript
from service.__main__ import config_from_args, parse_args
from service.background import BackgroundServer
from service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc


@cache
def pipeline(name: str, compute: str) -> Pipeline:
    return load_pipeline(name, compute=compute)


def run(pipe: Pipeline, audio: np.ndarray) -> tuple[list[int], list[tuple[str, float, float]]]:
    options = DecodeOptions(word_timestamps=True, return_attention=True)
    tokens, words = [], []
    for event in pipe.transcribe(audio, options):
        if isinstance(event, TokenEvent):
            tokens.append(event.id)
            assert event.attention is not None and event.attention.dtype == np.float32
        elif isinstance(event, Transcript):
            words = [(w.word, w.start, w.end) for s in event.segments for w in s.words]
    return tokens, words


@pytest.mark.parametrize(
    ("name", "clip"),
    [("tiny.en", "jfk.flac"), ("base", "jfk.flac"), ("base", "multilingual.mp3")],
)
def test_bf16_encoder_matches_fp32(name: str, clip: str, shared_audio_dir: Path) -> None:
    path = shared_audio_dir / clip
    if not path.is_file():
        pytest.skip(f"missing {path}")
    audio = decode_audio(path)
    exact_tokens, exact_words = run(pipeline(name, "fp32"), audio)
    fast_tokens, fast_words = run(pipeline(name, "bf16-encoder"), audio)
    assert fast_tokens == exact_tokens
    assert [w for w, _, _ in fast_words] == [w for w, _, _ in exact_words]
    worst = max(
        max(abs(a[1] - b[1]), abs(a[2] - b[2]))
        for a, b in zip(fast_words, exact_words, strict=True)
    )
    assert worst <= 0.02 + 1e-9, worst


def test_unknown_compute_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compute"):
        pipeline("tiny.en", "fp32").model.set_compute("int3")
    with pytest.raises(SystemExit):
        parse_args(["--compute", "int3"])


def test_server_runs_and_reports_the_compute_path() -> None:
    config = config_from_args(parse_args(["--port", "0", "--compute", "bf16-encoder"]))
    assert config.compute == "bf16-encoder"
    with BackgroundServer(ServerConfig(port=0, compute=config.compute)) as server:  # loads it
        with grpc.insecure_channel(server.address) as channel:
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.compute_type == "bf16-encoder"


def test_auto_picks_bf16_encoder_only_where_the_cpu_has_bf16() -> None:
    assert resolve_compute("fp32") == "fp32"
    assert resolve_compute("bf16-encoder") == "bf16-encoder"
    assert resolve_compute("auto") == ("bf16-encoder" if _cpu_has_bf16() else "fp32")
    assert resolve_compute("auto", "cuda") == "fp32"  # not measured there yet
    assert parse_args([]).compute == "auto"  # the server's default
