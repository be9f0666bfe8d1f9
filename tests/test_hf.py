"""Hugging Face Whisper directories, differential against transformers (its Whisper model).

The directories are built here from the bundled tiny.en and base weights (tests/hf_ref.py):
once as one model.safetensors and once sharded with its index; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hf_ref import hf_model, save_hf
from tests.openai_ref import pipeline
from xattn.model.audio.features import (
    N_FRAMES,
    N_SAMPLES,
    decode_audio,
    log_mel_spectrogram,
    pad_or_trim,
)
from xattn.model.checkpoints import (
    HEADS_DEFAULT_RULE,
    HEADS_FROM_CHECKPOINT,
    default_alignment_heads,
    load_checkpoint,
)
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import Segment
from xattn.model.pipeline import Pipeline, load_pipeline

GREEDY = DecodeOptions(language="en", temperatures=(0.0,), without_timestamps=True)


class Built:
    def __init__(self, name: str, root: Path) -> None:
        self.ours = pipeline(name)
        self.ckpt = load_checkpoint(name)
        tok, suppress = self.ours.tokenizer, self.ours.context.suppress
        self.ref = hf_model(self.ckpt, tok, suppress)
        self.single = save_hf(self.ckpt, tok, suppress, root / f"{name}-single")
        self.sharded = save_hf(
            self.ckpt, tok, suppress, root / f"{name}-sharded", max_shard_size="40MB"
        )


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def built(request, tmp_path_factory) -> Built:
    return Built(request.param, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def jfk_audio(jfk_path):
    return decode_audio(jfk_path)


def window_mel(audio, n_mels: int) -> torch.Tensor:
    """The first window's log-mel exactly as transcribe.sequential gives it to the model."""
    mel = log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)  # [n_mels, content + 3000]
    return pad_or_trim(mel[:, : mel.shape[-1] - N_FRAMES], N_FRAMES)[None]  # [1, n_mels, 3000]


def tokens(pipe: Pipeline, audio) -> list[int]:
    return [t for e in pipe.transcribe(audio, GREEDY) if isinstance(e, Segment) for t in e.tokens]


def test_sharded_directory_is_sharded(built: Built) -> None:
    assert (built.sharded / "model.safetensors.index.json").is_file()
    assert len(list(built.sharded.glob("model-*-of-*.safetensors"))) > 1
    assert (built.single / "model.safetensors").is_file()


@pytest.mark.parametrize("form", ["single", "sharded"])
def test_loads_the_same_model(built: Built, form: str) -> None:
    ckpt = load_checkpoint(getattr(built, form))
    assert ckpt.format == "huggingface" and ckpt.dtype == "float32"
    assert ckpt.dims == built.ckpt.dims
    assert ckpt.alignment_heads == built.ckpt.alignment_heads
    assert ckpt.alignment_heads_source == HEADS_FROM_CHECKPOINT
    assert set(ckpt.state_dict) == set(built.ckpt.state_dict)
    for key, value in built.ckpt.state_dict.items():
        assert torch.equal(ckpt.state_dict[key], value), key


def test_logits_match_transformers(built: Built, jfk_audio) -> None:
    pipe = load_pipeline(built.sharded)
    mel = window_mel(jfk_audio, pipe.dims.n_mels)  # [1, n_mels, 3000]
    sot = pipe.tokenizer.sot_sequence("en")
    text = pipe.tokenizer.encode(" And so my fellow Americans, ask not what your country can do")
    ids = torch.tensor([[*sot, *text]])  # [1, T]
    with torch.inference_mode():
        ours, _ = pipe.model.decoder(ids, pipe.model.new_cache(pipe.model.encoder(mel)))
        theirs = built.ref(input_features=mel, decoder_input_ids=ids).logits  # [1, T, n_vocab]
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < 1e-3


def test_greedy_matches_transformers_generate(built: Built, jfk_audio) -> None:
    pipe = load_pipeline(built.single)
    mel = window_mel(jfk_audio, pipe.dims.n_mels)
    kwargs = {"language": "en", "task": "transcribe"} if pipe.is_multilingual else {}
    with torch.inference_mode():
        generated = built.ref.generate(input_features=mel, return_timestamps=False, **kwargs)
    theirs = [t for t in generated[0].tolist() if t < pipe.tokenizer.eot]
    ours = tokens(pipe, jfk_audio)
    assert ours == theirs == tokens(built.ours, jfk_audio)
    assert "ask not what your country can do for you" in pipe.tokenizer.decode(ours)


def test_half_precision_and_no_heads(tmp_path, jfk_audio) -> None:
    """fp16 weights are widened once at load; without alignment heads, openai-whisper's rule."""
    ours, ckpt = pipeline("tiny.en"), load_checkpoint("tiny.en")
    d = save_hf(
        ckpt,
        ours.tokenizer,
        ours.context.suppress,
        tmp_path / "fp16",
        dtype=torch.float16,
        with_heads=False,
    )
    loaded = load_checkpoint(d)
    assert loaded.dtype == "float16"
    assert loaded.alignment_heads == default_alignment_heads(ckpt.dims)
    assert loaded.alignment_heads_source == HEADS_DEFAULT_RULE
    for key, value in ckpt.state_dict.items():
        assert loaded.state_dict[key].dtype == torch.float32
        assert torch.equal(loaded.state_dict[key], value.half().float()), key
    pipe = load_pipeline(d)
    assert pipe.alignment_heads_source == HEADS_DEFAULT_RULE
    assert "ask not what your country" in pipe.tokenizer.decode(tokens(pipe, jfk_audio))
