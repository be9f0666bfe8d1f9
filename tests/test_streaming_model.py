"""The live policy in-process: feed jfk.flac in chunks, as a microphone would.

How the audio is cut into decode steps depends, in the service, on the load: the policy is held
to the offline transcript over several cuts (steps every 0.3 s, 0.5 s, 1 s and uneven ones).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from openai_ref import pipeline
from wording import word_distance, words_of

from xattn.model.audio.features import SAMPLE_RATE, decode_audio
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions


def feed(audio: np.ndarray, options: LiveOptions, chunk_s: float | list[float] = 0.5):
    """Feed `audio` in chunks of `chunk_s` seconds (a list: those sizes, cycled)."""
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
    sizes = chunk_s if isinstance(chunk_s, list) else [chunk_s]
    results, at = [], 0
    for size in itertools.cycle(sizes):
        if at >= len(audio):
            break
        n = int(size * SAMPLE_RATE)
        results += live.feed(audio[at : at + n])
        at += n
    results += live.finish()
    return results


def final_text(results) -> str:
    return "".join(r.text for r in results if r.is_final)


@pytest.fixture(scope="module")
def offline(jfk_path) -> str:
    """jfk.flac's offline transcript, to hold the live ones to."""
    return list(pipeline("tiny.en").transcribe(decode_audio(jfk_path)))[-1].text


def test_live_transcript_close_to_offline(jfk_path, offline) -> None:
    audio = decode_audio(jfk_path)
    results = feed(audio, LiveOptions())
    finals = [r for r in results if r.is_final]
    live_text = final_text(results)
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
    assert final_text(results).strip() == ""


UNEVEN = [0.9, 0.4, 1.3, 0.6, 1.1, 0.35, 1.5, 0.8]  # seconds of audio per step


@pytest.mark.parametrize("chunk_s", [0.1, 1.0, UNEVEN], ids=["0.1s", "1s", "uneven"])
def test_any_cut_of_the_audio_gives_the_offline_text(jfk_path, offline, chunk_s) -> None:
    audio = decode_audio(jfk_path)
    live = final_text(feed(audio, LiveOptions(), chunk_s))
    assert word_distance(live, offline) <= 1, (live, offline)


def test_a_pause_does_not_repeat_the_sentence(jfk_path, offline) -> None:
    """jfk, 1 s of silence, jfk again, in 0.1 s chunks (a step every 0.3 s): each sentence once.
    (Tokens decoded at the pause attend to the padding or back to old speech; the policy must
    not commit them.)"""
    jfk = decode_audio(jfk_path)
    audio = np.concatenate([jfk, np.zeros(SAMPLE_RATE, np.float32), jfk])
    live = final_text(feed(audio, LiveOptions(), 0.1))
    assert word_distance(live, offline + offline) <= 2, (live, offline)
    assert words_of(live).count("country") == 4, live
