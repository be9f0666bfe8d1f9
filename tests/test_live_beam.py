"""A live step decodes its window as openai-whisper's `decode` does the same log-mel: greedy,
or beam search with LiveOptions.beam_size (the same weights, fp32, token-identical). The clip
is one where the two differ (tiny.en: greedy reads "Gudenberg", beam 5 "Gutenberg")."""

from __future__ import annotations

import functools

import pytest
import torch
import whisper
from conftest import SHARED_AUDIO
from openai_ref import pipeline, reference_model

from xattn.model.audio.features import decode_audio
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions, LiveResult
from xattn.model.live.window import window_mel

CLIP = SHARED_AUDIO.parent / "eval" / "audio" / "coqui_LJ001-0007.wav"  # 9.8 s, LJSpeech


@functools.cache
def reference(beams: int) -> tuple[int, ...]:
    """openai-whisper's tokens for CLIP's window, `beams` beams (1: greedy)."""
    mel, _ = window_mel(decode_audio(str(CLIP)), pipeline("tiny.en").dims.n_mels)  # [1, M, 3000]
    options = whisper.DecodingOptions(
        language="en", without_timestamps=True, beam_size=beams if beams > 1 else None, fp16=False
    )
    with torch.inference_mode():
        return tuple(whisper.decode(reference_model("tiny.en"), mel[0], options).tokens)


@pytest.mark.parametrize("beams", [1, 5], ids=["greedy", "beam5"])
def test_a_live_step_is_openai_whisper_decode_of_its_window(beams: int) -> None:
    if not CLIP.is_file():
        pytest.skip(f"shared eval audio missing: {CLIP}")
    assert reference(1) != reference(5)  # the clip tells the searches apart
    audio = decode_audio(str(CLIP))
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, LiveOptions(beam_size=beams))
    results = [r for r in live.feed(audio) if isinstance(r, LiveResult)]  # one step
    assert live.stats.steps == 1
    ours = tuple(t.id for r in results for t in r.tokens)  # its finals and the interim rest
    assert ours == reference(beams)
