"""The encoder's layer maps in int8 (the "int8-encoder" computes; approximate, opt-in).

On a CPU most of a 30 s window's encoder time goes to its layer maps (1,500 frames through
each) and to attention. `int8_blocks` gives the encoder's blocks a second set of maps,
torch's dynamic-quantized linear (`torch.ops.quantized.linear_dynamic`, the op behind
`torch.ao.quantization.quantize_dynamic`'s modules; fbgemm's kernels, on any x86 CPU with
AVX2, VNNI where it has it): the weights stored int8 with a scale per output row, the
activations quantized per call from their range (one scale and zero point for the call),
the int32 sums scaled back to fp32 with the bias. The convolutions, LayerNorms, GELU,
attention and residual adds stay fp32, and so does the decoder: the rows are computed from
the int8 encoder's features exactly as the fp32 path computes them from its own.

One scale for a whole call's activations is what makes the product fast, and what a few
large values spoil: every layer's input has some channels far larger than the rest (base's
fourth MLP: a few GELU outputs near 80 where most stay below 1, on speech and on silence
alike), and they would leave the others a fraction of the 8 bits. So the input channels
whose largest magnitude exceeds OUTLIER_RATIO times the median channel's are taken out
(at most 1/MAX_OUTLIER_SHARE of them, the largest) and multiplied in fp32 as a narrow product
added to the int8 one (LLM.int8()'s decomposition; base on the shared evaluation set, greedy:
without it 24 words of 452 differed from fp32's transcripts, with it 8).

The activations take 8 bits on a CPU with AVX-512 VNNI, whose int8 products sum in int32.
Without it fbgemm sums pairs of products in int16 first, which can saturate, so there they
take 7 bits (quantize_dynamic's `reduce_range`), as torch's own modules always do: twice
the rounding step (benchmarks/wer.py --computes measures the result where it runs).
"""

from __future__ import annotations

import copy
import warnings
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

OUTLIER_RATIO = 8.0  # input channels this many times the median channel's peak: fp32
MAX_OUTLIER_SHARE = 8  # at most 1/8 of the input channels (the largest) in fp32


@cache
def has_vnni() -> bool:
    """Whether this CPU has AVX-512 VNNI (fbgemm's int8 kernels then sum in int32)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(
        line.startswith("flags") and "avx512_vnni" in line.split() for line in info.splitlines()
    )


class Int8Linear(nn.Module):
    """x @ Wᵀ + b through torch's dynamic-quantized int8 linear, from an nn.Linear's weights."""

    def __init__(self, linear: nn.Linear, reduce_range: bool) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # [out, in]
        bias = None if linear.bias is None else linear.bias.detach().float()  # [out]
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127  # [out] symmetric, per row
        with warnings.catch_warnings():  # the quantized-tensor constructors warn of deprecation
            warnings.simplefilter("ignore")
            zero = torch.zeros_like(scale, dtype=torch.long)
            q = torch.quantize_per_channel(w, scale.double(), zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(q, bias)
        self.reduce_range = reduce_range
        self.weight_t = w.T  # [in, out] (a view of the fp32 weight): the outliers' product
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] -> [..., out]."""
        wide = outliers(x)  # [k] input channels
        if len(wide) == 0:
            return torch.ops.quantized.linear_dynamic(x, self._packed, self.reduce_range)
        rest = x.index_fill(-1, wide, 0.0)  # [..., in] the outliers zeroed
        y = torch.ops.quantized.linear_dynamic(rest, self._packed, self.reduce_range)
        return y + x[..., wide] @ self.weight_t[wide]  # [..., out]

    def extra_repr(self) -> str:
        bits = 7 if self.reduce_range else 8
        return f"in={self.in_features}, out={self.out_features}, {bits}-bit activations"


def outliers(x: Tensor) -> Tensor:
    """The input channels of x [..., in] to multiply in fp32 (see the module docstring)."""
    rows = x.reshape(-1, x.shape[-1])  # [N, in]
    peak = torch.maximum(-rows.amin(dim=0), rows.amax(dim=0))  # [in] (aminmax: 20x slower)
    wide = (peak > OUTLIER_RATIO * peak.median()).nonzero()[:, 0]  # [k]
    most = x.shape[-1] // MAX_OUTLIER_SHARE
    return wide if len(wide) <= most else peak.topk(most).indices


def int8_blocks(blocks: nn.ModuleList, reduce_range: bool | None = None) -> list[nn.Module]:
    """Copies of the encoder's `blocks` that share their weights and run every nn.Linear as
    an `Int8Linear` (reduce_range: 7-bit activations; default: where the CPU lacks VNNI).
    They are kept out of the model's modules (no state_dict entries, no .to()): built for
    the CPU, after the weights are loaded."""
    if reduce_range is None:
        reduce_range = not has_vnni()
    return [_with_int8_maps(block, reduce_range) for block in blocks]


def _with_int8_maps(module: nn.Module, reduce_range: bool) -> nn.Module:
    if isinstance(module, nn.Linear):
        return Int8Linear(module, reduce_range)
    twin = copy.copy(module)  # a shallow copy: the same parameters and buffers
    twin._modules = {
        name: None if m is None else _with_int8_maps(m, reduce_range)
        for name, m in module._modules.items()
    }
    return twin
