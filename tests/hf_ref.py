"""Hugging Face Whisper directories built from weights we have, for differential tests.

`save_hf` writes what `WhisperForConditionalGeneration.save_pretrained` writes for a real
checkpoint (config.json, safetensors — one file or shards with their index — and
generation_config.json with alignment heads, suppress lists and language ids), plus the
tokenizer.json. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

from xattn.model.checkpoints import Checkpoint, to_hf_state_dict
from xattn.model.decode.tokenizer import Tokenizer


def hf_model(ckpt: Checkpoint, tokenizer: Tokenizer, suppress: tuple[int, ...]):
    """transformers' model holding the checkpoint's weights (fp32), with its generation config."""
    d = ckpt.dims
    eot, s = tokenizer.eot, tokenizer.specials
    config = WhisperConfig(
        vocab_size=d.n_vocab,
        num_mel_bins=d.n_mels,
        d_model=d.n_audio_state,
        encoder_layers=d.n_audio_layer,
        encoder_attention_heads=d.n_audio_head,
        encoder_ffn_dim=4 * d.n_audio_state,
        decoder_layers=d.n_text_layer,
        decoder_attention_heads=d.n_text_head,
        decoder_ffn_dim=4 * d.n_text_state,
        max_source_positions=d.n_audio_ctx,
        max_target_positions=d.n_text_ctx,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=tokenizer.sot,
    )
    model = WhisperForConditionalGeneration(config)
    state = to_hf_state_dict(ckpt.state_dict)
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    model.load_state_dict(state)
    # an English-only checkpoint's generation config has no language fields at all (with an
    # empty lang_to_id, transformers would detect a language anyway)
    languages = {
        "is_multilingual": True,
        "lang_to_id": {
            f"<|{c}|>": i for c, i in zip(s.language_codes, s.language_ids, strict=True)
        },
        "task_to_id": {"transcribe": s.transcribe, "translate": s.translate},
    }
    model.generation_config = GenerationConfig(
        decoder_start_token_id=tokenizer.sot,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        max_length=d.n_text_ctx,
        no_timestamps_token_id=tokenizer.no_timestamps,
        prev_sot_token_id=tokenizer.sot_prev,
        alignment_heads=[list(h) for h in ckpt.alignment_heads],
        suppress_tokens=list(suppress),
        begin_suppress_tokens=[*tokenizer.encode(" "), eot],
        **(languages if d.is_multilingual else {}),
    )
    return model.eval()


def save_hf(
    ckpt: Checkpoint,
    tokenizer: Tokenizer,
    suppress: tuple[int, ...],
    directory: Path,
    *,
    max_shard_size: str | None = None,
    dtype: torch.dtype = torch.float32,
    with_heads: bool = True,
) -> Path:
    """Write the checkpoint as a Hugging Face directory; sharded when max_shard_size is given."""
    model = hf_model(ckpt, tokenizer, suppress).to(dtype)
    if not with_heads:
        model.generation_config.alignment_heads = None
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)
    shutil.copy(tokenizer.path, directory / "tokenizer.json")
    return directory
