"""The exact compute paths are exact beyond jfk and multilingual: `int8-logits` against
`fp32` on speech generated with variety (benchmarks/synth.py: leading silence, several
espeak-ng voices and languages, a telephone band, speed changes, noise, long pauses, two
windows): the same tokens and the same word times. (bf16-encoder's differences are measured,
not asserted: benchmarks/approx.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.synth import varied_clip
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript
from xattn.model.net.logits import int8_supported
from xattn.model.pipeline import load_pipeline


def transcribe(compute: str, audio: np.ndarray) -> tuple[list[int], list[tuple], str]:
    tokens, words, text = [], [], ""
    options = DecodeOptions(word_timestamps=True)
    for event in load_pipeline("tiny.en", compute=compute).transcribe(audio, options):
        if isinstance(event, TokenEvent):
            tokens.append(event.id)
        elif isinstance(event, Transcript):
            words = [(w.word, w.start, w.end) for s in event.segments for w in s.words]
            text = event.text
    return tokens, words, text


@pytest.mark.skipif(not int8_supported(), reason="this torch has no fbgemm int8 kernels")
@pytest.mark.requires_tool("espeak-ng", "sox")  # benchmarks/synth.py
def test_int8_logits_is_exact_on_varied_speech() -> None:
    audio = varied_clip()
    assert len(audio) > 50 * 16000  # two windows
    exact = transcribe("fp32", audio)
    assert len(exact[1]) > 30, exact[2]  # it heard the speech
    assert transcribe("int8-logits", audio) == exact
