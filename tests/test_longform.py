"""Batched long-form at its chunks' edges (model/batched.py): speech across a chunk boundary is
transcribed once, a chunk whose window ends with a segment cut short gets the rest decoded in a
window of its own, and each chunk gives the tokens of the sequential transcription of that
chunk's audio alone.

The audio is J. F. Kennedy's 11 s repeated with no gap between the copies (each has its own
short pauses), so that every 30 s cut falls inside speech.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import long_form_file, tokens_per_window
from openai_ref import pipeline

from xattn.model.audio import decode_audio
from xattn.model.audio.vad import (
    SAMPLE_RATE,
    SpeechSpan,
    VadOptions,
    detect_speech,
    group_spans,
    join_speech,
)
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import Segment, WindowStart
from xattn.model.transcribe.batched import (
    CHUNK_VAD,
    MIN_TAIL,
    RESUME_AFTER,
    chunk_spans,
    quiet_cuts,
    windows_of,
)
from xattn.model.transcribe.sequential import (
    Piece,
    open_tail,
    resume_point,
    split_segments,
    transcribe,
)

OPENING = "ask not what your country can do for you"
CLOSING = "ask what you can do for your country"


def _options(**kw) -> DecodeOptions:
    return DecodeOptions(**({"language": "en", "temperatures": (0.0,)} | kw))


def _norm(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalpha() or c == " ").split())


@pytest.fixture(scope="module")
def jfk(jfk_path) -> np.ndarray:
    return decode_audio(jfk_path)


def _chunks(audio: np.ndarray, options: DecodeOptions):
    spans = chunk_spans(audio, options.vad_options) if options.vad_filter else None
    return windows_of(audio, spans)


def _sequential_per_chunk(audio: np.ndarray, options: DecodeOptions) -> dict[int, list[int]]:
    """Each chunk transcribed alone, sequentially (with keep_open_tails, as batched: a window
    after an open segment is not skipped as silence; min_tail; with VAD, resume_after), its
    k-th window numbered as batched numbers it (chunk + k x chunks)."""
    chunks = _chunks(audio, options)
    plain = dataclasses.replace(options, vad_filter=False, batch_size=None)
    ctx = pipeline("tiny.en").context
    out = {}
    resume = RESUME_AFTER if options.vad_filter else None
    for c in chunks:
        speech = join_speech(audio, c.spans)
        with torch.inference_mode():
            alone = list(
                transcribe(
                    ctx, speech, plain, keep_open_tails=True, resume_after=resume, min_tail=MIN_TAIL
                )
            )
        for k, tokens in tokens_per_window(alone).items():
            out[c.index + k * len(chunks)] = tokens
    return out


@pytest.mark.parametrize("vad_filter", [False, True])
def test_speech_across_a_chunk_boundary_is_transcribed_once(jfk, vad_filter) -> None:
    """Four copies with no gap (44 s): every phrase of every copy comes out, once."""
    audio = np.concatenate([jfk] * 4)
    options = _options(batch_size=4, vad_filter=vad_filter)
    events = list(pipeline("tiny.en").transcribe(audio, options))
    text = _norm(events[-1].text)
    assert text.count(OPENING) == 4, text
    assert text.count(CLOSING) == 4, text
    assert len(text.split()) == 4 * len(
        _norm(f"and so my fellow americans {OPENING} {CLOSING}").split()
    )
    segments = [e for e in events if isinstance(e, Segment)]
    assert [s.start for s in segments] == sorted(s.start for s in segments)


def test_a_window_cut_short_gets_the_rest_decoded(jfk) -> None:
    """One chunk of 44 s of speech (VAD that ends spans only at 10 s pauses): its first window
    ends inside the third copy; the next window starts at its last complete segment's end and
    decodes the rest, so the words past it are neither lost nor doubled."""
    audio = np.concatenate([jfk] * 4)
    vad = VadOptions(min_silence_duration_ms=10_000)
    options = _options(batch_size=2, vad_filter=True, vad_options=vad)
    assert len(_chunks(audio, options)) == 1
    events = list(pipeline("tiny.en").transcribe(audio, options))
    starts = [e for e in events if isinstance(e, WindowStart)]
    assert [w.window for w in starts] == [0, 1]
    first = [s for s in events if isinstance(s, Segment) and s.window == 0]
    assert starts[1].offset == pytest.approx(first[-1].end, abs=0.02)
    assert first[-1].end < 30.0
    text = _norm(events[-1].text)
    assert text.count(OPENING) == 4 and text.count(CLOSING) == 4, text


@pytest.mark.parametrize("long_chunks", [False, True])
def test_batched_equals_sequential_per_chunk(jfk, long_chunks) -> None:
    """jfk, a pause, then four copies with no gap: each chunk's windows decoded in a batch give
    the tokens of that chunk's audio transcribed alone, sequentially; with spans ended only by
    10 s pauses the second chunk is 44 s long and has windows after its first."""
    pause = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    audio = np.concatenate([jfk, pause, *[jfk] * 4])
    vad = VadOptions(min_silence_duration_ms=10_000) if long_chunks else None
    options = _options(batch_size=4, vad_filter=True, vad_options=vad)
    events = list(pipeline("tiny.en").transcribe(audio, options))
    batched = tokens_per_window(events)
    assert batched == _sequential_per_chunk(audio, options)
    n = len(_chunks(audio, options))
    assert (max(batched) >= n) == long_chunks  # a chunk's second window
    assert _norm(events[-1].text).count(CLOSING) == 5


def test_without_vad_each_chunk_is_sequential(jfk) -> None:
    audio = np.concatenate([jfk] * 4)
    options = _options(batch_size=3)
    events = list(pipeline("tiny.en").transcribe(audio, options))
    assert tokens_per_window(events) == _sequential_per_chunk(audio, options)


def test_quiet_cuts_fall_in_the_pause() -> None:
    """70 s of tone with a 0.2 s pause at 27 s and at 55 s: cut at each pause, the pieces at
    most 30 s, the whole audio covered."""
    t = np.arange(70 * SAMPLE_RATE) / SAMPLE_RATE
    audio = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    for at in (27.0, 55.0):
        audio[int(at * SAMPLE_RATE) : int((at + 0.2) * SAMPLE_RATE)] = 0.0
    cuts = quiet_cuts(audio)
    assert len(cuts) == 3 and cuts[-1] == len(audio)
    assert 27.0 <= cuts[0] / SAMPLE_RATE < 27.2 and 55.0 <= cuts[1] / SAMPLE_RATE < 55.2
    assert all(b - a <= 30 * SAMPLE_RATE for a, b in zip([0, *cuts], cuts, strict=False))
    pieces = windows_of(audio, None)
    assert [p.spans for p in pieces][0] == (SpeechSpan(0, cuts[0]),)
    assert quiet_cuts(audio[: 10 * SAMPLE_RATE]) == [10 * SAMPLE_RATE]
    assert quiet_cuts(audio[:0]) == []


def test_open_tail() -> None:
    """Text after a window's last timestamp pair is an open segment; a window that ends on a
    timestamp, or has no pair, has none (pure)."""
    ts, eot = 50364, 50256
    text = [400, 401]
    pieces, _, single = split_segments([ts, *text, ts + 50, ts + 50, 402], ts, 0.0, 3000)
    assert not single and open_tail([ts, *text, ts + 50, ts + 50, 402], pieces, eot)
    closed = [ts, *text, ts + 50, ts + 50, 402, ts + 90]
    pieces, _, single = split_segments(closed, ts, 0.0, 3000)
    assert single and not open_tail(closed, pieces, eot)
    pieces, _, _ = split_segments([ts, *text], ts, 0.0, 3000)
    assert not open_tail([ts, *text], pieces, eot)


def test_resume_point() -> None:
    """In joined speech, more than `after` seconds without a segment is skipped speech: between
    two segments, the later ones are dropped and the next window starts at the end of the one
    before the gap; after the last one of a window that ended on a single timestamp, the next
    starts at its end; otherwise all are kept and the window goes on from its end (pure)."""
    window_seek, end_seek, offset = 1000, 4000, 10.0  # a 30 s window from 10 s

    def point(pieces: list[Piece], single: bool = True) -> tuple[int, int]:
        return resume_point(pieces, end_seek, window_seek, offset, 2.0, single)

    early = [Piece(10.0, 12.0, ()), Piece(12.0, 14.56, ())]
    assert point(early) == (2, 1456)
    assert point(early, single=False) == (2, end_seek)  # open: the seek is the caller's
    assert point([Piece(10.0, 38.5, ())]) == (1, end_seek)  # 1.5 s left
    assert point([Piece(10.0, 10.0, ())]) == (1, end_seek)  # no progress: the window's end
    assert point([]) == (0, end_seek)
    jump = [Piece(10.0, 14.4, ()), Piece(35.0, 39.9, ())]  # 20 s passed over
    assert point(jump) == point(jump, single=False) == (1, 1440)
    assert point([Piece(10.0, 14.4, ()), Piece(15.9, 39.9, ())]) == (2, end_seek)  # 1.5 s
    assert point([Piece(16.0, 20.0, ()), Piece(20.0, 39.0, ())]) == (2, end_seek)  # at start


def test_a_chunk_window_that_stops_short_goes_on() -> None:
    """A chunk of the long-form set's no-gap file (clips and synthetic speakers with no gaps;
    spans at threshold 0.35) whose first window's decode ends at a timestamp seconds before its
    audio does: the reference rule jumps to the window's end and loses the speech after it;
    with resume_after a window from the last segment's end decodes it, and the segments before
    it are unchanged (nothing doubled)."""
    audio = long_form_file("no-gap").audio
    spans = detect_speech(audio, VadOptions(threshold=0.35, min_silence_duration_ms=160))
    at = 210 * SAMPLE_RATE
    chunk = next(c for c in windows_of(audio, spans) if c.spans[0].start <= at < c.spans[-1].end)
    speech = join_speech(audio, chunk.spans)
    ctx = pipeline("tiny.en").context

    def run(resume: float | None) -> list:
        with torch.inference_mode():
            return list(
                transcribe(ctx, speech, _options(), keep_open_tails=True, resume_after=resume)
            )

    plain, resumed = run(None), run(RESUME_AFTER)
    first = [e for e in plain if isinstance(e, Segment) and e.window == 0]
    assert first[-1].end < len(speech) / SAMPLE_RATE - RESUME_AFTER  # stopped short
    assert [e.offset for e in plain if isinstance(e, WindowStart)] == [0.0]
    starts = [e.offset for e in resumed if isinstance(e, WindowStart)]
    assert len(starts) >= 2 and starts[1] == pytest.approx(first[-1].end, abs=0.02)
    again = [e for e in resumed if isinstance(e, Segment) and e.window == 0]
    assert [s.tokens for s in again] == [s.tokens for s in first]
    lost = _norm(resumed[-1].text)[len(_norm(plain[-1].text)) :]
    assert len(lost.split()) >= 20, lost
    assert "teacher wrote a long list of words" in lost


def test_a_file_silero_is_unsure_of_keeps_its_speech() -> None:
    """The long-form set's telephone file (300-3400 Hz, mu-law, hiss): Silero's threshold 0.5
    keeps under a third of its loud 32 ms chunks; batched long-form's spans (the threshold
    calibrated to the file) keep nearly all; on the pauses file they are CHUNK_VAD's."""

    def loud_kept(audio: np.ndarray, spans: list[SpeechSpan]) -> float:
        frames = audio[: len(audio) // 512 * 512].reshape(-1, 512)  # [N, 512]
        loud = np.sqrt(np.square(frames).mean(axis=1)) > 0.01
        kept = np.zeros(len(loud), dtype=bool)
        for s in spans:
            kept[s.start // 512 : s.end // 512] = True
        return float((kept & loud).sum() / loud.sum())

    phone = long_form_file("phone").audio
    assert loud_kept(phone, detect_speech(phone, CHUNK_VAD)) < 1 / 3
    assert loud_kept(phone, chunk_spans(phone, None)) > 0.95
    pauses = long_form_file("pauses").audio
    assert chunk_spans(pauses, None) == detect_speech(pauses, CHUNK_VAD)


def test_a_chunk_window_that_passes_over_speech_goes_on_from_the_gap() -> None:
    """A chunk of 27 s of speech from the long-form set's Spanish file (base, language es) whose
    first window's timestamps jump over ~20 s of speech between two segments: the reference
    keeps both and goes on from the window's end; with resume_after the segments after the
    jump are dropped and the next window starts where the speech was passed over, so the
    sentences there are decoded."""
    audio = long_form_file("spanish").audio
    spans = detect_speech(audio, CHUNK_VAD)
    at = 41 * SAMPLE_RATE
    chunk = next(g for g in group_spans(spans, 27.0) if g[0].start <= at < g[-1].end)
    speech = join_speech(audio, chunk)
    ctx = pipeline("base").context
    options = _options(language="es")

    def run(resume: float | None) -> list:
        with torch.inference_mode():
            return list(transcribe(ctx, speech, options, keep_open_tails=True, resume_after=resume))

    plain, resumed = run(None), run(RESUME_AFTER)
    first = [e for e in plain if isinstance(e, Segment) and e.window == 0]
    gaps = [b.start - a.end for a, b in zip(first, first[1:], strict=False)]
    jump = next(i for i, g in enumerate(gaps) if g > RESUME_AFTER)  # passed over
    starts = [e.offset for e in resumed if isinstance(e, WindowStart)]
    assert starts[1] == pytest.approx(first[jump].end, abs=0.02)
    again = [e for e in resumed if isinstance(e, Segment) and e.window == 0]
    assert [s.tokens for s in again] == [s.tokens for s in first[: jump + 1]]
    assert len(_norm(resumed[-1].text).split()) >= len(_norm(plain[-1].text).split()) + 20


def test_a_chunk_tail_shorter_than_min_tail_is_not_decoded() -> None:
    """A chunk of the long-form set's no-gap file whose first window's decode ends a few
    hundredths of a second before the chunk does: the reference decodes that tail in a window
    of its own (an encoder pass, no text); with min_tail it is left, the text the same."""
    audio = long_form_file("no-gap").audio
    at = 40 * SAMPLE_RATE
    chunk = [c for c in _chunks(audio, _options(vad_filter=True)) if c.spans[0].start <= at][-1]
    speech = join_speech(audio, chunk.spans)
    ctx = pipeline("tiny.en").context

    def run(min_tail: float) -> list:
        with torch.inference_mode():
            events = transcribe(
                ctx,
                speech,
                _options(),
                keep_open_tails=True,
                resume_after=RESUME_AFTER,
                min_tail=min_tail,
            )
            return list(events)

    plain, short = run(0.0), run(MIN_TAIL)
    starts = [e.offset for e in plain if isinstance(e, WindowStart)]
    assert len(starts) == 2 and len(speech) / SAMPLE_RATE - starts[1] < MIN_TAIL
    assert [e.offset for e in short if isinstance(e, WindowStart)] == [0.0]
    assert short[-1].text == plain[-1].text
