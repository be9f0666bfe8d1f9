"""StreamingRecognize on the event loop: audio in as it arrives, the live policy off the loop.

A reader task takes the requests as they come (any message resets the idle clock) and turns
their audio into samples, pending. The step loop hands all the pending audio to one
`LiveTranscriber.feed` on the engine's live pool whenever no step is running, so audio that
arrives during a step is fed together at the next one: the policy's step grows with the
load instead of a queue of steps growing. Steps run in rounds with the model's other live
streams (xattn.service.engine.live_rounds: who goes next). The step takes the audio once its
turn on the model thread has come (`feed_in_turn`): behind other work it decodes what arrived
while it waited, not what was there when it was queued. Pending audio is bounded by the
stream's limit of seconds; one feed takes only what fits the policy's 30 s window (at least
MIN_FEED_SECONDS), so a burst never pushes audio past the window before the buffer slides.

Half-close: the pending audio is fed, `finish()` decodes the rest, every final is sent,
then `done`, and the stream ends OK. A client cancel (or deadline, or shutdown) cancels the
step loop; a step already running ends on its own (one decode) and no other starts. The
admission slot is released when the last step is over.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial

import numpy as np

from xattn.model.audio.features import (
    MAX_CHANNELS,
    SAMPLE_RATE,
    AudioError,
    AudioTooLongError,
    pcm_to_audio,
)
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions, LiveResult
from xattn.model.live.vad_stream import SpeechEvent
from xattn.service.engine import convert, convert_live
from xattn.service.engine.engine import Engine, LiveSlot
from xattn.service.engine.limits import Limits, live_defaults
from xattn.service.engine.live_rounds import LiveRounds, Ticket
from xattn.service.engine.rows import RowSpec, row_spec
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

WINDOW_SECONDS = 29.5  # what one feed may fill the policy's buffer to (its window is 30 s)
MIN_FEED_SECONDS = 1.0  # ... but at least this much is fed per step
Requests = AsyncIterator[pb.StreamingRecognizeRequest]
Response = pb.StreamingRecognizeResponse
Steps = list[Response]


class StreamOrderError(ValueError):
    """The requests are not a config followed by audio (INVALID_ARGUMENT)."""


class IdleTimeout(TimeoutError):
    """The client sent nothing for longer than the idle timeout (DEADLINE_EXCEEDED)."""


@dataclass(frozen=True)
class LivePcm:
    """The raw format of a live stream's audio_content."""

    encoding: str  # "int16" or "float32"
    channels: int

    @property
    def frame_bytes(self) -> int:
        return (2 if self.encoding == "int16" else 4) * self.channels

    def samples(self, data: bytes) -> np.ndarray:
        """One audio_content -> 16 kHz mono float32 (AudioError: not whole frames, NaN)."""
        if len(data) % self.frame_bytes:
            raise AudioError(
                f"audio_content of {len(data)} bytes is not whole samples: {self.encoding} x "
                f"{self.channels} channel(s) takes {self.frame_bytes} bytes per sample"
            )
        if not data:
            return np.zeros(0, np.float32)
        return pcm_to_audio(data, SAMPLE_RATE, self.encoding, self.channels)


def live_pcm(config: pb.StreamingRecognitionConfig) -> LivePcm:
    """The config's audio format (AudioError for one the server does not take)."""
    if config.encoding not in convert.PCM_ENCODINGS:
        raise AudioError("config.encoding must be PCM_ENCODING_INT16 or PCM_ENCODING_FLOAT32")
    if config.sample_rate != SAMPLE_RATE:
        raise AudioError(
            f"config.sample_rate must be {SAMPLE_RATE} Hz (live audio is not resampled), "
            f"not {config.sample_rate}"
        )
    channels = config.channels or 1
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"config.channels must be 1..{MAX_CHANNELS}, not {config.channels}")
    return LivePcm(convert.PCM_ENCODINGS[config.encoding], channels)


@dataclass(frozen=True)
class LiveSettings:
    """The server's side of a live stream."""

    idle_timeout: float = 10.0  # seconds without a message
    max_seconds: float = 1800.0  # seconds of audio
    defaults: LiveOptions = LiveOptions()


def live_settings(limits: Limits) -> LiveSettings:
    """The live settings of a server with these limits."""
    defaults = live_defaults(limits)
    return LiveSettings(limits.live_idle_timeout, limits.max_live_seconds, defaults)


@dataclass
class _Shaped:
    """What the steps produced so far (touched by one step at a time, on the live pool)."""

    rows: RowSpec
    interim: bool
    tokens: int = 0  # final tokens sent
    finals: int = 0
    text: str = ""

    def __call__(self, results: list[LiveResult | SpeechEvent]) -> list[Response]:
        out = []
        for r in results:
            if isinstance(r, SpeechEvent):
                out.append(convert_live.speech_event(r))
            elif r.is_final or self.interim:
                out.append(convert_live.live_result(r, self.tokens, self.rows))
            if isinstance(r, LiveResult) and r.is_final:
                self.tokens += len(r.tokens)
                self.finals += 1
                self.text += r.text
        return out


def _room(live: LiveTranscriber) -> float:
    """Seconds one feed may still add to the policy's buffer (WINDOW_SECONDS in all)."""
    return WINDOW_SECONDS - (live.samples - live.offset) / SAMPLE_RATE


class LiveSession:
    """One StreamingRecognize call: `async for response in session.responses(): ...`."""

    def __init__(self, engine: Engine, settings: LiveSettings, requests: Requests) -> None:
        self._engine = engine
        self._settings = settings
        self._requests = requests
        self._pending: list[np.ndarray] = []  # read by a step on the live pool: under _lock
        self._lock = threading.Lock()
        self._received = 0  # samples
        self._ended = False  # the client half-closed
        self._error: BaseException | None = None
        self._wake = asyncio.Event()
        self._ticket: Ticket[list[Response]] | None = None  # the last step asked for
        self._rounds: LiveRounds | None = None  # the model's (known from the config)
        self.arrived = time.perf_counter()

    async def _next(self) -> pb.StreamingRecognizeRequest | None:
        """The next request; None at half-close; IdleTimeout when none comes in time."""
        timeout = self._settings.idle_timeout
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                return await anext(self._requests, None)
        except TimeoutError:
            raise IdleTimeout(
                f"live stream idle: no message for {timeout:g} s (send audio at least every "
                f"{timeout:g} s, or half-close to end the stream)"
            ) from None

    async def _config(self) -> pb.StreamingRecognitionConfig:
        first = await self._next()
        if first is None:
            raise StreamOrderError("the stream ended before its first message (the config)")
        if first.WhichOneof("streaming_request") != "config":
            raise StreamOrderError("the first StreamingRecognizeRequest must carry `config`")
        return first.config

    async def _read(self, pcm: LivePcm) -> None:
        """Requests -> pending samples, until half-close or an error (kept for the loop)."""
        limit = self._settings.max_seconds
        try:
            while (request := await self._next()) is not None:
                kind = request.WhichOneof("streaming_request")
                if kind == "config":
                    raise StreamOrderError("only the first message may carry `config`")
                if kind != "audio_content":
                    raise StreamOrderError("a StreamingRecognizeRequest must carry audio_content")
                samples = pcm.samples(request.audio_content)
                self._received += len(samples)
                if self._received > limit * SAMPLE_RATE:
                    raise AudioTooLongError(
                        f"live stream too long: over {limit:g} s of audio (the server's limit)"
                    )
                if len(samples):
                    with self._lock:
                        self._pending.append(samples)
                    self._wake.set()
            self._ended = True
        except Exception as e:
            self._error = e
        finally:
            self._wake.set()

    def _take(self, live: LiveTranscriber) -> np.ndarray:
        """The pending audio that fits the policy's window, in order; the rest stays. Called
        by the step (on the live pool) once its turn on the model thread has come."""
        with self._lock:
            audio = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
            n = int(max(MIN_FEED_SECONDS, _room(live)) * SAMPLE_RATE)
            self._pending = [audio[n:]] if len(audio) > n else []
        return audio[:n]

    def _last(self, live: LiveTranscriber) -> bool:
        """Whether the pending audio is the stream's last and the finish takes it: half-closed,
        no vad, and at most MIN_FEED_SECONDS (what came during the step that ran when the
        stream ended: no step of its own; more, from a client that sends faster than the steps
        run, gets its steps) that fit the window."""
        if not self._ended or live.vad is not None:
            return False
        return self._pending_seconds() <= min(MIN_FEED_SECONDS, _room(live))

    def _pending_seconds(self) -> float:
        with self._lock:
            return sum(len(a) for a in self._pending) / SAMPLE_RATE

    def _need(self, live: LiveTranscriber) -> float:
        """What orders a round's steps: the policy's urgency (audio it has not decoded, and
        whether words wait undecided) plus the audio still pending here."""
        return live.urgency + self._pending_seconds()

    async def _run(self, step: Callable[[], Steps], live: LiveTranscriber) -> Steps:
        """One step in the next round of the model's live steps (live_rounds)."""
        context = contextvars.copy_context()  # the stream's (its span: the step's parent)
        self._ticket = Ticket(self, partial(self._need, live), partial(context.run, step))
        assert self._rounds is not None
        return await self._rounds.step(self._ticket)

    def _watched(
        self, live: LiveTranscriber, model: str, feed: Callable[[], list[LiveResult | SpeechEvent]]
    ) -> list[LiveResult | SpeechEvent]:
        """One step's `feed()` on the live pool, in a span; its audio, decodes, spared decodes
        and finals reported (each final's lag: the audio received past its end)."""
        o, stats = self._engine.observer, live.stats
        samples, decodes, spared = live.samples, stats.steps, stats.skipped_steps
        with o.span("xattn.live_step") as span:
            results = feed()
            audio, decodes = (live.samples - samples) / SAMPLE_RATE, stats.steps - decodes
            span.set("audio_seconds", audio)
            span.set("decodes", decodes)
        o.live_step(model, audio, decodes, stats.skipped_steps - spared)
        for r in results:
            if isinstance(r, LiveResult) and r.is_final and r.tokens:
                end = r.words[-1].end if r.words else max(t.peak_time for t in r.tokens)
                o.live_final(model, max(0.0, self._received / SAMPLE_RATE - end))
                for _ in r.tokens:
                    o.token(model)
        return results

    async def responses(self) -> AsyncIterator[Response]:
        """The results as they are decided, then `done`; raises the stream's error."""
        async with aclosing(self.steps()) as steps:
            async for step in steps:
                for response in step:
                    yield response

    async def steps(self) -> AsyncIterator[list[Response]]:
        """`responses()` a decode step at a time: each step's results and speech events as
        one list (a speech end and the finals it commits come in one), the last with `done`."""
        config = await self._config()
        engine = self._engine
        pipe = engine.pipeline_for(config.model)  # "" = the first; unknown: INVALID_ARGUMENT
        pcm = live_pcm(config)
        options = convert_live.live_options(config, self._settings.defaults)
        pipe.validate(DecodeOptions(language=options.language))
        mean = pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
        rows = row_spec(config.alignment, mean, pipe.dims, pipe.alignment_heads)
        slot = engine.admit_live(pipe.name)
        rounds = self._rounds = engine.live_rounds(pipe.name)
        outcome = "failed"
        live = LiveTranscriber(pipe.context, pipe.alignment_heads, options)
        shaped = _Shaped(rows, config.interim_results)
        feed = partial(live.feed_in_turn, partial(self._take, live))
        step = partial(self._watched, live, pipe.name, feed)
        reader = asyncio.create_task(self._read(pcm), name="xattn-live-reader")
        try:
            while True:
                rounds.idle(self)  # no audio now: the next round need not wait for it
                await self._wake.wait()
                self._wake.clear()
                while self._pending and self._error is None and not self._last(live):
                    yield await self._run(lambda: shaped(step()), live)
                if self._error is not None:
                    raise self._error
                if self._ended or live.over:  # half-closed, or single_utterance over
                    break
            tail = None if live.vad is not None else partial(self._take, live)
            finish = partial(self._watched, live, pipe.name, partial(live.finish, tail))
            last = await self._run(lambda: shaped(finish()), live)
            stats = live.stats
            last.append(
                Response(
                    done=pb.StreamingRecognizeDone(
                        text=shaped.text,
                        language=live.language or "",
                        audio_seconds=self._received / SAMPLE_RATE,
                        final_results=shaped.finals,
                        tokens=shaped.tokens,
                        decode_steps=stats.steps,
                        encode_seconds=stats.encode_seconds,
                        compute_seconds=stats.step_seconds,
                        total_seconds=time.perf_counter() - self.arrived,
                        speech_seconds=live.vad.speech_seconds if live.vad else 0.0,
                        skipped_decode_steps=stats.skipped_steps,
                        encoder_frames=stats.encoder_frames,
                        decoder_steps=stats.decoder_steps,
                    )
                )
            )
            outcome = "finished"  # every step is over: the slot is free before `done` goes
            self._release(slot, outcome)  # (a client that opens its next stream on `done`)
            yield last
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        except (AudioError, OptionsError, StreamOrderError, IdleTimeout):
            outcome = "invalid"
            raise
        finally:
            reader.cancel()
            rounds.idle(self)
            self._release(slot, outcome)

    def _release(self, slot: LiveSlot, outcome: str) -> None:
        """Free the slot now, or when the step still running on the pool is over."""
        step = self._ticket.future if self._ticket is not None else None
        if step is None or step.done() or step.cancel():
            slot.release(outcome)
        else:
            step.add_done_callback(lambda _: slot.release(outcome))
        log.debug("live stream %s after %.1f s of audio", outcome, self._received / SAMPLE_RATE)
