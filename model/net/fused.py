"""The cached decoder step in C++ (model/net/csrc/decoder_step.cpp), built once per machine.

A decoder step of one row is bound by its weights' memory traffic, yet about a third of its
layers' time on a CPU went to Python: about 100 torch calls a step, each through the module and
dispatch layers (tiny.en, 2 cores: 2.29 ms for the layers in Python, 1.58 in C++). The
extension runs the same ATen ops in the same order, so its numbers are bitwise the Python
step's (the tests hold it to that), and TextDecoder takes it wherever it applies: one new
token a row of a KVCache (one decode and its rows: a greedy decode, a beam search) or of a
CacheBatch (several decodes stepped together: batched long-form windows, the server's
requests), fp32 on a CPU, inference, the layer maps on the plain, the split or the packed
product (`StepKernels`; oneDNN's kernel is not ported). Anything else runs the Python step.

It is built by `make install` (`python -m xattn.model.net.fused`, ~20 s) with torch's
cpp_extension (a C++ compiler and ninja) into XATTN_EXTENSIONS (default
~/.cache/xattn/extensions); a process loads the build it finds there. Without a build (no
compiler, a fresh image) the Python step runs, with the same results (up to float rounding
where the packed product would have run). XATTN_FUSED=0 turns it off.

It also holds the packed product (`packed_linear`, xattn.model.net.linear: our own kernel for a
few rows, which reads a weight once for all of them), which the layer maps and the projection
take where `choose_kernels` measured it best.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from functools import cache
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

from xattn.model.net.kv_cache import CacheBatch, KVCache

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "decoder_step.cpp"
NAME = "xattn_decoder_step"
# OpenMP: packed_linear's at::parallel_for runs on its threads (compiled and linked with it)
FLAGS, LDFLAGS = ["-O2", "-fopenmp"], ["-fopenmp"]
PRODUCTS = ("plain", "split", "packed")  # the layer maps' products it runs (StepKernels)
# split_linear's blocks (xattn.model.net.linear), which the C++ step's split product shares:
SPLIT = 8  # row blocks of a weight that split_linear reads
SPLIT_ROWS = 4  # up to this many rows split_linear beats oneDNN's packed kernel (2 threads)


def build_directory() -> Path:
    """Where the build lives: one folder per torch version and source (their hash)."""
    root = os.environ.get("XATTN_EXTENSIONS") or Path.home() / ".cache" / "xattn" / "extensions"
    made = SOURCE.read_bytes() + torch.__version__.encode() + " ".join(FLAGS + LDFLAGS).encode()
    tag = hashlib.sha256(made).hexdigest()[:12]
    return Path(root) / f"decoder_step-{tag}"


def build() -> ModuleType:
    """Compile (or reuse) the extension; raises when it cannot be built here."""
    from torch.utils.cpp_extension import load

    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    return load(
        name=NAME,
        sources=[str(SOURCE)],
        build_directory=str(folder),
        extra_cflags=FLAGS,
        extra_ldflags=LDFLAGS,
        verbose=False,
    )


@cache
def extension() -> ModuleType | None:
    """The built extension, or None (turned off, not built, or it would not load): once a
    process. A build that exists is imported as it is (~40 ms, no compiler needed)."""
    if os.environ.get("XATTN_FUSED", "1") == "0":
        return None
    built = build_directory() / f"{NAME}.so"
    try:
        if built.exists():
            spec = importlib.util.spec_from_file_location(NAME, built)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            log.info("decoder step: Python (no build in %s; make install builds it)", built.parent)
            return None
    except Exception as e:  # noqa: BLE001 - any failure means the Python step
        log.warning("decoder step: the C++ extension did not load (%s); Python runs it", e)
        return None
    log.info("decoder step: C++ (%s)", built.parent)
    return module


def step(
    decoder: nn.Module, x: Tensor, cache: KVCache | CacheBatch, need_scores: bool
) -> tuple[Tensor, list[Tensor | None]] | None:
    """The layers of a cached step through the extension: the states x [B, 1, d] after every
    layer and each layer's scores (None without `need_scores`), or None where it does not
    apply (then the Python step runs; it also appends to the caches, which `advance` commits)."""
    if x.shape[1] != 1 or not x.is_cpu or x.dtype != torch.float32:
        return None
    blocks = decoder.blocks
    first = blocks[0].mlp[0]
    kernel = first.kernels.for_rows(x.shape[0])
    if first.weight.dtype != torch.float32 or kernel not in PRODUCTS or torch.is_grad_enabled():
        return None
    ext = extension()
    if ext is None:
        return None
    copies = packed_maps(decoder) if kernel == "packed" else []
    if kernel == "packed" and not copies:
        kernel = "plain"  # as Linear: no packed copies (not packed yet), the plain product
    caches = cache.caches if isinstance(cache, CacheBatch) else [cache]
    out = ext.decoder_step(
        x,
        weights(decoder),
        [c.self_k for c in caches],
        [c.self_v for c in caches],
        [c.length for c in caches],
        [c.cross.k[layer] for layer in range(len(blocks)) for c in caches],
        [c.cross.v[layer] for layer in range(len(blocks)) for c in caches],
        blocks[0].attn.n_head,
        need_scores,
        PRODUCTS.index(kernel),
        SPLIT,
        SPLIT_ROWS,
        copies,
    )
    return out[0], (out[1:] if need_scores else [None] * len(blocks))


def packed_maps(decoder: nn.Module) -> list[Tensor]:
    """Every layer's six maps' packed copies in the extension's order (qkv, attention out,
    query, cross out, fc1, fc2), or [] where they are not all made (TextDecoder.pack)."""
    maps = getattr(decoder, "_fused_maps", None)
    if maps is None:  # kept: nn.Module's attribute lookups cost ~70 µs a step
        maps = decoder._fused_maps = [
            m
            for b in decoder.blocks
            for m in (b.attn.qkv, b.attn.out, b.cross_attn.query, b.cross_attn.out, *b.mlp[::2])
        ]
    copies = [m.packed for m in maps]
    return [] if any(c is None for c in copies) else copies


def weights(decoder: nn.Module) -> list[Tensor]:
    """Every layer's 18 weights in the extension's order (kept on the decoder; made again
    when its parameters are other tensors, e.g. after .to())."""
    kept = getattr(decoder, "_fused_weights", None)
    last = decoder.blocks[-1].mlp[2].bias
    if kept is not None and kept[0] is decoder.blocks[0].attn_ln.weight and kept[-1] is last:
        return kept
    kept = []
    for b in decoder.blocks:
        for m in (b.attn_ln, b.attn.qkv, b.attn.out, b.cross_attn_ln, b.cross_attn.query):
            kept += [m.weight, m.bias]
        for m in (b.cross_attn.out, b.mlp_ln, b.mlp[0], b.mlp[2]):
            kept += [m.weight, m.bias]
    decoder._fused_weights = kept
    return kept


def main() -> None:
    """`python -m xattn.model.net.fused`: build the extension (make install runs it)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if shutil.which("ninja") is None or shutil.which("c++") is None:
        log.warning(
            "no ninja or c++: the decoder step stays in Python (apt-get install ninja-build g++)"
        )
        return
    try:
        build()
    except Exception as e:  # noqa: BLE001
        log.warning("the C++ decoder step was not built (%s); the Python step runs", e)
        return
    log.info("built the C++ decoder step in %s", build_directory())


if __name__ == "__main__":
    main()
