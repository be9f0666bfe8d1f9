"""Cached decoder steps batched across decodes (step_batcher.py): the same numbers as one at a
time, whatever the decodes' lengths and windows, and the same transcripts from threads."""

from __future__ import annotations

import dataclasses
import threading
import time
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from xattn.model.audio.features import N_FRAMES, decode_audio, log_mel_spectrogram, pad_or_trim
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent
from xattn.model.decode.step_batcher import StepBatcher, encode_window
from xattn.model.net.kv_cache import CacheBatch, KVCache, joined_rows
from xattn.model.pipeline import Pipeline, load_pipeline


@cache
def pipeline(compute: str) -> Pipeline:
    return load_pipeline("tiny.en", compute=compute)


@pytest.mark.parametrize("one_batch", [False, True])
def test_cache_batch_step_equals_single_steps(jfk_path: Path, one_batch: bool) -> None:
    """Three decodes at different lengths over different windows, one batched step each; with
    `one_batch` the windows' cross K/V are views of one batch's (CrossKV.window), whose
    attention runs as one over the three (joined_rows: one run, no copy)."""
    model = pipeline("fp32").model
    audio = decode_audio(jfk_path)
    windows = [audio, audio[16000 * 3 :], np.zeros_like(audio)]
    prompts = [[50257, 50362], [50257, 50362, 400, 370], [50257]]
    with torch.inference_mode():
        mels = [pad_or_trim(log_mel_spectrogram(w, 80), N_FRAMES) for w in windows]
        features = [model.encoder(m[None]) for m in mels]  # 3 × [1, 1500, d]

        def caches(joined: bool) -> list:
            cross = model.decoder.cross_kv(torch.cat(features))  # [3, H, d_k, 1500] a layer
            out = []
            for i, (f, p) in enumerate(zip(features, prompts, strict=True)):
                c = (
                    KVCache(cross.window(i), model.dims.n_text_ctx)
                    if joined
                    else model.new_cache(f)
                )
                model.decoder(torch.tensor([p]), c)
                out.append(c)
            return out

        singles, batched = caches(False), caches(one_batch)
        runs = joined_rows(
            *([c.cross.k[0] for c in batched], [c.cross.v[0] for c in batched]),
            [slice(i, i + 1) for i in range(3)],
        )
        assert len(runs) == (1 if one_batch else 3)
        if one_batch:
            assert runs[0][0].data_ptr() == batched[0].cross.k[0].data_ptr()  # a view
            assert runs[0][0].shape[0] == 3 and runs[0][2] == slice(0, 3)
        nxt = [290, 1560, 50256]
        one = [
            model.decoder(torch.tensor([[t]]), c, need_scores=True, hidden=True)
            for t, c in zip(nxt, singles, strict=True)
        ]
        h, scores = model.decoder(
            torch.tensor([[t] for t in nxt]), CacheBatch(batched), need_scores=True, hidden=True
        )
    assert [c.length for c in batched] == [c.length for c in singles] == [3, 5, 2]
    for i, (h1, s1) in enumerate(one):
        assert torch.allclose(h[i : i + 1], h1, atol=1e-4, rtol=1e-5)
        for layer, s in enumerate(s1):
            assert torch.allclose(scores[layer][i : i + 1], s, atol=1e-4, rtol=1e-5)
    for a, b in zip(batched, singles, strict=True):  # the caches took the same rows
        n = a.length
        assert torch.allclose(a.self_k[:, :, :, :n], b.self_k[:, :, :, :n], atol=1e-5)


def test_packed_weights_give_the_plain_numbers() -> None:
    """Once packed (what a StepBatcher does), the decoder's linear maps and its projection (from
    2 rows) take the kernel this CPU measured best over copies of the weights in its layout
    (oneDNN's blocked one, or the packed one of our extension): the same numbers as the plain
    matmul, row by row, for any number of rows."""
    decoder = pipeline("fp32").model.decoder
    d = decoder.ln.normalized_shape[0]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(20, 1, d, generator=g)
    mlp = decoder.blocks[0].mlp[0]
    with torch.inference_mode():
        decoder.pack()
        if mlp.blocked is None and mlp.packed is None:
            pytest.skip("no copies: this torch has no oneDNN linear kernel, and no extension")
        rows = torch.cat([decoder.project(h[i : i + 1]) for i in range(len(h))])  # [20, 1, V]
        plain = torch.nn.functional.linear(h, mlp.weight, mlp.bias)  # [20, 1, 4d]
        for n in (1, 2, 8, 16, 20):
            logits = decoder.project(h[:n])  # [n, 1, V]
            assert logits.shape == rows[:n].shape
            assert torch.allclose(logits, rows[:n], atol=1e-4, rtol=1e-5)
            assert torch.allclose(mlp(h[:n]), plain[:n], atol=1e-4, rtol=1e-5)


def tokens_of(pipe: Pipeline, audio: np.ndarray) -> list[int]:
    options = DecodeOptions(return_attention=True, temperatures=(0.0,))
    return [e.id for e in pipe.transcribe(audio, options) if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("compute", ["fp32", "int8-logits"])
def test_threads_sharing_a_batcher_transcribe_as_alone(compute: str, jfk_path: Path) -> None:
    pipe = pipeline(compute)
    if compute == "int8-logits" and pipe.model.decoder.int8_logits is None:
        pytest.skip("no int8 kernels")
    audio = decode_audio(jfk_path)
    clips = [audio, audio[: 16000 * 6], audio[16000 * 2 :]]
    alone = [tokens_of(pipe, a) for a in clips]
    batcher = StepBatcher(pipe.model, linger=0.05)
    shared = dataclasses.replace(pipe, context=dataclasses.replace(pipe.context, batcher=batcher))
    out: list = [None] * len(clips)

    def work(i: int) -> None:
        out[i] = tokens_of(shared, clips[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(clips))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == alone
    assert batcher.stats.steps == sum(len(a) - 1 for a in alone)  # the first is the prompt
    assert batcher.stats.mean_batch > 1.0  # some steps did run together


def test_a_failing_step_raises_in_its_caller_and_the_batcher_goes_on(jfk_path: Path) -> None:
    model = pipeline("fp32").model
    batcher = StepBatcher(model)
    with torch.inference_mode():
        mel = pad_or_trim(log_mel_spectrogram(decode_audio(jfk_path), 80), N_FRAMES)
        features = batcher.call(model.encoder, mel[None])  # on the model thread
        cache = batcher.call(model.new_cache, features)
    full = cache.fork()
    full.length = full.n_ctx  # no room for one more token

    def finish(h: torch.Tensor, logits: torch.Tensor | None, scores: list | None) -> tuple:
        return h, logits, scores

    with batcher.joined(), pytest.raises(ValueError, match="decoder context full"):
        batcher.step(50257, full, need_scores=False, project=True, finish=finish)
    with batcher.joined(), pytest.raises(ZeroDivisionError):  # this step's own finish fails
        batcher.step(50257, cache.fork(), need_scores=False, project=False, finish=lambda *_: 1 / 0)
    with batcher.joined():
        out = batcher.step(50257, cache, need_scores=True, project=True, finish=finish)
    h, logits, scores = out
    assert h.shape == (model.dims.n_text_state,) and logits.shape == (model.dims.n_vocab,)
    assert len(scores) == model.dims.n_text_layer and scores[0].shape[:3] == (1, 6, 1)
    assert cache.length == 1 and batcher.stats.steps == 3


def test_close_stops_the_model_thread() -> None:
    batcher = StepBatcher(pipeline("fp32").model)
    thread = batcher.call(threading.current_thread)
    assert thread is not threading.current_thread() and thread.is_alive()
    batcher.close()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_a_full_context_is_refused_before_any_row_is_written() -> None:
    """One cache with no room left: a ValueError naming the full context, alone or in a
    batch, and no cache of the batch moves."""
    model = pipeline("fp32").model
    n_ctx = model.dims.n_text_ctx
    with torch.inference_mode():
        features = torch.zeros(1, model.dims.n_audio_ctx, model.dims.n_audio_state)
        room, full = model.new_cache(features), model.new_cache(features)
        full.length = n_ctx
        with pytest.raises(ValueError, match=f"decoder context full: {n_ctx + 1} > {n_ctx}"):
            model.decoder(torch.tensor([[50257]]), full)
        room.length = n_ctx - 1  # room for one token, not two
        with pytest.raises(ValueError, match="decoder context full"):
            model.decoder(torch.tensor([[50257, 50362]]), room)
        with pytest.raises(ValueError, match="decoder context full"):
            model.decoder(torch.tensor([[50257], [50257]]), CacheBatch([room, full]))
        assert (room.length, full.length) == (n_ctx - 1, n_ctx)
        model.decoder(torch.tensor([[50257]]), room)  # the last position still decodes
        assert room.length == n_ctx


def test_windows_waiting_for_the_encoder_are_encoded_in_one_call(jfk_path: Path) -> None:
    """batch_encoder (a GPU's default; forced here): three decodes' windows that wait while
    the model thread is busy go through the encoder as one call, each getting its own output
    and cross-attention K/V (as alone, up to float rounding)."""
    model = pipeline("fp32").model
    audio = decode_audio(jfk_path)
    mels = [
        pad_or_trim(log_mel_spectrogram(a, model.dims.n_mels), N_FRAMES)[None]
        for a in (audio, audio[16000 * 2 :], audio[: 16000 * 5])
    ]  # 3 × [1, n_mels, 3000]
    with torch.inference_mode():
        alone = [encode_window(model, m) for m in mels]
    batcher = StepBatcher(model, batch_encoder=True)
    gate, busy = threading.Event(), threading.Event()
    blocker = threading.Thread(target=batcher.call, args=(lambda: (busy.set(), gate.wait()),))
    blocker.start()
    busy.wait()  # the model thread is held: the windows below wait together
    out: list = [None] * 3

    def work(i: int) -> None:
        out[i] = batcher.encode(mels[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    while len(batcher._encodes) < 3:  # all three waiting (the model thread is held)
        time.sleep(0.001)
    gate.set()
    for t in (*threads, blocker):
        t.join(timeout=120)
    batcher.close()
    assert (batcher.stats.encoder_calls, batcher.stats.windows_encoded) == (1, 3)
    for (features, kv), (want_f, want_c) in zip(out, alone, strict=True):
        assert features.shape == want_f.shape
        torch.testing.assert_close(features, want_f, atol=1e-4, rtol=1e-4)
        for k, want_k in zip(kv.cross.k, want_c.cross.k, strict=True):
            torch.testing.assert_close(k, want_k, atol=1e-4, rtol=1e-4)
