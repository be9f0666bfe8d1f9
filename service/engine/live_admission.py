"""How many live streams a model holds at the server's lag target, and the refusal beyond.

A live stream steps in rounds with the model's other streams (xattn.service.engine.live_rounds):
a round costs about one step per stream (the encoder passes run one after another; the
decoder steps share batches, which this ignores: the bound errs low), and a word waits about
one round once it is heard. So a model holds `lag_target / step` streams, with `step` the
seconds of one live step measured at start-up (`measure_step`, after the warm-up, before the
model serves): the real LiveTranscriber over CALIBRATION_SECONDS of speech (the policy's
buffer half full; a short window's whole buffer), after one untimed step, the median of
three. The speech is the repository's samples/hello.wav
(synthesized, looped) where it is installed, so the step decodes words; elsewhere generated
voiced audio, which decodes to few tokens or none (the timing is then mostly the encoder's).
`--max-live-streams N` gives the number instead.

The next stream beyond it is refused (`refusal`: the engine raises Overloaded, reason
`live_full`, which every face maps through service.engine.errors) instead of every stream
falling behind; the retry hint is RETRY_SECONDS, since a slot frees only when a stream ends.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xattn.model.audio.features import SAMPLE_RATE, AudioError, decode_audio
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions
from xattn.model.pipeline import Pipeline

log = logging.getLogger(__name__)

CALIBRATION_SECONDS = 12.0  # buffered audio of the timed step: about half the policy's 25 s
RETRY_SECONDS = 5.0  # the hint to a refused stream
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "hello.wav"  # 8.6 s of speech
UNMEASURED = 8  # the capacity of a model loaded without a warm-up (nothing timed)


@dataclass(frozen=True)
class Refusal:
    """Why a live stream is refused, and when to try again."""

    why: str
    retry_seconds: float


def voiced_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Speech-like generated audio (16 kHz float32): a gliding 100-180 Hz voice with a few
    formant-like harmonics, in syllables of about 0.2 s, with a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE  # [samples]
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)  # [samples]
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE  # [samples]
    voice = sum(np.sin(k * phase) / k for k in (1, 2, 3, 5, 8, 13))  # [samples]
    syllables = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 0.5  # [samples]
    audio = 0.1 * voice * syllables + 0.003 * rng.standard_normal(len(t))  # [samples]
    return audio.astype(np.float32)


def calibration_audio(seconds: float = CALIBRATION_SECONDS) -> np.ndarray:
    """`seconds` of SAMPLE looped (16 kHz float32), else of `voiced_audio`."""
    try:
        speech = decode_audio(SAMPLE)
    except (OSError, AudioError):
        return voiced_audio(seconds)
    n = int(seconds * SAMPLE_RATE)
    return np.resize(speech, n).astype(np.float32) if len(speech) else voiced_audio(seconds)


def measure_step(
    pipe: Pipeline, options: LiveOptions, seconds: float = CALIBRATION_SECONDS, times: int = 3
) -> float:
    """Wall-clock seconds of one live step with these options (the server's defaults: the
    encoder's precision, the window, the beams) over `seconds` of buffered audio, after an
    untimed step over all but the last second: the median of `times` such steps (one step is
    0.1-0.3 s on a small CPU, where a moment's other work moves a single timing by a stream of
    capacity). On the model thread of the pipeline's batcher if it has one, else on the
    caller's: blocking."""
    audio = calibration_audio(seconds)
    split = max(0, len(audio) - SAMPLE_RATE)
    timed = []
    for _ in range(times):
        live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
        live.feed_in_turn(lambda: audio[:split])
        before = live.stats.step_seconds
        live.feed_in_turn(lambda: audio[split:])
        timed.append(live.stats.step_seconds - before)
    return statistics.median(timed)


def streams_for(lag_target: float, step_seconds: float) -> int:
    """Live streams whose rounds fit the lag target (at least 1)."""
    if step_seconds <= 0:
        return 1
    return max(1, math.floor(lag_target / step_seconds))


class LiveAdmission:
    """One model's live capacity: given (`max_streams` > 0), or sized from a live step's
    measured seconds (`measure_step`); neither: UNMEASURED streams."""

    def __init__(
        self, model: str, lag_target: float, max_streams: int = 0, step_seconds: float = 0.0
    ) -> None:
        self.model, self.lag_target, self.step_seconds = model, lag_target, step_seconds
        if max_streams > 0:
            self.max_streams = max_streams
        elif step_seconds > 0:
            self.max_streams = streams_for(lag_target, step_seconds)
            log.info(
                "model %s: %d live streams at a lag target of %g s (a live step over %g s of "
                "audio took %.3f s)",
                *(model, self.max_streams, lag_target, CALIBRATION_SECONDS, step_seconds),
            )
        else:
            self.max_streams = UNMEASURED

    def refusal(self, live_now: int) -> Refusal | None:
        """Why one more live stream beside `live_now` is refused (None: admitted)."""
        if live_now < self.max_streams:
            return None
        target = f"{self.lag_target:g} s"
        return Refusal(
            f"{live_now} live streams of {self.model} already (its capacity at the {target} lag "
            "target on this machine)",
            RETRY_SECONDS,
        )
