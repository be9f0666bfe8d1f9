"""Live steps over a short window (LiveOptions.encode_margin, xattn.model.live.window): the
encoder over the first 2n mel frames, decodes over caches of fewer frames (alone and batched
beside whole windows, in Python and in the C++ step), rows 1,500 wide, and a margin that
reaches the whole window giving exactly the padded window's result."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from openai_ref import pipeline, reference_model

from xattn.model.audio.features import (
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    decode_audio,
    log_mel_spectrogram,
    pad_or_trim,
)
from xattn.model.live import window
from xattn.model.live.policy import (
    commit_count,
    echoes,
    monotonic_count,
    pause_in,
    repeat_count,
    silent,
    stalled,
    voiced_after,
)
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions, LiveToken
from xattn.model.live.window import (
    full_rows,
    kept_frames,
    tail_frames,
    window_frame,
    window_mel,
)
from xattn.model.net import fused
from xattn.model.net.kv_cache import CacheBatch


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "shared" / "audio" / "jfk.flac"
    return decode_audio(str(path))


def feed(audio: np.ndarray, options: LiveOptions, chunk_s: float = 0.5) -> tuple[list, object]:
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
    results, n = [], int(chunk_s * SAMPLE_RATE)
    for at in range(0, len(audio), n):
        results += live.feed(audio[at : at + n])
    return results + live.finish(), live.stats


@pytest.mark.parametrize("seconds", [0.0001, 0.01, 1.0, 3.3, 12.0, 25.1, 30.0, 31.0])
@pytest.mark.parametrize("kind", ["speech", "noise", "silence"])
def test_window_mel_is_the_padded_windows_bit_for_bit(
    seconds: float, kind: str, jfk: np.ndarray
) -> None:
    """A step's log-mel, from one second of padding, is the log-mel the file path takes of
    the same audio (30 s of padding, as openai-whisper's transcribe: its first frames,
    zero-padded to 3,000), bit for bit."""
    n = round(seconds * SAMPLE_RATE)
    rng = np.random.default_rng(n)
    audio = {
        "speech": np.tile(jfk, 3)[:n],
        "noise": (rng.standard_normal(n) * 0.1).astype(np.float32),
        "silence": np.zeros(n, np.float32),
    }[kind]
    mel = log_mel_spectrogram(audio, 80, N_SAMPLES)  # [80, frames + 3000]
    frames = min(N_FRAMES, mel.shape[-1] - N_FRAMES)
    ours, content = window_mel(audio, 80)
    assert content == frames
    assert torch.equal(ours, pad_or_trim(mel[:, :frames], N_FRAMES)[None])


def test_kept_frames_round_up_to_whole_seconds() -> None:
    assert kept_frames(437, None) == N_FRAMES
    assert kept_frames(437, 1.0) == kept_frames(0, 0.0) == round(window.SHORTEST * 100)
    assert kept_frames(437, 1.0, floor=1.0) == 600  # 4.37 + 1 s -> 6 s
    assert kept_frames(400, 1.0, floor=1.0) == 500
    assert kept_frames(2950, 2.0) == N_FRAMES  # never past the window
    assert kept_frames(0, 0.0, floor=1.0) == 100
    assert kept_frames(437, 2.0, floor=15.0) == 1500  # the floor
    assert full_rows(np.ones((2, 3, 250))).shape == (2, 3, 1500)
    assert full_rows(np.ones((2, 3, 250)))[..., 250:].sum() == 0


def test_a_short_window_keeps_the_window_end() -> None:
    assert tail_frames(N_FRAMES) == 0 and tail_frames(600) == 50
    assert tail_frames(2950) == 25  # never past the window: 1475 + 25 frames
    # a row over 300 + 50 frames: its first 300 are the window's first, the rest its last
    assert [window_frame(i, 350, 50) for i in (0, 299, 300, 349)] == [0, 299, 1450, 1499]
    assert [window_frame(i, 1500, 0) for i in (0, 1499)] == [0, 1499]
    rows = full_rows(np.arange(1.0, 351.0)[None], 50)  # [1, 1500]
    assert rows[0, 299] == 300 and rows[0, 300:1450].sum() == 0 and rows[0, 1450] == 301
    assert rows[0, 1499] == 350


@torch.inference_mode()
def test_short_encoder_equals_a_direct_computation(jfk: np.ndarray) -> None:
    """Features over n frames: openai-whisper's encoder layers, run by hand over the first n
    positions (its forward asserts 1,500), on the same weights."""
    ours = pipeline("tiny.en").context.model.encoder
    ref = reference_model("tiny.en").encoder
    mel, _ = window_mel(jfk[: 4 * SAMPLE_RATE], ours.conv1.in_channels)  # [1, 80, 3000]
    frames = 600  # 4 s + 2 s
    short = mel[..., :frames]  # [1, 80, 600]
    x = torch.nn.functional.gelu(ref.conv1(short))
    x = torch.nn.functional.gelu(ref.conv2(x)).permute(0, 2, 1)  # [1, 300, d]
    x = x + ref.positional_embedding[: frames // 2]
    for block in ref.blocks:
        x = block(x)
    direct = ref.ln_post(x)  # [1, 300, d]
    got = ours(short)
    assert got.shape == direct.shape == (1, 300, ours.ln_post.weight.shape[0])
    torch.testing.assert_close(got, direct, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="even count"):
        ours(mel[..., :601])
    # with a tail: the last 50 frames (padding) at the window's last positions
    padded = torch.nn.functional.pad(short, (0, 100))  # [1, 80, 700]
    x = torch.nn.functional.gelu(ref.conv1(padded))
    x = torch.nn.functional.gelu(ref.conv2(x)).permute(0, 2, 1)  # [1, 350, d]
    x = x + torch.cat([ref.positional_embedding[:300], ref.positional_embedding[-50:]])
    for block in ref.blocks:
        x = block(x)
    torch.testing.assert_close(ours(padded, tail=50), ref.ln_post(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="tail"):
        ours(padded, tail=350)


def greedy(model, caches: list, first: list[int], n: int) -> list[list[int]]:
    """n greedy tokens of each cache, stepped together as one CacheBatch."""
    batch = CacheBatch(caches)
    out = [[t] for t in first]
    for _ in range(n):
        tokens = torch.tensor([o[-1] for o in out])[:, None]  # [B, 1]
        logits, scores = model.decoder(tokens, batch, need_scores=True)
        widest = max(c.cross.k[0].shape[-1] for c in caches)
        assert all(s.shape[-1] == widest for s in scores)
        for o, row in zip(out, logits[:, -1], strict=True):
            o.append(int(row.argmax()))
    return [o[1:] for o in out]


@pytest.mark.parametrize("step", ["python", "c++"])
@torch.inference_mode()
def test_batched_step_mixing_window_lengths(
    jfk: np.ndarray, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1,500-frame window and a short one stepped in one batch: each decode gets the tokens
    it gets alone (its rows padded with -inf scores past its frames)."""
    if step == "python":
        monkeypatch.setattr(fused, "step", lambda *args: None)
    elif fused.extension() is None:
        pytest.skip("the C++ decoder step is not built (make install builds it)")
    pipe = pipeline("tiny.en")
    model, tok = pipe.context.model, pipe.context.tokenizer
    mel, _ = window_mel(jfk[: 6 * SAMPLE_RATE], model.dims.n_mels)
    short = mel[..., :700]  # [1, 80, 700]: 6 s + 1 s
    prompt = [*tok.sot_sequence("en"), tok.no_timestamps]

    def primed(m: torch.Tensor):
        cache = model.new_cache(model.encoder(m))
        logits, _ = model.decoder(torch.tensor([prompt]), cache)
        return cache, int(logits[0, -1].argmax())

    alone = []
    for m in (mel, short):
        cache, first = primed(m)
        alone += greedy(model, [cache], [first], 8)
    (c1, f1), (c2, f2) = primed(mel), primed(short)
    assert c2.cross.k[0].shape[-1] == 350
    together = greedy(model, [c1, c2], [f1, f2], 8)
    assert together == alone


def test_live_rows_are_1500_wide_and_jfk_reads_right(jfk: np.ndarray) -> None:
    options = LiveOptions(encode_margin=2.0, max_jump=1.0, tokens_per_second=8.0)
    results, stats = feed(jfk, options)
    rows = [t.attention for r in results for t in r.tokens]
    assert rows and all(a is not None and a.shape[-1] == 1500 for a in rows)
    text = "".join(r.text for r in results if r.is_final).lower()
    words = text.replace(",", "").replace(".", "")
    assert "not what your country can do for you ask what you can do for your country" in words
    assert stats.encoder_frames < stats.steps * 1500  # short windows
    # punctuation reads no audio: its row peaks in the window's last frames (the tail) where
    # a whole window's would (without the tail it peaked in the speech, at 0.24 s)
    marks = [t for r in results for t in r.tokens if t.text in (",", ".")]
    heads = np.array(pipeline("tiny.en").alignment_heads)
    assert marks and any(
        t.attention[heads[:, 0], heads[:, 1]].mean(0).argmax() >= 1450 for t in marks
    )
    assert stats.decoder_steps > 0


JFK_WORDS = (
    "and so my fellow americans ask not what your country can do for you "
    "ask what you can do for your country"
).split()


@pytest.mark.parametrize("margin", [None, 2.0], ids=["whole window", "short window"])
@pytest.mark.parametrize("chunk_s", [0.5, 0.4])
def test_default_live_transcript_of_jfk(
    jfk: np.ndarray, chunk_s: float, margin: float | None
) -> None:
    """At 0.4 s feeds the decoder stalls after "Americans." and after "not.": the buffer
    slides into the pause after them (it once slid to their DTW ends, stretched over the pause
    to the next word's first sound, and read "Yes, not. Like your country"). The whole
    window (the default) reads every word right; short windows (encode_margin) at most one
    word otherwise (at 0.5 s feeds "asked not", committed before "not" was heard out)."""
    results, stats = feed(jfk, LiveOptions(encode_margin=margin), chunk_s)
    text = "".join(r.text for r in results if r.is_final)
    words = text.strip().lower().replace(",", "").replace(".", "").split()
    wrong = 0 if margin is None else 1
    assert len(words) == len(JFK_WORDS), text
    assert sum(a != b for a, b in zip(words, JFK_WORDS, strict=True)) <= wrong, text
    assert stats.encoder_frames > 0 and stats.decoder_steps >= len(text.split())
    assert (stats.encoder_frames < 1500 * stats.steps) == (margin is not None)


def test_a_margin_reaching_the_window_is_the_whole_window(jfk: np.ndarray) -> None:
    """encode_margin past 30 s encodes the padded window: the same results, row for row."""
    clip = jfk[: 5 * SAMPLE_RATE]
    full, _ = feed(clip, LiveOptions(encode_margin=None))
    reaching, _ = feed(clip, LiveOptions(encode_margin=30.0))
    assert [(r.is_final, [t.id for t in r.tokens]) for r in full] == [
        (r.is_final, [t.id for t in r.tokens]) for r in reaching
    ]
    for a, b in zip(full, reaching, strict=True):
        for x, y in zip(a.tokens, b.tokens, strict=True):
            np.testing.assert_array_equal(x.attention, y.attention)
            assert x.peak_time == y.peak_time


def token(i: int, text: str, peak: float) -> LiveToken:
    return LiveToken(i, text, 0.0, peak)


def test_policy_cuts_loops_and_keeps_words_whole() -> None:
    loop = [token(1, " a", 0.5), token(2, " b", 0.7), token(3, "c", 3.0)]
    loop += [token(1, " a", 0.5), token(2, " b", 0.7), token(3, "c", 0.9)]
    assert monotonic_count(loop, 1.0) == 3
    stray = [token(1, " a", 2.0), token(2, "x", 0.2), token(3, " b", 2.4), token(4, " c", 2.8)]
    assert monotonic_count(stray, 1.0) == 4  # one stray peak is no loop
    assert monotonic_count(loop, None) == 6
    assert repeat_count([5, 1, 1, 1, 1, 2], 2) == 2  # " remember" x 4 -> once
    assert repeat_count([5, 1, 2, 1, 2, 1, 2, 7], 2) == 3
    assert repeat_count([5, 1, 1, 2], 2) == 4  # twice is speech
    assert repeat_count([1, 1, 1], None) == 3
    words = [token(1, " ab", 0.1), token(2, "c", 0.2), token(3, " d", 0.3), token(4, " e", 5.0)]
    assert commit_count(words, [], edge=1.0, agreement=False) == 2  # " abc" whole, " d" waits
    assert commit_count(words[:2] + words[3:], [], edge=1.0, agreement=False) == 0


def test_gate_skips_steps_over_silence_and_urgency_grows() -> None:
    """gate_db: silence runs no step (nothing undecided); urgency counts the unheard audio."""
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, LiveOptions(gate_db=-50.0))
    assert live.urgency == 0.0
    out = []
    for _ in range(6):
        out += live.feed(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
    assert out == [] and live.stats.steps == 0 and live.stats.skipped_steps == 6
    assert live.feed(np.full(SAMPLE_RATE // 10, 0.1, np.float32)) == []  # under min_step
    assert abs(live.urgency - 0.1) < 1e-6  # 0.1 s not yet decided on


def test_stalled_is_an_ended_text_short_of_the_audio() -> None:
    rest = [token(13, ".", 29.98)]
    assert stalled(rest, ended=True, last_heard=6.0, edge=8.0)
    assert stalled([], ended=True, last_heard=6.0, edge=8.0)
    assert not stalled(rest, ended=False, last_heard=6.0, edge=8.0)  # cut, not ended
    assert not stalled(rest, ended=True, last_heard=7.5, edge=7.0)  # too little after it
    assert not stalled(rest, ended=True, last_heard=None, edge=8.0)  # nothing committed
    assert not stalled([token(1, " The", 8.5)], ended=True, last_heard=6.0, edge=8.0)


@pytest.mark.parametrize("margin", [None, 2.0], ids=["whole window", "short window"])
def test_a_stalled_decoder_slides_and_the_next_sentence_is_heard(margin: float | None) -> None:
    """Two real sentences 1 s apart (../shared/eval, as recorded: the second 40 dB quieter,
    as a far speaker after a near one): after the first, continuing its forced text, tiny.en
    proposes the full stop and the end of text step after step while the second is spoken;
    the stall rule slides the buffer there, and the second sentence's words become final while
    it is spoken (without the rule, or with a voice judged only against the first speaker's
    level, they were never committed: live_scale lost them at four streams)."""
    from pathlib import Path

    eval_dir = Path(__file__).resolve().parents[2] / "shared" / "eval" / "audio"
    first, second = (decode_audio(str(eval_dir / f"cuttledoc_fleurs-en-00{k}.ogg")) for k in (1, 3))
    audio = np.concatenate([first, np.zeros(SAMPLE_RATE, np.float32), second])
    results, _ = feed(audio, LiveOptions(encode_margin=margin), chunk_s=0.3)
    spoken = [r for r in results if r.is_final and r.audio_seconds < len(audio) / SAMPLE_RATE]
    text = "".join(r.text for r in spoken).lower()
    assert "sentence" in text  # the first's end
    assert sum(w in text for w in ("juice", "color", "depending", "acidic", "chemical")) >= 4


def test_echoes_and_voiced_after() -> None:
    prompt = [7, 1, 2, 3, 4, 5, 6, 9]
    assert echoes([2, 3, 4, 5, 6, 11], prompt)  # five of the prompt's in a row
    assert not echoes([2, 3, 4, 5, 11, 6], prompt)
    assert not echoes([2, 3, 4], prompt)  # too short to tell
    speech = np.sin(np.arange(2 * SAMPLE_RATE) * 0.05).astype(np.float32) * 0.3  # [2 s]
    quiet = np.full(SAMPLE_RATE, 0.003, np.float32)  # [1 s], -40 dB under it
    assert not voiced_after(np.concatenate([speech, quiet]), len(speech))
    assert voiced_after(np.concatenate([speech, quiet, speech[:4000]]), len(speech))
    assert not voiced_after(speech, len(speech))  # nothing after
    zeros = np.zeros(SAMPLE_RATE, np.float32)  # digital silence: at the -100 dB floor
    assert voiced_after(np.concatenate([speech, zeros, speech[:4000]]), len(speech))
    assert not voiced_after(np.concatenate([speech, zeros]), len(speech))
    far = speech[:4000] * 0.003  # a voice 50 dB under the first, over digital silence or noise
    assert voiced_after(np.concatenate([speech, zeros, far]), len(speech))
    hiss = np.random.default_rng(0).normal(0, 1e-4, SAMPLE_RATE).astype(np.float32)  # -80 dB
    assert voiced_after(np.concatenate([speech, hiss, hiss[:4000] + far]), len(speech))
    assert not voiced_after(np.concatenate([speech, hiss, hiss]), len(speech))


def test_silent_is_nothing_above_minus_80_dbfs() -> None:
    assert silent(np.zeros(3 * SAMPLE_RATE, np.float32))
    assert silent(np.full(SAMPLE_RATE, 1e-5, np.float32))  # -100 dB: a dithered muted mic
    assert silent(np.zeros(0, np.float32))
    quiet_voice = np.sin(np.arange(SAMPLE_RATE) * 0.05).astype(np.float32) * 1e-3  # -63 dB
    assert not silent(quiet_voice)
    click = np.zeros(SAMPLE_RATE + 800, np.float32)
    click[-400:] = 0.1  # after the last whole frame
    assert not silent(click)


@pytest.mark.parametrize("margin", [None, 2.0], ids=["whole window", "short window"])
def test_a_silent_stream_runs_no_step_and_commits_nothing(margin: float | None) -> None:
    """Whisper guesses " you" over a short window of digital silence (no_speech 0.91 with an
    average logprob of -0.9, inside openai-whisper's rule's bounds); a muted stream decodes
    nothing."""
    results, stats = feed(np.zeros(5 * SAMPLE_RATE, np.float32), LiveOptions(encode_margin=margin))
    assert not [r for r in results if r.text.strip()]
    assert stats.steps == 0 and stats.skipped_steps > 0


def test_pause_in_finds_the_middle_of_the_first_pause_after_a_word() -> None:
    speech = np.sin(np.arange(SAMPLE_RATE) * 0.05).astype(np.float32) * 0.3  # [1 s]
    quiet = np.full(SAMPLE_RATE // 2, 0.003, np.float32)  # [0.5 s], -40 dB under it
    gap = np.full(SAMPLE_RATE // 10, 0.003, np.float32)  # [0.1 s]: a closure, not a pause
    audio = np.concatenate([speech, gap, speech, quiet, speech])  # pause at 2.1 - 2.6 s
    assert pause_in(audio, 0, len(audio)) == round(2.35 * SAMPLE_RATE)
    assert pause_in(audio, 0, round(2.0 * SAMPLE_RATE)) is None  # begins after `last`
    assert pause_in(audio, round(2.2 * SAMPLE_RATE), len(audio)) == round(2.4 * SAMPLE_RATE)
    assert pause_in(np.concatenate([speech, speech]), 0, 2 * SAMPLE_RATE) is None  # no quiet
    # with a lead: at most that much of the pause before the speech after it
    assert pause_in(audio, 0, len(audio), lead=SAMPLE_RATE // 10) == round(2.5 * SAMPLE_RATE)
    assert pause_in(audio, 0, len(audio), lead=SAMPLE_RATE) == round(2.35 * SAMPLE_RATE)


def test_a_finish_over_silence_keeps_the_last_decode(jfk: np.ndarray) -> None:
    """The audio since the last decode is quiet (a satellite's trailing silence): the finish
    commits that decode's hypothesis without decoding again; speech since: it decodes."""
    pipe = pipeline("tiny.en")
    quiet = np.zeros(SAMPLE_RATE // 5, np.float32)  # [0.2 s]: less than a step's worth
    for tail, decodes in ((quiet, 0), (jfk[-SAMPLE_RATE // 5 :], 1)):
        live = LiveTranscriber(pipe.context, pipe.alignment_heads, LiveOptions())
        finals = [r for r in live.feed(jfk[: -SAMPLE_RATE // 5]) if r.is_final]
        finals += live.feed(tail)  # under min_step: no step
        steps = live.stats.steps
        finals += live.finish()
        assert live.stats.steps - steps == decodes
        text = "".join(r.text for r in finals).lower()
        assert "ask what you can do for your country" in text, text
