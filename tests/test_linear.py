"""The decoder step's CPU products (net/linear.py): the plain product's numbers, and they apply
to every weight that a step of the real model reads."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache

import pytest
import torch
import torch.nn.functional as F

from xattn.model.net.linear import (
    KERNELS,
    SPLIT,
    SPLIT_ROWS,
    Linear,
    StepKernels,
    blocked,
    choose_kernels,
    logits,
    onednn_linear,
    packed,
    packed_linear,
    split_columns,
    split_linear,
)
from xattn.model.pipeline import load_pipeline


@cache
def decoder() -> torch.nn.Module:
    return load_pipeline("tiny.en").model.decoder


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize(("n_out", "n_in"), [(1152, 384), (384, 1536), (SPLIT, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_split_linear_is_the_plain_product(n_out: int, n_in: int, bias: bool) -> None:
    g = generator()
    w = torch.randn(n_out, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    for shape in ((n_in,), (1, n_in), (1, 1, n_in), (2, 1, n_in), (SPLIT_ROWS, n_in)):
        x = torch.randn(shape, generator=g)
        y = split_linear(x, w, b)
        assert y is not None and y.shape == (*shape[:-1], n_out)
        assert torch.allclose(y, F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    rows = torch.randn(3, 2 * n_in, generator=g)
    for x in (rows[1:2, :n_in], rows[:2, ::2]):  # a view at an offset, a strided one
        assert torch.allclose(split_linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_split_linear_declines_what_it_cannot_split() -> None:
    g = generator()
    w = torch.randn(64, 32, generator=g)
    assert split_linear(torch.randn(SPLIT_ROWS + 1, 32, generator=g), w, None) is None
    assert split_linear(torch.randn(1, 32), torch.randn(SPLIT + 1, 32), None) is None
    assert split_linear(torch.randn(1, 32), torch.randn(32, 64).T, None) is None  # not row-major
    assert split_linear(torch.randn(1, 32, dtype=torch.float64), w, None) is None


@pytest.mark.parametrize("n", [1000, 1001, 1500, 1])
def test_split_columns_is_the_plain_product(n: int) -> None:
    """Odd widths too (multilingual vocabularies: 51,865): the last column apart."""
    g = generator()
    wt = torch.randn(384, n, generator=g)  # rows contiguous: a column-major [n, 384] weight's ᵀ
    x = torch.randn(1, 1, 384, generator=g)
    y = split_columns(x, wt)
    assert y is not None and y.shape == (1, 1, n)
    assert torch.allclose(y, x @ wt, rtol=1e-5, atol=1e-4)
    assert split_columns(torch.randn(2, 384, generator=g), wt) is None  # two rows
    w = wt.clone().requires_grad_()  # autograd goes through (no out= arguments)
    split_columns(x, w).sum().backward()
    assert w.grad is not None


def test_every_step_map_of_the_model_splits() -> None:
    """A cached step of one row can take the split products for all its weights (where this
    CPU chose them): the layers' maps are row-major with widths that split, and the
    projection's rows are contiguous."""
    dec = decoder()
    maps = [m for m in dec.modules() if isinstance(m, Linear)]
    assert len(maps) == 6 * len(dec.blocks)
    g = generator()
    with torch.inference_mode():
        for m in maps:
            x = torch.randn(1, 1, m.in_features, generator=g)
            y = split_linear(x, m.weight, m.bias)
            assert y is not None, m
            assert torch.allclose(m(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-4)
        h = torch.randn(1, 1, dec.ln.normalized_shape[0], generator=g)
        x = dec.ln(h)
        wt = dec.token_embedding.weight.T
        assert split_columns(x, wt) is not None
        assert torch.allclose(dec.project(h), x @ wt, rtol=1e-5, atol=1e-4)


def test_onednn_linear_is_the_plain_product() -> None:
    """From 2 rows, over the weight as stored (row- or column-major) or its blocked copy."""
    g = generator()
    w = torch.randn(1000, 384, generator=g)
    b = torch.randn(1000, generator=g)
    weights = {"row-major": w, "column-major": w.T.contiguous().T, "blocked": blocked(w)}
    if weights["blocked"] is None:
        pytest.skip("this torch has no oneDNN linear kernel")
    for shape in ((2, 384), (1, 29, 384), (4, 8, 384), (300, 384)):
        x = torch.randn(shape, generator=g)
        for name, weight in weights.items():
            for bias in (b, None):
                y = onednn_linear(x, weight, bias)
                assert y is not None and y.shape == (*shape[:-1], 1000), name
                assert torch.allclose(y, F.linear(x, w, bias), rtol=1e-5, atol=1e-4), name


def test_onednn_linear_declines_what_it_cannot_take() -> None:
    g = generator()
    w = torch.randn(64, 32, generator=g)
    assert onednn_linear(torch.randn(1, 32, generator=g), w, None) is None  # one row: split
    assert onednn_linear(torch.randn(4, 32, generator=g), None, None) is None
    assert onednn_linear(torch.randn(4, 32, dtype=torch.float64), w.double(), None) is None
    x = torch.randn(4, 32, generator=g, requires_grad=True)  # autograd: the plain product
    assert onednn_linear(x, w, None) is None
    with torch.no_grad():
        assert onednn_linear(x, w, None) is not None


def test_the_projection_of_several_rows_takes_onednn() -> None:
    """The word-timestamp pass and the first step project several rows: oneDNN's kernel over
    the column-major embedding itself (no copy), the plain product's numbers."""
    dec = decoder()
    h = torch.randn(1, 29, dec.ln.normalized_shape[0], generator=generator())
    with torch.inference_mode():
        x, w = dec.ln(h), dec.token_embedding.weight
        assert not w.is_contiguous() and w.T.is_contiguous()  # column-major
        if onednn_linear(x, w, None) is None:
            pytest.skip("this torch has no oneDNN linear kernel")
        assert torch.allclose(dec.project(h), x @ w.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_of_a_map_is_the_plain_product(kernel: str) -> None:
    """Whatever the machine chose (StepKernels), a layer map's rows are the plain product's:
    one row, a few and many, packed or not (a kernel that does not apply falls through)."""
    g = generator()
    m = Linear(384, 1536)
    kernels = StepKernels(one=kernel, few=kernel, many=kernel)
    with torch.inference_mode():
        for copies in (False, True):
            m.blocked = blocked(m.weight) if copies else None
            m.packed = packed(m.weight) if copies else None
            m.kernels = kernels
            for rows in (1, 3, 8, 20):
                x = torch.randn(rows, 1, 384, generator=g)
                plain = F.linear(x, m.weight, m.bias)
                assert torch.allclose(m(x), plain, rtol=1e-5, atol=1e-4), (kernel, rows)


def test_the_decoder_takes_the_kernels_measured_on_this_cpu() -> None:
    """choose_kernels times each band's candidates here and names one that applies to it;
    every layer map of the loaded decoder carries the choice."""
    dec = decoder()
    maps = [m for m in dec.modules() if isinstance(m, Linear)]
    chosen = choose_kernels(maps, repeats=1)
    assert chosen.one in ("split", "plain", "packed")  # oneDNN's kernel takes 2 rows or more
    assert chosen.few in KERNELS and chosen.many != "split"  # split: up to 4 rows
    assert len({m.kernels for m in maps}) == 1  # load_pipeline chose for all of them
    with pytest.raises(ValueError, match="kernels are among"):
        StepKernels(one="fast")
    assert StepKernels("split", "plain", "onednn").for_rows(1) == "split"
    assert StepKernels("split", "plain", "onednn").for_rows(SPLIT_ROWS) == "plain"
    assert StepKernels("split", "plain", "onednn").for_rows(SPLIT_ROWS + 1) == "onednn"


def test_the_packed_kernel_is_the_plain_product() -> None:
    """packed_linear (the C++ extension's): any rows (grouped as the CPU's registers allow),
    outputs that do not fill its last block of 32, with and without a bias, views of rows;
    and the projection through it (`logits`) for a beam's rows."""
    if packed(torch.zeros(32, 8)) is None:
        pytest.skip("the C++ extension is not built (make install builds it)")
    g = generator()
    with torch.inference_mode():
        for n_out, n_in in ((1152, 384), (1000, 96), (7, 5)):
            w = torch.randn(n_out, n_in, generator=g)
            b = torch.randn(n_out, generator=g)
            copy = packed(w)
            for rows in (1, 2, 3, 5, 8, 9, 20):
                x = torch.randn(rows, 1, n_in, generator=g)
                for bias in (b, None):
                    y = packed_linear(x, copy, bias, n_out)
                    assert y is not None and y.shape == (rows, 1, n_out)
                    assert torch.allclose(y, F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
            x = torch.randn(3, 2 * n_in, generator=g)[:, ::2]  # strided rows
            assert torch.allclose(packed_linear(x, copy, b, n_out), F.linear(x, w, b), atol=1e-4)
        dec = decoder()
        w = dec.token_embedding.weight  # [n_vocab, d], column-major
        x = torch.randn(5, 1, w.shape[1], generator=g)
        y = logits(x, w, None, packed(w))
        assert torch.allclose(y, x @ w.T, rtol=1e-5, atol=1e-4)
    assert packed_linear(x, None, None, 7) is None  # no copy: the caller takes another product


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_the_packed_kernel_of_narrower_cpus(isa: str) -> None:
    """The packed kernel's AVX2 and generic forms (what other hosts run), taken here by
    XATTN_PACKED_ISA: the plain product's numbers."""
    if packed(torch.zeros(32, 8)) is None:
        pytest.skip("the C++ extension is not built (make install builds it)")
    script = (
        "import torch, torch.nn.functional as F\n"
        "from xattn.model.net.linear import packed, packed_linear\n"
        "torch.set_grad_enabled(False)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "w, b = torch.randn(1000, 96, generator=g), torch.randn(1000, generator=g)\n"
        "for rows in (1, 2, 3, 4, 7, 9):\n"
        "    x = torch.randn(rows, 96, generator=g)\n"
        "    y = packed_linear(x, packed(w), b, 1000)\n"
        "    assert torch.allclose(y, F.linear(x, w, b), rtol=1e-5, atol=1e-4), rows\n"
    )
    env = {**os.environ, "XATTN_PACKED_ISA": isa}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
