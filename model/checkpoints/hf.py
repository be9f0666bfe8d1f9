"""Hugging Face Whisper directories (`WhisperForConditionalGeneration.save_pretrained`).

- weights: `model.safetensors`, or shards listed by `model.safetensors.index.json`, read
  memory-mapped with `safetensors`; fp16/bf16 are widened to float32 once, here;
- dims: `config.json`; alignment heads and suppress lists: `generation_config.json` (without
  heads: openai-whisper's rule, and the Checkpoint says so);
- tokenizer: the directory's own `tokenizer.json`.

`HF_NAMES` is the one table from Hugging Face names to ours; Q/K/V (and the cross-attention's
K/V) are fused at load by `FUSED`. `to_hf_state_dict` runs the same tables backwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from xattn.model.checkpoints.base import (
    HEADS_DEFAULT_RULE,
    HEADS_FROM_CHECKPOINT,
    Checkpoint,
    CheckpointError,
    default_alignment_heads,
)
from xattn.model.net.dims import ModelDims

# outside the layers: Hugging Face name (after an optional "model.") -> ours
HF_NAMES = {
    "encoder.conv1.weight": "encoder.conv1.weight",
    "encoder.conv1.bias": "encoder.conv1.bias",
    "encoder.conv2.weight": "encoder.conv2.weight",
    "encoder.conv2.bias": "encoder.conv2.bias",
    "encoder.embed_positions.weight": "encoder.positional_embedding",
    "encoder.layer_norm.weight": "encoder.ln_post.weight",
    "encoder.layer_norm.bias": "encoder.ln_post.bias",
    "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
    "decoder.embed_positions.weight": "decoder.positional_embedding",
    "decoder.layer_norm.weight": "decoder.ln.weight",
    "decoder.layer_norm.bias": "decoder.ln.bias",
}
# inside a layer ("{side}.layers.{i}." -> "{side}.blocks.{i}."), for .weight and .bias
HF_LAYER_NAMES = {
    "self_attn_layer_norm": "attn_ln",
    "self_attn.out_proj": "attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.out_proj": "cross_attn.out",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
# fused projections of ours, from Hugging Face's parts in order (k_proj has no bias: zeros)
FUSED = {
    "attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "cross_attn.kv": ("encoder_attn.k_proj", "encoder_attn.v_proj"),
}
NO_BIAS = ("self_attn.k_proj", "encoder_attn.k_proj")
IGNORED = ("proj_out.weight",)  # tied to the token embedding


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()
    )


def read_safetensors(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of a (possibly sharded) safetensors checkpoint, as stored, and their dtype."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        if not (directory / file).is_file():
            raise CheckpointError(f"{directory / file} is missing (named by {index.name})")
        with safe_open(str(directory / file), framework="pt") as f:  # memory-mapped
            for key in f.keys():
                tensors[key.removeprefix("model.")] = f.get_tensor(key)
    if not tensors:
        raise CheckpointError(f"{directory}: the safetensors files hold no tensors")
    dtype = str(tensors["decoder.embed_tokens.weight"].dtype).removeprefix("torch.")
    return tensors, dtype


def from_hf_state_dict(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face names -> ours, float32, with the fused projections built."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}  # our layer prefix -> HF part -> tensor
    for key, value in hf.items():
        if key in IGNORED:
            continue
        if key in HF_NAMES:
            out[HF_NAMES[key]] = value.float()
            continue
        side, layers, i, rest = (key.split(".", 3) + ["", "", ""])[:4]
        if side not in ("encoder", "decoder") or layers != "layers":
            raise CheckpointError(f"unexpected tensor {key!r} in a Whisper checkpoint")
        prefix = f"{side}.blocks.{i}"
        sub, leaf = rest.rsplit(".", 1)
        if sub in HF_LAYER_NAMES:
            out[f"{prefix}.{HF_LAYER_NAMES[sub]}.{leaf}"] = value.float()
        else:
            parts.setdefault(prefix, {})[rest] = value.float()
    for prefix, held in parts.items():
        for ours, names in FUSED.items():
            if f"{names[0]}.weight" not in held:
                continue
            weights = [held.pop(f"{n}.weight") for n in names]  # each [d, d]
            zero = weights[0].new_zeros(weights[0].shape[0])  # [d]
            biases = [zero if n in NO_BIAS else held.pop(f"{n}.bias") for n in names]
            out[f"{prefix}.{ours}.weight"] = torch.cat(weights)  # [len(names) * d, d]
            out[f"{prefix}.{ours}.bias"] = torch.cat(biases)  # [len(names) * d]
        if held:
            raise CheckpointError(f"unexpected tensors in {prefix}: {sorted(held)}")
    return out


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict under Hugging Face's names (`from_hf_state_dict`'s inverse; proj_out is
    tied to the embedding and left out)."""
    back = {v: k for k, v in HF_NAMES.items()}
    layer_back = {v: k for k, v in HF_LAYER_NAMES.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in back:
            out[f"model.{back[key]}"] = value
            continue
        side, _blocks, i, rest = key.split(".", 3)
        prefix = f"model.{side}.layers.{i}"
        sub, leaf = rest.rsplit(".", 1)
        if sub in FUSED:
            for name, chunk in zip(FUSED[sub], value.chunk(len(FUSED[sub])), strict=True):
                if not (leaf == "bias" and name in NO_BIAS):
                    out[f"{prefix}.{name}.{leaf}"] = chunk.contiguous()
        else:
            out[f"{prefix}.{layer_back[sub]}.{leaf}"] = value
    return out


def dims_from_config(config: dict) -> ModelDims:
    try:
        return ModelDims(
            n_mels=config["num_mel_bins"],
            n_audio_ctx=config["max_source_positions"],
            n_audio_state=config["d_model"],
            n_audio_head=config["encoder_attention_heads"],
            n_audio_layer=config["encoder_layers"],
            n_vocab=config["vocab_size"],
            n_text_ctx=config["max_target_positions"],
            n_text_state=config["d_model"],
            n_text_head=config["decoder_attention_heads"],
            n_text_layer=config["decoder_layers"],
        )
    except KeyError as e:
        raise CheckpointError(f"config.json has no {e.args[0]!r}: not a Whisper config") from e


def load_hf(directory: Path, name: str | None = None) -> Checkpoint:
    """A Hugging Face Whisper directory (see the module's docstring)."""
    config = json.loads((directory / "config.json").read_text())
    if config.get("model_type") not in (None, "whisper"):
        raise CheckpointError(f"{directory}: a {config['model_type']!r} model, not Whisper")
    dims = dims_from_config(config)
    gen_file = directory / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise CheckpointError(f"{tokenizer_file} is missing: save the fast tokenizer with it")
    hf, dtype = read_safetensors(directory)
    state = from_hf_state_dict(hf)
    del hf
    heads = tuple((int(a), int(b)) for a, b in gen.get("alignment_heads") or ())
    suppress = gen.get("suppress_tokens", config.get("suppress_tokens"))
    blank = gen.get("begin_suppress_tokens", config.get("begin_suppress_tokens"))
    return Checkpoint(
        name=name or directory.name,
        dims=dims,
        state_dict=state,
        alignment_heads=heads or default_alignment_heads(dims),
        suppress_tokens=tuple(suppress) if suppress else None,
        suppress_blank=tuple(blank) if blank else None,
        tokenizer_file=tokenizer_file,
        dtype=dtype,
        format="huggingface",
        alignment_heads_source=HEADS_FROM_CHECKPOINT if heads else HEADS_DEFAULT_RULE,
    )
