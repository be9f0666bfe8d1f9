"""Word timestamps against openai-whisper's `word_timestamps=True` on the same weights."""

from __future__ import annotations

import pytest
from openai_ref import pipeline, reference_transcribe

from xattn.model.audio.features import decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import Segment, TokenEvent

CASES = [("tiny.en", "jfk.flac"), ("base", "jfk.flac"), ("base", "multilingual.mp3")]


@pytest.mark.parametrize(("name", "clip"), CASES)
def test_words_match_openai(name: str, clip: str, shared_audio_dir) -> None:
    path = str(shared_audio_dir / clip)
    ref = reference_transcribe(name, path, True)
    events = list(
        pipeline(name).transcribe(decode_audio(path), DecodeOptions(word_timestamps=True))
    )
    ours = [e for e in events if isinstance(e, Segment)]
    assert [list(s.tokens) for s in ours] == [s["tokens"] for s in ref["segments"]]
    ref_words = [w for s in ref["segments"] for w in s["words"]]
    our_words = [w for s in ours for w in s.words]
    assert [w.word for w in our_words] == [w["word"] for w in ref_words]
    for ours_w, ref_w in zip(our_words, ref_words, strict=True):
        assert abs(ours_w.start - ref_w["start"]) <= 0.02, (ours_w, ref_w)
        assert abs(ours_w.end - ref_w["end"]) <= 0.02, (ours_w, ref_w)
        assert abs(ours_w.probability - ref_w["probability"]) < 1e-3
    for s, r in zip(ours, ref["segments"], strict=True):
        assert abs(s.start - r["start"]) <= 0.02 and abs(s.end - r["end"]) <= 0.02
    if (name, clip) == ("tiny.en", "jfk.flac"):
        assert len(our_words) == 22
        americans = next(w for w in our_words if w.word == " Americans")
        assert 1.7 <= americans.start <= 1.9


def test_token_timings_follow_the_words(jfk_path) -> None:
    events = list(
        pipeline("tiny.en").transcribe(decode_audio(jfk_path), DecodeOptions(word_timestamps=True))
    )
    segments = [e for e in events if isinstance(e, Segment)]
    timings = [t for s in segments for t in s.token_timings]
    text_ids = [t for s in segments for t in s.tokens if t < pipeline("tiny.en").tokenizer.eot]
    assert [t.id for t in timings] == text_ids
    starts = [t.start for t in timings]
    assert starts == sorted(starts) and all(t.end >= t.start for t in timings)
    assert all(round(t.start, 2) == t.start for t in timings)


def test_word_timestamps_are_off_by_default(jfk_path) -> None:
    events = list(pipeline("tiny.en").transcribe(decode_audio(jfk_path)))
    assert all(not e.words for e in events if isinstance(e, Segment))
    assert all(e.attention is None for e in events if isinstance(e, TokenEvent))


def test_online_timestamps_need_no_extra_pass(jfk_path) -> None:
    """The live estimate (attention peak) sits near the DTW word times, without a second pass."""
    options = DecodeOptions(word_timestamps=True, online_timestamps=True)
    events = list(pipeline("tiny.en").transcribe(decode_audio(jfk_path), options))
    tokens = [e for e in events if isinstance(e, TokenEvent) and e.text.strip()]
    assert all(e.online_time is not None and e.attention is None for e in tokens)
    words = [w for e in events if isinstance(e, Segment) for w in e.words]
    word_of = [w for w in words for _ in w.tokens]  # the word of each text token, in order
    assert [t for w in words for t in w.tokens] == [e.id for e in tokens]
    near = [
        w.start - 0.5 <= e.online_time <= w.end + 0.5 for e, w in zip(tokens, word_of, strict=True)
    ]
    assert sum(near) >= 0.8 * len(near), near
