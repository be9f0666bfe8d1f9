"""openai-whisper running the *same* weights as ours, for differential tests.

Our checkpoint's state dict is converted to openai-whisper's names (fused Q/K/V split back),
loaded into `whisper.model.Whisper`, and the alignment heads set from the checkpoint's config
(whisper.load_model(path) would not).
"""

from __future__ import annotations

import functools

import torch
import whisper
from whisper.model import ModelDimensions

from model.checkpoints import Checkpoint, load_checkpoint


def to_openai_state_dict(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
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


@functools.cache
def reference_model(name: str) -> whisper.model.Whisper:
    ckpt = load_checkpoint(name)
    dims = ModelDimensions(**vars(ckpt.dims))
    ref = whisper.model.Whisper(dims)
    ref.load_state_dict(to_openai_state_dict(ckpt))
    mask = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    for layer, head in ckpt.alignment_heads:
        mask[layer, head] = True
    ref.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return ref.eval()


@functools.cache
def pipeline(name: str):
    """Our pipeline, loaded once per test session."""
    from model.pipeline import load_pipeline

    return load_pipeline(name)


@functools.cache
def reference_transcribe(name: str, clip: str, word_timestamps: bool) -> dict:
    """openai-whisper's transcribe() at its defaults, fp32, on our decoded audio."""
    from model.audio import decode_audio

    return whisper.transcribe(
        reference_model(name), decode_audio(clip), fp16=False, word_timestamps=word_timestamps
    )
