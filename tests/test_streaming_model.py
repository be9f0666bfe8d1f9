"""The live policy in-process: feed jfk.flac in 0.5 s chunks, as a microphone would."""

from __future__ import annotations

import difflib
import re

import numpy as np
from openai_ref import pipeline

from model.audio import SAMPLE_RATE, decode_audio
from model.streaming import LiveOptions, LiveTranscriber


def words_of(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def word_distance(a: str, b: str) -> int:
    """Words inserted, deleted or replaced to turn a into b."""
    ops = difflib.SequenceMatcher(a=words_of(a), b=words_of(b)).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def feed(audio: np.ndarray, options: LiveOptions, chunk_s: float = 0.5):
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
    results = []
    step = int(chunk_s * SAMPLE_RATE)
    for i in range(0, len(audio), step):
        results += live.feed(audio[i : i + step])
    results += live.finish()
    return results


def test_live_transcript_close_to_offline(jfk_path) -> None:
    audio = decode_audio(jfk_path)
    results = feed(audio, LiveOptions())
    offline = list(pipeline("tiny.en").transcribe(audio))[-1].text
    finals = [r for r in results if r.is_final]
    live_text = "".join(r.text for r in finals)
    assert word_distance(live_text, offline) <= 1, (live_text, offline)
    interim = [r for r in results if not r.is_final]
    assert interim and interim[0].audio_seconds < len(audio) / SAMPLE_RATE
    # finals come in order of the audio, words on the stream's clock, never revised
    words = [w for r in finals for w in r.words]
    assert [w.word for w in words] == [w for r in finals for w in _split(r)]
    starts = [w.start for w in words]
    assert starts == sorted(starts) and 0 <= starts[0] and words[-1].end <= 11.1
    assert all(f.audio_seconds <= g.audio_seconds for f, g in zip(finals, finals[1:], strict=False))


def _split(result) -> list[str]:
    return [w.word for w in result.words]


def test_rows_and_commit_margin(jfk_path) -> None:
    audio = decode_audio(jfk_path)
    results = feed(audio, LiveOptions(commit_margin=0.4, agreement=False))
    pipe = pipeline("tiny.en")
    dims = pipe.dims
    for r in results:
        for t in r.tokens:
            assert t.attention.shape == (dims.n_text_layer, dims.n_text_head, dims.n_audio_ctx)
            np.testing.assert_allclose(t.attention.sum(-1), 1.0, atol=1e-5)
    # without agreement, a final token (before finish) looked at least the margin back
    for r in results[:-1]:
        if r.is_final:
            assert all(t.peak_time < r.audio_seconds - 0.4 for t in r.tokens[:1])


def test_silence_commits_nothing() -> None:
    silence = np.zeros(5 * SAMPLE_RATE, dtype=np.float32)
    results = feed(silence, LiveOptions())
    assert "".join(r.text for r in results if r.is_final).strip() == ""
