"""The C++ decoder step (xattn.model.net.fused): bitwise the Python step's numbers wherever the
decoder takes it (one row, beams over one window, rows of several windows, batches of caches,
with and without the cross-attention scores), real decodes token for token and row for row,
and the Python step wherever it does not apply. CI builds it (`make install`); elsewhere
these tests are skipped when it is not built."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
import torch

from xattn.model.audio.features import decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent
from xattn.model.net import fused
from xattn.model.net.kv_cache import CacheBatch, KVCache
from xattn.model.net.linear import Linear, StepKernels, packed
from xattn.model.pipeline import Pipeline, load_pipeline

EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval"


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if fused.extension() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the C++ decoder step is not built (make install builds it)")
        pytest.skip("the C++ decoder step is not built (make install builds it)")


@cache
def pipe() -> Pipeline:
    return load_pipeline("tiny.en")


def python_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers in Python (the extension's other kernels stay: packed_linear)."""
    monkeypatch.setattr(fused, "step", lambda *args: None)


def watch_step(monkeypatch: pytest.MonkeyPatch, step: Callable[..., object]) -> None:
    """The extension as built, its decoder_step through `step(step_as_built, *args)`."""
    ext = fused.extension()

    class Watched:
        def __getattr__(self, name: str) -> object:
            return getattr(ext, name)

        def decoder_step(self, *args: object) -> object:
            return step(ext.decoder_step, *args)

    monkeypatch.setattr(fused, "extension", lambda: Watched())


def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each C++ step."""
    calls: list[int] = []

    def step(built: Callable[..., object], *args: object) -> object:
        calls.append(1)
        return built(*args)

    watch_step(monkeypatch, step)
    return calls


def refused(monkeypatch: pytest.MonkeyPatch) -> None:
    watch_step(monkeypatch, lambda *args: pytest.fail("took the C++ step"))


def steps(cache_: KVCache | CacheBatch, need: bool, rows: int, n: int = 6) -> list:
    """n cached steps of `rows` rows from the cache's current length: states and scores."""
    dec = pipe().model.decoder
    g = torch.Generator().manual_seed(1)
    out = []
    with torch.inference_mode():
        for _ in range(n):
            tokens = torch.randint(0, 50000, (rows, 1), generator=g)
            h, scores = dec(tokens, cache_, need_scores=need, hidden=True)
            out.append((h, scores))
    return out


def window(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        return pipe().model.encoder(torch.randn(1, 80, 3000, generator=g) * 0.3)  # [1, 1500, d]


def same(a: list, b: list) -> None:
    for (ha, sa), (hb, sb) in zip(a, b, strict=True):
        assert torch.equal(ha, hb)
        assert (sa is None) == (sb is None)
        for x, y in zip(sa or [], sb or [], strict=True):
            assert torch.equal(x, y)


def use_kernel(monkeypatch: pytest.MonkeyPatch, kernel: str, many: str) -> None:
    """Every layer map on `kernel` for one row and a few, `many` for more, with the packed
    copies that the packed kernel reads."""
    for m in pipe().model.decoder.modules():
        if isinstance(m, Linear):
            monkeypatch.setattr(m, "kernels", StepKernels(kernel, kernel, many))
            copy = packed(m.weight) if "packed" in (kernel, many) else None
            monkeypatch.setattr(m, "packed", copy)


@pytest.mark.parametrize("kernel", ["plain", "split", "packed"])
@pytest.mark.parametrize("need", [True, False])
@pytest.mark.parametrize("layout", ["one row", "beams of one window", "rows of two windows"])
def test_a_step_is_bitwise_the_python_step(
    monkeypatch: pytest.MonkeyPatch, layout: str, need: bool, kernel: str
) -> None:
    """Each layer map's product as StepKernels name it on some CPU: plain, split or packed for
    one row and a few; a beam's 5 rows take plain, or packed with the packed kernel."""
    model = pipe().model
    use_kernel(monkeypatch, kernel, "packed" if kernel == "packed" else "plain")

    def new_cache() -> KVCache:
        with torch.inference_mode():
            if layout == "one row":
                return model.new_cache(window(0))
            if layout == "rows of two windows":
                return model.new_cache(torch.cat([window(0), window(1)]))
            return KVCache(model.decoder.cross_kv(window(0)), model.dims.n_text_ctx, rows=5)

    rows = {"one row": 1, "beams of one window": 5, "rows of two windows": 2}[layout]
    calls = counted(monkeypatch)
    fast = steps(new_cache(), need, rows)
    assert len(calls) == 6  # every step took the C++ path
    python_step(monkeypatch)
    same(fast, steps(new_cache(), need, rows))


def batch_of_caches(layout: str, monkeypatch: pytest.MonkeyPatch) -> CacheBatch:
    """Decodes stepped together as the batcher steps them, each at its own length (primed by
    Python steps): one-row caches of windows encoded together (their attention runs as one),
    or those beside a beam search's rows over a window of its own and a lone window."""
    model = pipe().model
    dec = model.decoder
    with torch.inference_mode():
        cross = dec.cross_kv(torch.cat([window(0), window(1), window(2)]))
        caches = [KVCache(cross.window(i), model.dims.n_text_ctx) for i in range(3)]
        if layout == "mixed":
            beams = KVCache(dec.cross_kv(window(3)), model.dims.n_text_ctx, rows=3)
            lone = model.new_cache(window(4))
            caches = [beams, caches[0], caches[1], lone, caches[2]]
        with monkeypatch.context() as m:
            python_step(m)
            for i, c in enumerate(caches):
                for _ in range(i + 1):
                    dec(torch.full((c.rows, 1), 50257), c, hidden=True)
    return CacheBatch(caches)


@pytest.mark.parametrize("kernel", ["plain", "split", "packed"])
@pytest.mark.parametrize("need", [True, False])
@pytest.mark.parametrize("layout", ["windows of one batch", "mixed"])
def test_a_batch_of_caches_is_bitwise_the_python_step(
    monkeypatch: pytest.MonkeyPatch, layout: str, need: bool, kernel: str
) -> None:
    """A CacheBatch step (batched long-form windows, the server's requests stepped together):
    each cache's rows over their own past and window, the states and scores bit for bit."""
    use_kernel(monkeypatch, kernel, kernel)
    batch = batch_of_caches(layout, monkeypatch)
    rows = sum(c.rows for c in batch.caches)
    calls = counted(monkeypatch)
    fast = steps(batch, need, rows)
    assert len(calls) == 6
    python_step(monkeypatch)
    same(fast, steps(batch_of_caches(layout, monkeypatch), need, rows))


def test_what_it_does_not_take_runs_the_python_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several tokens at once (a prompt), maps on oneDNN's kernel, autograd: the Python step."""
    model = pipe().model
    refused(monkeypatch)
    dec = model.decoder
    with torch.inference_mode():
        dec(torch.tensor([[50257, 50362]]), model.new_cache(window(0)), hidden=True)
        for m in dec.modules():
            if isinstance(m, Linear):
                monkeypatch.setattr(m, "kernels", StepKernels("onednn", "onednn", "onednn"))
        batch = CacheBatch([model.new_cache(window(0)), model.new_cache(window(1))])
        dec(torch.tensor([[50257], [50257]]), batch, hidden=True)
        monkeypatch.undo()
        refused(monkeypatch)
        features = window(0).clone()
    with torch.no_grad():
        cache_ = model.new_cache(features)
    dec(torch.tensor([[50257]]), cache_, hidden=True)  # grad mode on: autograd's step


def events(monkeypatch: pytest.MonkeyPatch, audio, options: DecodeOptions, python: bool):
    with monkeypatch.context() as m:
        if python:
            python_step(m)
        got = list(pipe().transcribe(audio, options))
    tokens = [e for e in got if isinstance(e, TokenEvent)]
    return [(e.id, e.logprob, e.attention.tobytes()) for e in tokens], got[-1].text


@pytest.mark.parametrize("beam_size", [1, 5])
def test_decodes_are_token_for_token_and_row_for_row(
    monkeypatch: pytest.MonkeyPatch, jfk_path: Path, beam_size: int
) -> None:
    """jfk and a clip of the shared real-speech set, greedy and beam 5, rows and word times
    on: the same tokens, log-probabilities and attention rows, bit for bit."""
    manifest = [json.loads(line) for line in (EVAL / "manifest.jsonl").read_text().splitlines()]
    clips = [jfk_path, *[EVAL / r["file"] for r in manifest if r["language"] == "en"][:1]]
    options = DecodeOptions(
        temperatures=(0.0,), beam_size=beam_size, return_attention=True, word_timestamps=True
    )
    for clip in clips:
        audio = decode_audio(clip.read_bytes())
        fast, text = events(monkeypatch, audio, options, python=False)
        slow, text_python = events(monkeypatch, audio, options, python=True)
        assert text == text_python and len(fast) > 10
        assert fast == slow, clip.name
