"""openai-whisper `.pt` checkpoints (the tokenizer from the bundled packages)."""

from __future__ import annotations

from pathlib import Path

import torch

from xattn.model.checkpoints.base import (
    HEADS_DEFAULT_RULE,
    Checkpoint,
    CheckpointError,
    bundled_tokenizer,
    default_alignment_heads,
)
from xattn.model.net.dims import ModelDims


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
    return Checkpoint(
        name=path.stem,
        dims=dims,
        state_dict=state,
        alignment_heads=default_alignment_heads(dims),
        suppress_tokens=None,
        suppress_blank=None,
        tokenizer_file=bundled_tokenizer(dims.is_multilingual),
        dtype=str(next(iter(raw["model_state_dict"].values())).dtype).removeprefix("torch."),
        format="openai",
        alignment_heads_source=HEADS_DEFAULT_RULE,
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
