"""transcribe/alignment.py against hand-made cases and openai-whisper's reference implementation."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from xattn.model.decode.tokenizer import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from xattn.model.transcribe.alignment import (
    AlignedWord,
    SegmentTokens,
    add_word_timestamps,
    dtw,
    find_alignment,
    median_filter,
    merge_punctuations,
    online_token_time,
    split_to_word_tokens,
    token_probabilities,
)

try:  # openai-whisper (and numba) are the reference; hand-made checks run without them
    import whisper.model as whisper_model
    import whisper.timing as timing
    import whisper.tokenizer as whisper_tokenizer
except ImportError:
    timing = whisper_model = whisper_tokenizer = None


def require_openai() -> None:
    if timing is None:
        pytest.skip("openai-whisper is not installed")


EOT = 100
# a tiny byte-level vocabulary; "世" (e4 b8 96) is split across tokens 7 and 8
VOCAB = {
    1: b" Hel",
    2: b"lo",
    3: b",",
    4: b" wor",
    5: b"ld",
    6: b"!",
    7: b"\xe4\xb8",
    8: b"\x96",
    9: b"\xe7\x95\x8c",
    10: b' "',
    11: b".",
    12: b" \xe4\xb8\x96",
    EOT: b"<|endoftext|>",
}


def fake_decode(tokens: list[int]) -> str:
    return b"".join(VOCAB[t] for t in tokens).decode("utf-8", errors="replace")


# ---- DTW ----------------------------------------------------------------------------------


def test_dtw_diagonal() -> None:
    text, frames = dtw(1.0 - np.eye(5))
    assert text.tolist() == [0, 1, 2, 3, 4]
    assert frames.tolist() == [0, 1, 2, 3, 4]


def test_dtw_staircase() -> None:
    cost = np.ones((3, 6))
    for row in range(3):
        cost[row, 2 * row : 2 * row + 2] = 0.0
    text, frames = dtw(cost)
    assert text.tolist() == [0, 0, 1, 1, 2, 2]
    assert frames.tolist() == [0, 1, 2, 3, 4, 5]


def _whisper_dtw(cost: np.ndarray) -> tuple[list[int], list[int]]:
    require_openai()
    path = timing.dtw_cpu(cost.astype(np.float64))
    return path[0].tolist(), path[1].tolist()


@pytest.mark.parametrize("seed", range(20))
def test_dtw_matches_whisper_random(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cost = rng.standard_normal((7, 40)).astype(np.float32)
    text, frames = dtw(cost)
    assert (text.tolist(), frames.tolist()) == _whisper_dtw(cost)


@pytest.mark.parametrize("seed", range(10))
def test_dtw_matches_whisper_with_ties(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    cost = rng.integers(0, 3, size=(6, 25)).astype(np.float64)  # many equal sums
    text, frames = dtw(cost)
    assert (text.tolist(), frames.tolist()) == _whisper_dtw(cost)


def test_dtw_full_window_matches() -> None:
    rng = np.random.default_rng(7)
    cost = rng.standard_normal((30, 1500)).astype(np.float32)
    text, frames = dtw(cost)
    assert (text.tolist(), frames.tolist()) == _whisper_dtw(cost)


# ---- median filter ------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 3, 7])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 8, 50])
@pytest.mark.parametrize("shape", [(), (4,), (2, 3)])
def test_median_filter_matches_whisper(width: int, length: int, shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, length, generator=torch.Generator().manual_seed(length))
    ours = median_filter(x, width)
    assert ours.shape == x.shape
    require_openai()
    assert torch.equal(ours, timing.median_filter(x, width))


@pytest.mark.parametrize("width", [3, 7, 17])  # 17: wider than the network, kthvalue
def test_median_filter_nan_inf_and_ties_as_sorting(width: int) -> None:
    """The middle of each sorted window, NaN sorting last (NaN where most of it is NaN)."""
    g = torch.Generator().manual_seed(width)
    for trial in range(12):
        x = torch.randint(-2, 3, (2, 3, 60), generator=g).float()  # many ties
        if trial % 2:
            x = torch.randn(2, 3, 60, generator=g)
        u = torch.rand(x.shape, generator=g)
        x[u < 0.1 * (trial % 6)] = math.nan  # up to half NaN: some windows mostly NaN
        x[u > 0.93] = math.inf
        x[(u > 0.88) & (u <= 0.93)] = -math.inf
        pad = width // 2
        index = torch.cat(
            [torch.arange(pad, 0, -1), torch.arange(60), torch.arange(58, 58 - pad, -1)]
        )
        expected = x[..., index].unfold(-1, width, 1).sort(dim=-1).values[..., pad]
        ours = median_filter(x, width)
        assert torch.equal(ours.isnan(), expected.isnan())
        assert torch.equal(ours.nan_to_num(0.5), expected.nan_to_num(0.5))


def test_median_filter_short_input_unchanged_and_edges() -> None:
    x = torch.tensor([3.0, 1.0, 2.0])
    assert median_filter(x, 7) is x  # 3 <= 7 // 2: nothing to reflect
    y = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])
    # reflect-padded: [2, 4, 1, 5, 1, 4, 2, 3, 2, 4, 1]
    assert median_filter(y, 7).tolist() == [2.0, 3.0, 2.0, 3.0, 2.0]
    with pytest.raises(ValueError):
        median_filter(y, 4)


# ---- word splitting -----------------------------------------------------------------------


def test_split_multi_token_words_on_spaces() -> None:
    words, groups = split_to_word_tokens([1, 2, 3, 4, 5, 6, EOT], "en", fake_decode, EOT)
    assert words == [" Hello", ",", " world", "!", "<|endoftext|>"]
    assert groups == [[1, 2], [3], [4, 5], [6], [EOT]]


def test_split_unicode_joins_partial_characters() -> None:
    words, groups = split_to_word_tokens([7, 8, 9, 11, EOT], "zh", fake_decode, EOT)
    assert words == ["世", "界", ".", "<|endoftext|>"]
    assert groups == [[7, 8], [9], [11], [EOT]]
    # space splitting also waits for complete characters before deciding
    words, groups = split_to_word_tokens([12, 7, 8, EOT], "en", fake_decode, EOT)
    assert words == [" 世世", "<|endoftext|>"]
    assert groups == [[12, 7, 8], [EOT]]


@pytest.mark.parametrize(
    ("language", "text"),
    [
        ("en", ' Hello, world! "Quoted" text... (really)? It\'s 3.5 km-long.'),
        ("ja", " こんにちは、世界。今日はいい天気ですね！"),
        ("zh", " 我们今天去公园吧，好吗？"),
    ],
)
def test_split_matches_whisper_tokenizer(language: str, text: str) -> None:
    require_openai()
    tok = whisper_tokenizer.get_tokenizer(multilingual=True, language=language)
    tokens = [*tok.encode(text), tok.eot]
    ours = split_to_word_tokens(tokens, language, tok.decode_with_timestamps, tok.eot)
    assert ours == tok.split_to_word_tokens(tokens)


# ---- punctuation --------------------------------------------------------------------------


def _aligned(word: str, tokens: tuple[int, ...], start: float, end: float) -> AlignedWord:
    return AlignedWord(word=word, tokens=tokens, start=start, end=end, probability=0.5)


def _to_openai(words: list[AlignedWord]) -> list:
    return [
        timing.WordTiming(
            w.word,
            list(w.tokens),
            np.float64(w.start),
            np.float64(w.end),
            np.float64(w.probability),
        )
        for w in words
    ]


def test_merge_punctuations_quote_and_trailing_marks() -> None:
    words = [
        _aligned(' "', (10,), 0.0, 0.1),
        _aligned(" Hello", (1, 2), 0.1, 0.5),
        _aligned(",", (3,), 0.5, 0.6),
        _aligned(" world", (4, 5), 0.6, 1.0),
        _aligned(".", (11,), 1.0, 1.1),
        _aligned('"', (13,), 1.1, 1.2),
    ]
    merged = merge_punctuations(words, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [w.word for w in merged] == ["", ' " Hello,', "", ' world."', "", ""]
    assert merged[1].tokens == (10, 1, 2, 3)
    assert merged[3].tokens == (4, 5, 11, 13)
    assert (merged[1].start, merged[1].end) == (0.1, 0.5)  # times stay the receiver's
    require_openai()
    reference = _to_openai(words)
    timing.merge_punctuations(reference, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [(w.word, w.tokens) for w in reference] == [(w.word, list(w.tokens)) for w in merged]


# ---- add_word_timestamps vs openai ----------------------------------------------------------


def _openai_add(
    monkeypatch,
    segments: list[SegmentTokens],
    words: list[AlignedWord],
    seek: int,
    last_speech: float,
) -> list[dict]:
    require_openai()
    monkeypatch.setattr(timing, "find_alignment", lambda *a, **k: _to_openai(words))
    dicts = [
        {"seek": seek, "start": s.start, "end": s.end, "tokens": [*s.text_tokens, 50400]}
        for s in segments
    ]
    timing.add_word_timestamps(
        segments=dicts,
        model=None,
        tokenizer=SimpleNamespace(eot=50257),
        mel=None,
        num_frames=0,
        last_speech_timestamp=last_speech,
    )
    return dicts


def _assert_same(ours, last: float, theirs: list[dict]) -> None:
    for mine, ref in zip(ours, theirs, strict=True):
        assert (mine.start, mine.end) == (float(ref["start"]), float(ref["end"]))  # bit-exact
        got = [(w.word, w.start, w.end, w.probability) for w in mine.words]
        want = [
            (w["word"], float(w["start"]), float(w["end"]), float(w["probability"]))
            for w in ref["words"]
        ]
        assert got == want
    expected = next(
        (w["end"] for s in reversed(theirs) for w in reversed(s["words"])), theirs[-1]["end"]
    )
    assert last == float(expected)


def test_first_word_after_long_pause_is_clamped(monkeypatch) -> None:
    words = [
        _aligned(" One", (1,), 0.0, 0.3),
        _aligned(" two", (2,), 0.3, 0.6),
        _aligned(" three", (3,), 0.6, 1.0),
        _aligned(" four", (4,), 1.0, 4.5),  # 3 s of silence absorbed into this word
        _aligned(" five", (5,), 4.5, 4.8),
    ]
    segments = [SegmentTokens(10.0, 11.0, (1, 2, 3)), SegmentTokens(14.0, 14.8, (4, 5))]
    ours, last = add_word_timestamps(segments, words, time_offset=10.0, last_speech_timestamp=0.0)
    # median 0.3 s, max 0.6 s: "four" is cut to the 0.6 s before its end, the segment follows
    assert (ours[1].words[0].start, ours[1].words[0].end) == pytest.approx((13.9, 14.5))
    assert ours[1].start == pytest.approx(13.9)
    _assert_same(ours, last, _openai_add(monkeypatch, segments, words, 1000, 0.0))


def test_sentence_end_truncation_and_segment_snap(monkeypatch) -> None:
    words = [
        _aligned(" Hi", (1,), 0.0, 0.2),
        _aligned(".", (11,), 0.2, 2.0),  # a long period at a sentence end
        _aligned(" Next", (4,), 2.0, 4.0),  # a long word after a sentence end
        _aligned(" one", (5,), 4.0, 4.2),
    ]
    segments = [SegmentTokens(5.0, 7.0, (1, 11)), SegmentTokens(7.0, 9.5, (4, 5))]
    ours, last = add_word_timestamps(segments, words, time_offset=5.0, last_speech_timestamp=4.0)
    assert [w.word for w in ours[0].words] == [" Hi."]
    _assert_same(ours, last, _openai_add(monkeypatch, segments, words, 500, 4.0))


@pytest.mark.parametrize("seed", range(150))
def test_add_word_timestamps_matches_openai_random(monkeypatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = [" a", " bb", "cc", ".", ",", ' "', "?", " (", ")", " long", "!", ""]
    n = int(rng.integers(1, 14))
    cuts = np.sort(rng.integers(0, 300, size=n + 1)) / 50
    if rng.random() < 0.3:
        cuts[rng.integers(0, n + 1) :] += 3.0  # a long pause
    words = [
        AlignedWord(
            str(rng.choice(vocab)),
            tuple(range(3 * i, 3 * i + int(rng.integers(1, 3)))),
            float(cuts[i]),
            float(cuts[i + 1]),
            float(rng.random()),
        )
        for i in range(n)
    ]
    flat = [t for w in words for t in w.tokens]
    splits = np.sort(rng.integers(0, len(flat) + 1, size=int(rng.integers(0, 3))))
    pieces = np.split(np.array(flat), splits)
    offset = float(rng.integers(0, 3000)) / 100
    segments, start = [], offset
    for piece in pieces:
        end = start + float(rng.integers(0, 400)) / 50
        segments.append(SegmentTokens(start, end, tuple(int(t) for t in piece)))
        start = end
    last_speech = max(0.0, offset - float(rng.integers(0, 500)) / 100)
    ours, last = add_word_timestamps(
        segments, words, time_offset=offset, last_speech_timestamp=last_speech
    )
    _assert_same(
        ours, last, _openai_add(monkeypatch, segments, words, round(offset * 100), last_speech)
    )


# ---- find_alignment -------------------------------------------------------------------------


def test_find_alignment_synthetic_peaks_are_monotone() -> None:
    n_prefix, text = 4, [1, 2, 3, 4, 5, 6]
    rows = n_prefix + len(text) + 1
    frames = torch.arange(1500, dtype=torch.float32)
    peak = 10.0 * (torch.arange(rows) - (n_prefix - 1))  # row predicting token i peaks at 10i
    scores = -((frames[None, :] - peak[:, None]) ** 2) / 4.0  # [tokens, frames]
    scores = scores[None].repeat(2, 1, 1)  # [heads, tokens, frames]
    probs = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    words, starts, ends = find_alignment(
        scores,
        num_frames=100,
        n_prefix=n_prefix,
        text_tokens=text,
        text_token_probs=probs,
        language="en",
        decode_with_timestamps=fake_decode,
        eot=EOT,
    )
    assert [w.word for w in words] == [" Hello", ",", " world", "!"]
    assert [w.tokens for w in words] == [(1, 2), (3,), (4, 5), (6,)]
    assert words[0].probability == pytest.approx(0.85)
    assert all(a.start <= a.end == b.start for a, b in itertools.pairwise(words))
    assert np.all(np.diff(starts) > 0) and np.array_equal(starts[1:], ends[:-1])
    assert np.allclose(starts[1:], np.arange(1, 6) * 10 / 50, atol=0.12)
    assert words[0].start == starts[0] and words[-1].end == ends[-1]


@pytest.mark.parametrize(
    ("language", "text"),
    [("en", ' Hello, world! "Quoted" text.'), ("ja", " こんにちは、世界。今日はいい天気")],
)
def test_find_alignment_matches_openai_tiny_model(monkeypatch, language: str, text: str) -> None:
    require_openai()
    torch.manual_seed(0)
    dims = whisper_model.ModelDimensions(80, 1500, 16, 2, 1, 51865, 64, 16, 4, 2)
    model = whisper_model.Whisper(dims).eval()
    torch.nn.init.normal_(model.decoder.positional_embedding, std=0.5)  # torch.empty otherwise
    tok = whisper_tokenizer.get_tokenizer(multilingual=True, language=language)
    text_tokens = tok.encode(text)
    mel = torch.randn(80, 3000)
    captured: dict[int, torch.Tensor] = {}
    hooks = [
        block.cross_attn.register_forward_hook(
            lambda _m, _i, out, layer=layer: captured.__setitem__(layer, out[-1][0])
        )
        for layer, block in enumerate(model.decoder.blocks)
    ]
    hooks.append(
        model.decoder.register_forward_hook(lambda _m, _i, out: captured.__setitem__(-1, out[0]))
    )
    reference = timing.find_alignment(model, tok, text_tokens, mel, 1234)
    for hook in hooks:
        hook.remove()
    heads = model.alignment_heads.indices().T.tolist()
    scores = torch.stack([captured[layer][head] for layer, head in heads])  # [h, tokens, f]
    n_prefix = len(tok.sot_sequence) + 1
    probs = token_probabilities(
        captured[-1], n_prefix=n_prefix, text_tokens=text_tokens, eot=tok.eot
    )
    words, starts, ends = find_alignment(
        scores,
        num_frames=1234 // 2,
        n_prefix=n_prefix,
        text_tokens=text_tokens,
        text_token_probs=probs,
        language=language,
        decode_with_timestamps=tok.decode_with_timestamps,
        eot=tok.eot,
    )
    got = [(w.word, list(w.tokens), w.start, w.end, w.probability) for w in words]
    want = [
        (w.word, w.tokens, float(w.start), float(w.end), float(w.probability)) for w in reference
    ]
    assert got == want
    assert len(starts) == len(text_tokens) == len(ends)

    # the whole window through openai's add_word_timestamps vs ours
    half = len(text_tokens) // 2
    segments = [
        SegmentTokens(12.0, 15.0, tuple(text_tokens[:half])),
        SegmentTokens(15.0, 18.0, tuple(text_tokens[half:])),
    ]
    monkeypatch.setattr(timing, "find_alignment", lambda *a, **k: reference)
    ours, last = add_word_timestamps(segments, words, time_offset=12.0, last_speech_timestamp=9.0)
    dicts = [
        {"seek": 1200, "start": s.start, "end": s.end, "tokens": list(s.text_tokens)}
        for s in segments
    ]
    timing.add_word_timestamps(
        segments=dicts,
        model=model,
        tokenizer=tok,
        mel=mel,
        num_frames=1234,
        last_speech_timestamp=9.0,
    )
    _assert_same(ours, last, dicts)


def test_find_alignment_without_text() -> None:
    words, starts, ends = find_alignment(
        torch.zeros(2, 5, 1500),
        num_frames=100,
        n_prefix=4,
        text_tokens=[],
        text_token_probs=[],
        language="en",
        decode_with_timestamps=fake_decode,
        eot=EOT,
    )
    assert words == [] and len(starts) == 0 and len(ends) == 0


def test_online_token_time_is_the_peak() -> None:
    row = np.zeros(1500, dtype=np.float32)
    row[125] = 0.7
    row[1400] = 0.9  # attention sink in the padding
    assert online_token_time(row) == pytest.approx(28.0)
    assert online_token_time(row, num_frames=500) == pytest.approx(2.5)
