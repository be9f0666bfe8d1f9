"""openai-whisper running the *same* weights as ours, for differential tests.

Our checkpoint's state dict is converted to openai-whisper's names (xattn.model.checkpoints),
loaded into `whisper.model.Whisper`, and the alignment heads set from the checkpoint's config
(whisper.load_model(path) would not).
"""

from __future__ import annotations

import functools

import torch
import whisper
from whisper.model import ModelDimensions

from xattn.model.checkpoints import load_checkpoint, to_openai_state_dict


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
    from xattn.model.pipeline import load_pipeline

    return load_pipeline(name)


@functools.cache
def reference_transcribe(name: str, clip: str, word_timestamps: bool) -> dict:
    """openai-whisper's transcribe() at its defaults, fp32, on our decoded audio."""
    from xattn.model.audio.features import decode_audio

    return whisper.transcribe(
        reference_model(name), decode_audio(clip), fp16=False, word_timestamps=word_timestamps
    )
