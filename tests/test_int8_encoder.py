"""The int8 encoder computes (approximate, opt-in): they run, their tokens carry rows of the
right shape, the text of jfk.flac is fp32's, the fp32 path is untouched by them, `auto`
never picks them, and the server and its --help label them approximate."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xattn.model.audio.features import N_FRAMES, decode_audio, log_mel_spectrogram, pad_or_trim
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript
from xattn.model.net.logits import int8_supported
from xattn.model.net.quantized import Int8Linear, has_vnni
from xattn.model.pipeline import (
    ALIASES,
    APPROXIMATE,
    CpuCapability,
    Pipeline,
    compute_help,
    compute_note,
    load_pipeline,
    resolve_compute,
)
from xattn.service.__main__ import parse_args
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

INT8 = ["int8-encoder", "int8-encoder+int8-logits"]
needs_fbgemm = pytest.mark.skipif(not int8_supported(), reason="no fbgemm int8 kernels here")


@cache
def pipeline(compute: str) -> Pipeline:
    return load_pipeline("tiny.en", compute=compute)


@cache
def transcribe(compute: str, clip: Path) -> tuple[list[TokenEvent], Transcript]:
    options = DecodeOptions(word_timestamps=True, return_attention=True)
    events = list(pipeline(compute).transcribe(decode_audio(clip), options))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    return tokens, next(e for e in events if isinstance(e, Transcript))


@needs_fbgemm
@pytest.mark.parametrize("compute", INT8)
def test_int8_encoder_transcribes_jfk_as_fp32_with_rows(compute: str, jfk_path: Path) -> None:
    """Every token carries its row [layers, heads, 1500] (softmax weights), and the text is
    fp32's: the same text tokens, the same words; what moves are times (measured on
    jfk.flac: one segment timestamp token 0.2 s later, word times within 0.04 s)."""
    tokens, transcript = transcribe(compute, jfk_path)
    exact_tokens, exact = transcribe("fp32", jfk_path)
    d = pipeline(compute).dims
    assert tokens
    for t in tokens:
        assert t.attention is not None and t.attention.dtype == np.float32
        assert t.attention.shape == (d.n_text_layer, d.n_text_head, d.n_audio_ctx)
        assert np.allclose(t.attention.sum(-1), 1.0, atol=1e-4)
    if not has_vnni():  # 7-bit activations (fbgemm's int16 sums): more error, held to words
        assert words_of(transcript.text) == words_of(exact.text)
        return
    assert transcript.text == exact.text
    ts = pipeline(compute).tokenizer.timestamp_begin
    text_ids = [[t.id for t in got if t.id < ts] for got in (tokens, exact_tokens)]
    assert text_ids[0] == text_ids[1]
    stamps = [[t.id for t in got if t.id >= ts] for got in (tokens, exact_tokens)]
    assert len(stamps[0]) == len(stamps[1])
    moved = max(abs(a - b) for a, b in zip(*stamps, strict=True)) * 0.02  # seconds
    assert moved <= 0.4, moved
    words = [w for s in transcript.segments for w in s.words]
    exact_words = [w for s in exact.segments for w in s.words]
    assert [w.word for w in words] == [w.word for w in exact_words]
    worst = max(
        max(abs(a.start - b.start), abs(a.end - b.end))
        for a, b in zip(words, exact_words, strict=True)
    )
    print(f"{compute}: timestamps moved by {moved:.2f} s, word times by {worst:.3f} s")
    assert worst <= 0.1, worst


@needs_fbgemm
def test_int8_maps_share_the_weights_and_leave_fp32_untouched(jfk_path: Path) -> None:
    """The int8 blocks hold no parameters of their own (state_dict unchanged); the encoder at
    fp32 after them is bitwise the fp32 encoder; a call can ask for int8 alone; and the int8
    features stay near fp32's (measured: ~9 % relative error on jfk.flac)."""
    fp32 = pipeline("fp32").model
    model = load_pipeline("tiny.en", compute="int8-encoder").model
    assert model.state_dict().keys() == fp32.state_dict().keys()
    mel = pad_or_trim(log_mel_spectrogram(decode_audio(jfk_path), 80), N_FRAMES)[None]
    with torch.inference_mode():
        exact = fp32.encoder(mel)
        int8 = model.encoder(mel)
        assert torch.equal(fp32.encoder(mel, "int8"), int8)
        model.set_compute("fp32")
        assert torch.equal(model.encoder(mel), exact)
    error = float((int8 - exact).norm() / exact.norm())
    assert 0 < error < 0.2, error


def words_of(text: str) -> list[str]:
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()


@needs_fbgemm
@pytest.mark.parametrize("reduce_range", [False, True])
def test_int8_linear_is_the_product_within_its_rounding(reduce_range: bool) -> None:
    if not reduce_range and not has_vnni():
        pytest.skip("8-bit activations need VNNI (without it fbgemm's int16 sums saturate)")
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(384, 1536)
    x = torch.randn(2, 1500, 384, generator=gen)
    with torch.inference_mode():
        exact = F.linear(x, linear.weight, linear.bias)
        y = Int8Linear(linear, reduce_range)(x)
    assert y.shape == exact.shape and y.dtype == torch.float32
    error = float((y - exact).norm() / exact.norm())
    assert error < (0.03 if reduce_range else 0.015), error


@pytest.mark.parametrize(
    "cpu", [CpuCapability(int8=i, bf16=b) for i in (True, False) for b in (True, False)]
)
def test_auto_never_picks_an_approximate_compute(cpu: CpuCapability) -> None:
    assert resolve_compute("auto", "cpu", cpu) not in APPROXIMATE
    for compute in [*INT8, *ALIASES]:
        exact, note = compute_note(compute)
        assert not exact and note.startswith("approximate"), compute
    assert resolve_compute("int8", "cpu", cpu) == "int8-encoder+int8-logits"


def test_help_labels_every_approximate_compute() -> None:
    text = compute_help()
    for compute in APPROXIMATE:
        assert compute in text
    assert text.count("APPROXIMATE") >= 3 and "int8-encoder (APPROXIMATE" in text


@needs_fbgemm
def test_server_reports_the_int8_alias_as_its_approximate_compute() -> None:
    assert parse_args(["--compute", "int8"]).compute == "int8"
    with BackgroundServer(ServerConfig(port=0, compute="int8")) as server:
        with grpc.insecure_channel(server.address) as channel:
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.compute_type == "int8-encoder+int8-logits"
    assert not info.compute_exact and info.compute_note.startswith("approximate")
