"""Batching changes no live result: a stream stepped at the same audio positions gets the same
finals alone and beside seven other streams whose decoder steps share its batches."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
from openai_ref import pipeline

from xattn.model.audio.features import SAMPLE_RATE, decode_audio
from xattn.model.decode.step_batcher import StepBatcher
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions
from xattn.model.pipeline import CpuCapability

JFK = Path(__file__).resolve().parents[2] / "shared" / "audio" / "jfk.flac"
STREAMS = 8


def finals(pipe, audio: np.ndarray, options: LiveOptions) -> list[tuple[int, ...]]:
    """The final results' tokens of `audio` fed in 1 s messages (the same step positions)."""
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
    out = []
    for at in range(0, len(audio), SAMPLE_RATE):
        out += [r for r in live.feed(audio[at : at + SAMPLE_RATE]) if r.is_final]
    return [tuple(t.id for t in r.tokens) for r in out + live.finish()]


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_same_finals_alone_and_beside_seven_others(precision: str | None) -> None:
    if precision == "bf16" and not CpuCapability.detect().bf16:
        pytest.skip("this CPU has no native bf16 (AVX-512 BF16, AMX)")
    pipe = pipeline("tiny.en")
    options = LiveOptions(precision=precision)
    jfk = decode_audio(str(JFK))
    audios = [np.roll(jfk, k * 2 * SAMPLE_RATE) for k in range(STREAMS)]  # stream 0: jfk itself
    batcher = StepBatcher(pipe.model, linger=0.02)
    shared = dataclasses.replace(pipe, context=dataclasses.replace(pipe.context, batcher=batcher))
    alone = finals(shared, audios[0], options)
    out: list = [None] * STREAMS
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = finals(shared, audios[i], options)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(STREAMS)]
    batches_before = batcher.stats.batches
    steps_before = batcher.stats.steps
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    batcher.close()
    assert not errors, errors
    assert out[0] == alone and alone
    steps = batcher.stats.steps - steps_before
    assert steps > batcher.stats.batches - batches_before  # some steps shared a forward
