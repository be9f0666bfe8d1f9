"""The fast compute paths against the exact fp32 path: token-identical transcripts, the same
words, word times within 0.02 s, attention rows alike; the int8 logits' error model; and the
server's --compute flag."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xattn.model.audio.features import decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript
from xattn.model.net.logits import MASS_TOKENS, SIGMAS, Int8Logits, int8_supported
from xattn.model.net.whisper import encoder_attention
from xattn.model.pipeline import (
    CpuCapability,
    Pipeline,
    _cpu_has_bf16,
    compute_note,
    load_pipeline,
    resolve_compute,
    resolve_live_precision,
)
from xattn.service.__main__ import config_from_args, parse_args
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc


@cache
def pipeline(name: str, compute: str) -> Pipeline:
    return load_pipeline(name, compute=compute)


@cache
def run(name: str, compute: str, clip: Path) -> tuple[list[TokenEvent], list[tuple]]:
    """Token events and (word, start, end) of one transcription, default options but rows."""
    options = DecodeOptions(word_timestamps=True, return_attention=True)
    tokens, words = [], []
    for event in pipeline(name, compute).transcribe(decode_audio(clip), options):
        if isinstance(event, TokenEvent):
            tokens.append(event)
            assert event.attention is not None and event.attention.dtype == np.float32
        elif isinstance(event, Transcript):
            words = [(w.word, w.start, w.end) for s in event.segments for w in s.words]
    return tokens, words


CASES = [
    ("tiny.en", "jfk.flac"),
    ("tiny.en", "multilingual.mp3"),
    ("base", "jfk.flac"),
    ("base", "multilingual.mp3"),
]
FAST = ["bf16-encoder", "int8-logits", "bf16-encoder+int8-logits"]


@pytest.mark.parametrize("compute", FAST)
@pytest.mark.parametrize(("name", "clip"), CASES)
def test_fast_paths_match_fp32(name: str, clip: str, compute: str, shared_audio_dir: Path) -> None:
    path = shared_audio_dir / clip
    if not path.is_file():
        pytest.skip(f"missing {path}")
    if "int8" in compute and not int8_supported():
        pytest.skip("this torch has no fbgemm int8 kernels")
    if "bf16" in compute and not _cpu_has_bf16() and (name, clip, compute) != (*CASES[0], FAST[0]):
        pytest.skip("no native bf16 here (emulated, ~7x slower): tiny.en/jfk pins its numerics")
    exact, exact_words = run(name, "fp32", path)
    fast, fast_words = run(name, compute, path)
    assert [t.id for t in fast] == [t.id for t in exact]
    if "bf16" not in compute:  # the decoder's hidden states are fp32's: so are the rows
        rows = np.stack([t.attention for t in fast]), np.stack([t.attention for t in exact])
        assert np.abs(rows[0] - rows[1]).max() < 1e-5
        # only the softmax normaliser of a step's log-probability sums int8 logits
        worst = max(abs(a.logprob - b.logprob) for a, b in zip(fast, exact, strict=True))
        assert worst < 0.1, worst
    assert [w for w, _, _ in fast_words] == [w for w, _, _ in exact_words]
    worst = max(
        max(abs(a[1] - b[1]), abs(a[2] - b[2]))
        for a, b in zip(fast_words, exact_words, strict=True)
    )
    # a frame (0.02 s); bf16's attention scores (whisper.encoder_attention) two on jfk
    assert worst <= (0.04 if "bf16" in compute else 0.02) + 1e-9, worst


@pytest.mark.parametrize("frames", [1500, 575, 100])
def test_encoder_attention_in_bf16_errs_as_bf16_does(frames: int) -> None:
    """The encoder's attention over a batch of windows: in fp32 the fused kernel itself; in
    bf16 (explicit products over blocks of queries, the last one short) within bf16's error:
    on average at most 3x the fused kernel's own bf16 error against fp32 (measured: 2x; an
    unscaled or misplaced block is off by the values' size)."""
    g = torch.Generator().manual_seed(frames)
    q, k, v = (2 * torch.randn(2, 6, frames, 64, generator=g) for _ in range(3))  # [B, H, T, d]
    exact = F.scaled_dot_product_attention(q, k, v)  # [B, H, T, d]
    assert torch.equal(encoder_attention(q, k, v), exact)
    low = [t.bfloat16() for t in (q, k, v)]
    ours = encoder_attention(*low)
    assert ours.dtype == torch.bfloat16 and ours.shape == exact.shape
    fused = F.scaled_dot_product_attention(*low)
    error, fused_error = ((x.float() - exact).abs().mean() for x in (ours, fused))
    assert error <= 3 * fused_error and error < 0.02, (error, fused_error)


def test_int8_logits_error_model_and_exact_rescoring(jfk_path: Path) -> None:
    """Over real decoder states (the steps of jfk.flac), the int8 logits err by less than
    SIGMAS of their modelled σ, and the logits that decide a step come back exactly as fp32
    computes them."""
    if not int8_supported():
        pytest.skip("this torch has no fbgemm int8 kernels")
    pipe = pipeline("tiny.en", "fp32")
    decoder, head = pipe.model.decoder, pipeline("tiny.en", "int8-logits").model.decoder.int8_logits
    states: list = []
    hook = decoder.ln.register_forward_pre_hook(lambda _m, a: states.append(a[0][0, -1].clone()))
    try:
        run.__wrapped__("tiny.en", "fp32", jfk_path)
    finally:
        hook.remove()
    ts = pipe.tokenizer.timestamp_begin
    worst = 0.0
    with torch.inference_mode():
        for h in states:  # [d] before the final LayerNorm
            exact = decoder.project(h[None, None])[0, 0]  # [V], as the exact path
            approx, margin = head.approximate(h)  # SIGMAS × σ
            worst = max(worst, float(((approx - exact).abs() / margin).max()) * SIGMAS)
            chosen = head.logits(h, lambda _logits: None, ts)
            best = int(exact[:ts].argmax())
            assert int(chosen[:ts].argmax()) == best
            assert abs(float(chosen[best] - exact[best])) < 1e-4
            assert (chosen[ts:] - exact[ts:]).abs().max() < 1e-4
    assert len(states) > 20 and 1.0 < worst < SIGMAS, worst


def test_int8_logits_keep_the_mask_and_rescore_every_contender() -> None:
    """Tokens masked before the rescoring stay -inf even when fewer text tokens are allowed
    than the rescoring takes (it once gave the masked ones their exact logits), the allowed
    ones come back exact; and when many text tokens lie within the int8 error of the best,
    every one of them is rescored (the full candidate search), so the choice is fp32's."""
    if not int8_supported():
        pytest.skip("this torch has no fbgemm int8 kernels")
    pipe = pipeline("tiny.en", "int8-logits")
    decoder, head = pipe.model.decoder, pipe.model.decoder.int8_logits
    ts = pipe.tokenizer.timestamp_begin
    h = torch.randn(pipe.dims.n_text_state, generator=torch.Generator().manual_seed(3))
    allowed = torch.tensor([11, 220, 1000, pipe.tokenizer.eot])

    def keep_few(logits: torch.Tensor) -> None:
        keep = logits[allowed].clone()
        logits[:ts] = -torch.inf
        logits[allowed] = keep

    with torch.inference_mode():
        exact = decoder.project(h[None, None])[0, 0]  # [V]
        chosen = head.logits(h, keep_few, ts)
        assert torch.isfinite(chosen[:ts]).sum() == len(allowed)
        assert (chosen[allowed] - exact[allowed]).abs().max() < 1e-4
    # 100 text tokens that nearly tie with the best, far more than the K largest ones
    gen = torch.Generator().manual_seed(4)
    v, d, ts = 1000, 64, 900  # ids from 900 are "timestamps"
    weight = torch.randn(v, d, generator=gen) * 0.05
    weight[:100] = torch.randn(d, generator=gen) + 1e-4 * torch.randn(100, d, generator=gen)
    ln = torch.nn.LayerNorm(d)
    head = Int8Logits(weight, ln)
    h = weight[0] + 0.1 * torch.randn(d, generator=gen)
    with torch.inference_mode():
        exact = ln(h) @ weight.T  # [V]
        chosen = head.logits(h, lambda _logits: None, ts)
        approx, margin = head.approximate(h)
    contenders = (approx[:ts] + margin[:ts]) >= float((approx[:ts] - margin[:ts]).max())
    assert int(contenders.sum()) > MASS_TOKENS  # the case the full search is for
    assert int(chosen[:ts].argmax()) == int(exact[:ts].argmax())
    assert (chosen[:ts][contenders] - exact[:ts][contenders]).abs().max() < 1e-4
    assert (chosen[ts:] - exact[ts:]).abs().max() < 1e-4


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
    assert not info.compute_exact and "approximate" in info.compute_note


CPUS = {  # what the capability query answers on each kind of CPU
    "AVX2": CpuCapability(int8=True, bf16=False),
    "AVX-512 BF16": CpuCapability(int8=True, bf16=True),
    "AMX": CpuCapability(int8=True, bf16=True),
    "no fbgemm (e.g. ARM)": CpuCapability(int8=False, bf16=True),
}


@pytest.mark.parametrize("cpu", list(CPUS))
def test_auto_picks_only_exact_paths(cpu: str) -> None:
    """`auto` never picks bf16-encoder, even where the CPU runs bf16 natively: it is not exact
    (benchmarks/approx.py); it stays available by name, reported as approximate."""
    compute = resolve_compute("auto", "cpu", CPUS[cpu])
    assert compute == ("int8-logits" if CPUS[cpu].int8 else "fp32")
    assert compute_note(compute)[0]
    assert resolve_compute("auto", "cuda", CPUS[cpu]) == "fp32"  # not measured there yet
    assert resolve_compute("bf16-encoder", "cpu", CPUS[cpu]) == "bf16-encoder"
    exact, note = compute_note("bf16-encoder")
    assert not exact and note.startswith("approximate")
    assert resolve_compute("auto") in ("int8-logits", "fp32")  # this machine's answer
    assert parse_args([]).compute == "auto"  # the server's default


@pytest.mark.parametrize("cpu", list(CPUS))
def test_live_auto_takes_bf16_only_where_native(cpu: str) -> None:
    """--live-compute auto: the live steps' encoder in bf16 where the CPU runs it natively
    and the model's encoder is fp32 (live finals are judged by lag and WER, not tokens:
    benchmarks/live_wer.py); the file paths keep their compute."""
    native = CPUS[cpu].bf16
    assert resolve_live_precision("auto", "auto", "cpu", CPUS[cpu]) == ("bf16" if native else None)
    assert resolve_live_precision("auto", "int8-encoder", "cpu", CPUS[cpu]) is None
    assert resolve_live_precision("auto", "auto", "cuda", CPUS[cpu]) is None
    assert resolve_live_precision("model", "auto", "cpu", CPUS[cpu]) is None
    assert resolve_live_precision("fp32", "bf16-encoder", "cpu", CPUS[cpu]) == "fp32"
    with pytest.raises(ValueError, match="live compute"):
        resolve_live_precision("fp16", "auto")
    assert parse_args([]).live_compute == "auto"
    assert config_from_args(parse_args(["--live-compute", "int8"])).live_compute == "int8"
