"""The products of a decoder step on a CPU, where a step reads every weight once for one row
(or a few, batched) and is bound by how fast the weights stream from memory.

- One row, and up to 4 for the layers (`split_linear`, `split_columns`): MKL computes x @ Wᵀ
  for a single row on one thread, which reads W from memory at ~9 GB/s on the 2-core machine
  of our benchmarks; one bmm over blocks of W lets both threads read.
- 2 rows or more otherwise (`onednn_linear`): oneDNN's kernel, over a copy of W in its blocked
  layout (`blocked`, made by `TextDecoder.pack` for batched steps) or over W as stored. MKL's
  fp32 product for a few rows runs at a third of the matmul ceiling or less here.
- Any rows, where the C++ extension is built (`packed_linear`, xattn.model.net.fused): our own
  kernel over a copy of W in column blocks (`packed`), which reads W once for up to 8 rows
  at about memory speed (a beam's 5 rows of tiny.en's projection: ~2.0 ms against ~2.2 with
  oneDNN's kernel and ~3.2 with MKL's, in a loop; 2.3 against 3.4 in a real beam step).

Each returns None where it does not apply, and the caller takes the plain product.

Which of them pays depends on the CPU, not on the model: on the AMD EPYC hosts of our runs MKL
reads a single row's weight on one thread and the split products win by ~1.4x; on the Intel
Xeon (AMX) ones MKL's own product for 1 to 8 rows is the fastest by up to 2x. So the layer maps
take what `choose_kernels` measures on the machine at hand (`StepKernels`, once per model).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xattn.model.net import fused
from xattn.model.net.fused import SPLIT, SPLIT_ROWS


def column_major(rows: int, cols: int) -> nn.Parameter:
    """An uninitialised [rows, cols] weight stored column-major: a step's x @ Wᵀ then streams
    W's rows contiguously on a CPU. load_state_dict copies into it and .to() keeps the layout."""
    return nn.Parameter(torch.empty(cols, rows).t())


def blocked(w: Tensor) -> Tensor | None:
    """w [out, in] in oneDNN's blocked layout for a few rows (8: its best from 2 to 16), or
    None where there is no such kernel (CUDA, other dtypes, a torch without oneDNN)."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or not _has_onednn():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), 8)


def onednn_linear(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """x @ Wᵀ + b for 2 rows or more x [..., in] through oneDNN's fp32 kernel, W [out, in] being
    a `blocked` copy or a CPU weight as stored. MKL's product for so few rows runs at a third
    of the matmul ceiling or less on our 2-core benchmark machine, oneDNN's at up to twice its
    speed (the projection of tiny.en for 29 rows: ~34 ms with MKL, ~17 over the column-major
    weight, ~15 blocked; its 24 layer maps for 8 rows: 5.9 vs 4.1 ms blocked). The sums are
    the plain product's up to rounding. None: one row, not fp32 on a CPU, no oneDNN, or a
    tensor that autograd would need to go through."""
    if weight is None or not x.is_cpu or x.dtype != torch.float32 or x.numel() < 2 * x.shape[-1]:
        return None
    if not weight.is_cpu or weight.dtype != torch.float32 or not _has_onednn():
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None  # oneDNN's op has no derivative
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@cache
def _has_onednn() -> bool:
    """Whether this torch has oneDNN's linear kernels: once per process (it is asked on every
    batched product)."""
    ops = torch.ops.mkldnn
    has = all(hasattr(ops, op) for op in ("_reorder_linear_weight", "_linear_pointwise"))
    return torch.backends.mkldnn.is_available() and has


def split_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """x @ Wᵀ + b for 1 to SPLIT_ROWS rows x [..., in] on a CPU, as one bmm over SPLIT row
    blocks of W [out, in] (row-major): MKL's product for one row runs on one thread and reads W
    at ~9 GB/s, where bmm spreads the blocks over the threads (a tiny.en step's 24 layer maps,
    2 threads: one row ~2.9 vs ~4.1 ms; two rows 3.9 vs 5.6 with oneDNN's packed kernel).
    None: more rows, not fp32 on a CPU, or W does not split evenly."""
    out, n_in = weight.shape
    rows = x.numel() // n_in
    if not 0 < rows <= SPLIT_ROWS or not x.is_cpu or x.dtype != weight.dtype or out % SPLIT:
        return None
    if not weight.is_contiguous():
        return None
    w = weight.view(SPLIT, out // SPLIT, n_in)  # [S, out/S, in]
    # x's rows as the columns of every block, strides (0, 1, in): MKL reads them as transposed
    # rows (for one row, strides (0, 1, 1) take a path 2x slower)
    cols = x.contiguous().as_strided((SPLIT, n_in, rows), (0, 1, n_in))  # [S, in, R]
    if bias is None:
        y = torch.bmm(w, cols)  # [S, out/S, R]
    else:
        y = torch.baddbmm(bias.view(SPLIT, out // SPLIT, 1), w, cols)  # [S, out/S, R]
    if rows == 1:
        return y.view(*x.shape[:-1], out)  # [..., out]
    return y.view(out, rows).T.reshape(*x.shape[:-1], out)  # [..., out]


def split_columns(x: Tensor, wt: Tensor) -> Tensor | None:
    """x @ wt for a single row x [..., k] on a CPU and wt [k, N] whose rows are contiguous (a
    column-major weight's transpose), as one bmm over wt's two column halves (the last column
    apart when N is odd). The plain product reads wt on one thread (tiny.en's projection, 2
    threads: ~3.9 vs ~5.2 ms); the sums are the same up to rounding (bitwise for some widths,
    tiny.en's among them). None: not a single fp32 CPU row."""
    k, n = wt.shape
    if x.numel() != k or not x.is_cpu or x.dtype != wt.dtype or wt.stride(1) != 1:
        return None
    row, half = x.reshape(1, k), n // 2
    halves = wt.as_strided((2, k, half), (half, wt.stride(0), 1))  # [2, k, N/2]
    y = torch.bmm(row.expand(2, 1, k), halves).view(1, 2 * half)  # [1, 2·(N/2)]
    if n % 2:
        y = torch.cat([y, row @ wt[:, 2 * half :]], dim=1)  # [1, N]
    return y.view(*x.shape[:-1], n)  # [..., N]


def packed(w: Tensor) -> Tensor | None:
    """w [out, in] in the column blocks `packed_linear` reads, or None where it does not apply
    (the extension not built, not fp32 on a CPU)."""
    ext = _extension()
    if ext is None or w.device.type != "cpu" or w.dtype != torch.float32:
        return None
    return ext.pack(w.detach())


def packed_linear(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, n_out: int
) -> Tensor | None:
    """x @ Wᵀ + b for rows x [..., in] over the `packed` copy of W [n_out, in]: the plain
    product's sums up to rounding, each over `in` in order. None: no packed copy, not fp32 on a
    CPU, or autograd."""
    if weight is None or not x.is_cpu or x.dtype != torch.float32 or torch.is_grad_enabled():
        return None
    ext = _extension()
    return None if ext is None else ext.packed_linear(x, weight, bias, n_out)


def _extension():  # noqa: ANN202 - the built module, or None (xattn.model.net.fused)
    return fused.extension()  # looked up each call: tests replace it


def step_copies(maps: Sequence[Linear], projection: Tensor) -> tuple[Tensor | None, ...]:
    """Copies of the weights a step of 2 rows or more reads, in the layouts of the kernels its
    maps' `kernels` name for such rows (`blocked` for oneDNN's, `packed` for ours), set on the
    maps; and the projection's for `logits`, (blocked, packed): packed where the maps take
    the packed kernel for some rows (then it wins for the projection's too), else blocked."""
    kinds = {maps[0].kernels.few, maps[0].kernels.many}
    for m in maps:
        m.blocked = blocked(m.weight) if "onednn" in kinds else None
        m.packed = packed(m.weight) if "packed" in kinds else None
    ours = packed(projection) if "packed" in kinds else None
    return (blocked(projection) if ours is None else None), ours


def logits(x: Tensor, w: Tensor, blocked_w: Tensor | None, packed_w: Tensor | None) -> Tensor:
    """x @ wᵀ for the output projection w [n_vocab, d] (column-major): one row through
    `split_columns`; more through the packed kernel over `packed_w`, else oneDNN's (over
    `blocked_w`, else w as stored); the plain product where none applies."""
    y = None
    if x.numel() > x.shape[-1]:
        y = packed_linear(x, packed_w, None, w.shape[0])
    if y is None:
        y = onednn_linear(x, w if blocked_w is None else blocked_w, None)
    if y is None:
        y = split_columns(x, w.T)
    return x @ w.T if y is None else y  # [..., n_vocab]


log = logging.getLogger(__name__)

# split_linear, onednn_linear, F.linear, packed_linear
KERNELS = ("split", "onednn", "plain", "packed")


@dataclass(frozen=True)
class StepKernels:
    """The product a decoder layer map takes for the rows of a step: `one` row, a `few` (2 to
    SPLIT_ROWS: a greedy batch, a small beam) or `many`; each one of KERNELS. A kernel that
    does not apply (onednn or packed without its copy, anything but fp32 on a CPU) falls
    through to the plain product. The default is what the AMD hosts of our earlier runs
    measured best, before the packed kernel."""

    one: str = "split"
    few: str = "split"
    many: str = "onednn"

    def __post_init__(self) -> None:
        if {self.one, self.few, self.many} - set(KERNELS):
            raise ValueError(f"kernels are among {KERNELS}: {self}")

    def for_rows(self, rows: int) -> str:
        return self.one if rows == 1 else self.few if rows <= SPLIT_ROWS else self.many


BANDS = {"one": 1, "few": 3, "many": 8}  # the rows each band is measured with


def choose_kernels(maps: Sequence[Linear], repeats: int = 5) -> StepKernels:
    """The fastest kernel of each band for these maps (a decoder's, in the order a step runs
    them), timed here: passes over all the maps with random rows, the candidates interleaved,
    median of `repeats` (~0.1 s for tiny.en on 2 cores). The sums of every kernel are the plain
    product's up to rounding, so the choice moves no result beyond that."""
    with torch.inference_mode():
        return _choose(maps, repeats)


def _choose(maps: Sequence[Linear], repeats: int) -> StepKernels:
    g = torch.Generator().manual_seed(0)
    onednn = [blocked(m.weight) for m in maps]
    ours = [packed(m.weight) for m in maps]
    chosen = {}
    for band, rows in BANDS.items():
        xs = [torch.randn(rows, 1, m.in_features, generator=g) for m in maps]
        kernels = {
            "plain": [
                partial(F.linear, x, m.weight, m.bias) for x, m in zip(xs, maps, strict=True)
            ],
            "split": [
                partial(split_linear, x, m.weight, m.bias) for x, m in zip(xs, maps, strict=True)
            ],
            "onednn": [
                partial(onednn_linear, x, b, m.bias)
                for x, m, b in zip(xs, maps, onednn, strict=True)
            ],
            "packed": [
                partial(packed_linear, x, p, m.bias, m.out_features)
                for x, m, p in zip(xs, maps, ours, strict=True)
            ],
        }
        passes = {
            name: partial(_each, calls)
            for name, calls in kernels.items()
            if all(call() is not None for call in calls)  # applies to every map
        }
        times = _interleaved(passes, repeats)
        chosen[band] = min(times, key=times.get)
        log.debug(
            "step kernels, %d rows: %s", rows, {k: f"{v * 1e3:.2f} ms" for k, v in times.items()}
        )
    return StepKernels(**chosen)


def _each(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        call()


def _interleaved(passes: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each pass, after one warm-up round, the passes run in turn."""
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    for round_ in range(repeats + 1):
        for name, run in passes.items():
            t0 = time.perf_counter()
            run()
            if round_:
                seconds[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in seconds.items()}


class Linear(nn.Linear):
    """nn.Linear that takes, for the rows of each call, the product of its `kernels`
    (`split_linear`; `onednn_linear` over the copy `blocked` of TextDecoder.pack;
    `packed_linear` over its copy `packed`; or the plain one)."""

    blocked: Tensor | None = None
    packed: Tensor | None = None
    kernels = StepKernels()

    def forward(self, x: Tensor) -> Tensor:
        kernel = self.kernels.for_rows(x.numel() // self.in_features)
        y = None
        if kernel == "split":
            y = split_linear(x, self.weight, self.bias)
        elif kernel == "onednn":
            y = onednn_linear(x, self.blocked, self.bias)
        elif kernel == "packed":
            y = packed_linear(x, self.packed, self.bias, self.out_features)
        return super().forward(x) if y is None else y
