"""CTranslate2 Whisper directories (model.bin version 6, config.json, tokenizer.json); the
model.bin may be split over several files, read as one stream."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from xattn.model.checkpoints.base import (
    HEADS_DEFAULT_RULE,
    HEADS_FROM_CHECKPOINT,
    Checkpoint,
    CheckpointError,
    default_alignment_heads,
)
from xattn.model.net.dims import ModelDims

CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class _Chain:
    """Sequential reads across several files, as if they were one."""

    def __init__(self, paths: list[Path]) -> None:
        self.files: list[BinaryIO] = [p.open("rb") for p in paths]

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n and self.files:
            chunk = self.files[0].read(n - len(out))
            if not chunk:
                self.files.pop(0).close()
                continue
            out += chunk
        if len(out) < n:
            raise CheckpointError("model.bin ends before its last variable")
        return bytes(out)

    def close(self) -> None:
        for f in self.files:
            f.close()


def read_ct2_variables(paths: list[Path]) -> Iterator[tuple[str, np.ndarray]]:
    """Variables of a CTranslate2 model.bin (version 6), split over `paths` in order."""
    f = _Chain(paths)
    try:
        (version,) = struct.unpack("<I", f.read(4))
        if version != 6:
            raise CheckpointError(f"model.bin version {version} is not supported (expected 6)")

        def string() -> str:
            (n,) = struct.unpack("<H", f.read(2))
            return f.read(n).rstrip(b"\0").decode()

        spec, (_revision, count) = string(), struct.unpack("<II", f.read(8))
        if spec != "WhisperSpec":
            raise CheckpointError(f"model.bin holds a {spec!r}, not a Whisper model")
        for _ in range(count):
            name = string()
            (rank,) = struct.unpack("<B", f.read(1))
            shape = struct.unpack(f"<{rank}I", f.read(4 * rank))
            dtype_id, nbytes = struct.unpack("<BI", f.read(5))
            if dtype_id == 5:  # bfloat16: numpy has none; widen the bits into float32
                raw = np.frombuffer(f.read(nbytes), dtype=np.uint16).astype(np.uint32) << 16
                yield name, raw.view(np.float32).reshape(shape)
                continue
            if dtype_id not in CT2_DTYPES:
                raise CheckpointError(f"variable {name} has unknown dtype {dtype_id}")
            yield name, np.frombuffer(f.read(nbytes), dtype=CT2_DTYPES[dtype_id]).reshape(shape)
    finally:
        f.close()


def _ct2_name(name: str) -> str | None:
    """CTranslate2 variable name → net.whisper parameter name (None: not a parameter)."""
    part = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}
    p = name.split("/")
    side = p[0]
    if p[1] in ("conv1", "conv2"):
        return f"encoder.{p[1]}.{p[2]}"
    if p[1] == "position_encodings":
        return f"{side}.positional_embedding"
    if p[1] == "embeddings":
        return "decoder.token_embedding.weight"
    if p[1] == "layer_norm":
        return f"encoder.ln_post.{part[p[2]]}" if side == "encoder" else f"decoder.ln.{part[p[2]]}"
    if not p[1].startswith("layer_"):
        return None
    block = f"{side}.blocks.{p[1][6:]}"
    sub, leaf = p[2], part[p[-1]]
    if p[3] == "layer_norm":
        ln = {"self_attention": "attn_ln", "attention": "cross_attn_ln", "ffn": "mlp_ln"}[sub]
        return f"{block}.{ln}.{leaf}"
    linear = {
        ("self_attention", "linear_0"): "attn.qkv",
        ("self_attention", "linear_1"): "attn.out",
        ("attention", "linear_0"): "cross_attn.query",
        ("attention", "linear_1"): "cross_attn.kv",
        ("attention", "linear_2"): "cross_attn.out",
        ("ffn", "linear_0"): "mlp.0",
        ("ffn", "linear_1"): "mlp.2",
    }[(sub, p[3])]
    return f"{block}.{linear}.{leaf}"


def load_ct2(directory: Path, name: str, bin_parts: list[Path] | None = None) -> Checkpoint:
    parts = bin_parts or [directory / "model.bin"]
    for p in (*parts, directory / "config.json", directory / "tokenizer.json"):
        if not p.is_file():
            raise CheckpointError(f"{p} is missing: not a CTranslate2 Whisper directory")
    config = json.loads((directory / "config.json").read_text())
    state: dict[str, torch.Tensor] = {}
    heads: dict[str, int] = {}
    dtype = "float32"
    for var, array in read_ct2_variables(parts):
        if var.endswith("/num_heads"):
            heads[var.split("/")[0]] = int(array)
        if var.endswith("_scale") or array.dtype == np.int8 and array.ndim == 2:
            raise CheckpointError(f"{directory}: quantized (int8) weights are not supported")
        key = _ct2_name(var)
        if key is not None:
            dtype = str(array.dtype) if array.ndim == 2 else dtype
            state[key] = torch.from_numpy(array.astype(np.float32))
    n_layer = {
        side: 1 + max(int(k.split(".")[2]) for k in state if k.startswith(f"{side}.blocks."))
        for side in ("encoder", "decoder")
    }
    conv1 = state["encoder.conv1.weight"]  # [d, n_mels, 3]
    embed = state["decoder.token_embedding.weight"]  # [n_vocab, d]
    dims = ModelDims(
        n_mels=conv1.shape[1],
        n_audio_ctx=state["encoder.positional_embedding"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=heads["encoder"],
        n_audio_layer=n_layer["encoder"],
        n_vocab=embed.shape[0],
        n_text_ctx=state["decoder.positional_embedding"].shape[0],
        n_text_state=embed.shape[1],
        n_text_head=heads["decoder"],
        n_text_layer=n_layer["decoder"],
    )
    align = tuple((int(a), int(b)) for a, b in config.get("alignment_heads") or ())
    return Checkpoint(
        name=name,
        dims=dims,
        state_dict=state,
        alignment_heads=align or default_alignment_heads(dims),
        alignment_heads_source=HEADS_FROM_CHECKPOINT if align else HEADS_DEFAULT_RULE,
        suppress_tokens=tuple(config.get("suppress_ids", ())) or None,
        suppress_blank=tuple(config.get("suppress_ids_begin", ())) or None,
        tokenizer_file=directory / "tokenizer.json",
        dtype=dtype,
    )
