"""OpenAI's Realtime transcription session over a WebSocket, on the live StreamingRecognize.

`/v1/realtime?intent=transcription`: the client sends `session.update` (or the beta
`transcription_session.update`) and `input_audio_buffer.append` / `.commit` / `.clear`; the
server answers with the events OpenAI's Realtime API defines (docs/realtime.md). Each stretch
of audio between commits (or clears) is one `LiveSession`, fed from a queue with the same
requests a gRPC client sends, so admission, limits, the idle timeout and cancellation are the
gRPC stream's. PCM16 at 24 kHz is resampled to 16 kHz as it arrives (`xattn.model.audio.resample`).

Turns: with `server_vad` (the default) the stream runs our Silero VAD and a turn is a speech
(speech_started .. speech_stopped, committed at its end, as the live policy commits an
utterance); with `turn_detection: null` a turn is the audio between two commits. The live
policy's finals (decided while the person still speaks, never revised) are the `delta`s of
their turn's item; `completed` carries their concatenation. Rows: `xattn.attention`, opt-in.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from xattn.model.audio import SAMPLE_RATE
from xattn.model.audio.resample import StreamResampler
from xattn.service.engine.engine import Engine
from xattn.service.engine.errors import ClientTimeout, MalformedMessage, fault_of
from xattn.service.engine.live import LiveSession, LiveSettings
from xattn.service.http.realtime_session import (
    EventError,
    SessionConfig,
    initial_config,
    session_json,
    update_config,
)
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

INPUT_RATE = 24000  # OpenAI's audio/pcm (pcm16): 24 kHz mono little-endian int16
FRAMES_PER_SECOND = 50  # encoder frames per second of audio (a row's columns)
Response = pb.StreamingRecognizeResponse
BEGIN_TYPE = pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN
END_TYPE = pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class _Item:
    """One conversation item: a turn's transcription."""

    id: str
    start_ms: int
    text: str = ""
    stopped: bool = False  # speech_stopped / committed sent
    logprobs: list[dict] = field(default_factory=list)


class _Turns:
    """One LiveSession: the audio between commits or clears, and the items it holds."""

    def __init__(self, rt: Realtime, config: SessionConfig, base_ms: int) -> None:
        self.rt, self.config, self.base_ms = rt, config, base_ms
        self.resampler = StreamResampler(INPUT_RATE)
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.samples = 0  # 16 kHz samples queued
        self.item: _Item | None = None if config.vad else _Item(_id("item"), base_ms)
        self.committed = False  # half-closed
        self.dropped = False  # cleared (or the socket closed): it sends nothing more
        self.task = asyncio.create_task(self._run(), name="xattn-realtime-turns")

    def append(self, pcm16: bytes) -> None:
        x = np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768.0
        self._put(self.resampler.feed(x))

    def commit(self) -> None:
        self._put(self.resampler.flush())
        self.queue.put_nowait(None)
        self.committed = True

    def drop(self) -> None:
        """End the stream and send nothing more of it (half-closed too, so that it ends
        even where the cancellation comes while a step is handed over)."""
        self.dropped = True
        self.queue.put_nowait(None)
        self.task.cancel()

    async def _send(self, kind: str, **fields: object) -> None:
        if not self.dropped:
            await self.rt.send(kind, **fields)

    def _put(self, y: np.ndarray) -> None:
        if len(y):
            self.samples += len(y)
            self.queue.put_nowait(np.clip(y, -1.0, 1.0).astype("<f4").tobytes())

    def _ms(self, seconds: float) -> int:
        return self.base_ms + int(round(seconds * 1000))

    async def _requests(self) -> AsyncIterator[pb.StreamingRecognizeRequest]:
        yield pb.StreamingRecognizeRequest(config=self.config.live_config())
        while (audio := await self.queue.get()) is not None:
            yield pb.StreamingRecognizeRequest(audio_content=audio)

    async def _run(self) -> None:
        session = LiveSession(self.rt.engine, self.rt.settings, self._requests())
        try:
            async with contextlib.aclosing(session.steps()) as steps:
                async for step in steps:  # the last: the finish's responses and done
                    await self._step(step)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the stream's error ends this stretch of audio, not the session
            if not self.dropped:
                await self.rt.send_error(EventError.of(e))
        finally:
            if self.rt.turns is self:  # appends after an error start a new stream
                self.rt.turns = None

    async def _step(self, responses: list[Response]) -> None:
        """One decode step's responses -> events. A speech end the model committed on is the
        step's last speech event; an end followed by a new beginning was a pause."""
        speech = [r.speech_event.type for r in responses if r.HasField("speech_event")]
        last_end = len(speech) - 1 if speech and speech[-1] == END_TYPE else -1
        seen = -1
        for r in responses:
            if r.HasField("speech_event"):
                seen += 1
                e = r.speech_event
                if e.type == BEGIN_TYPE and self.item is None:
                    self.item = _Item(_id("item"), self._ms(e.time))
                    await self._send(
                        "input_audio_buffer.speech_started",
                        audio_start_ms=self.item.start_ms,
                        item_id=self.item.id,
                    )
                elif e.type == END_TYPE and seen == last_end and self.item is not None:
                    await self._send(
                        "input_audio_buffer.speech_stopped",
                        audio_end_ms=self._ms(e.time),
                        item_id=self.item.id,
                    )
                    await self.commit_item(self.item)
            elif r.HasField("result") and r.result.is_final:
                if self.item is None:  # a final outside a speech (not expected): its own item
                    self.item = _Item(_id("item"), self._ms(r.result.buffer_offset))
                await self._delta(self.item, r.result)
            elif r.HasField("done"):
                if self.item is not None:
                    await self.commit_item(self.item)
                    await self._completed(self.item, r.done.audio_seconds)
                    self.item = None
        if self.item is not None and self.item.stopped and not self.committed:
            await self._completed(self.item, self.samples / SAMPLE_RATE)
            self.item = None

    async def commit_item(self, item: _Item) -> None:
        if not item.stopped:
            item.stopped = True
            await self._send(
                "input_audio_buffer.committed",
                item_id=item.id,
                previous_item_id=self.rt.take_previous(item.id),
            )

    async def _delta(self, item: _Item, result: pb.StreamingRecognitionResult) -> None:
        delta = result.text if item.text else result.text.lstrip()
        logprobs = [
            {"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode("utf-8"))}
            for t in result.tokens
        ]
        item.logprobs.extend(logprobs)
        extra = {"logprobs": logprobs} if self.config.logprobs else {}
        if delta:
            item.text += delta
            await self._send(
                "conversation.item.input_audio_transcription.delta",
                item_id=item.id,
                content_index=0,
                delta=delta,
                **extra,
            )
        if self.config.attention and result.tokens:
            await self._send("xattn.attention", **attention(item.id, result, self.base_ms))

    async def _completed(self, item: _Item, audio_seconds: float) -> None:
        seconds = max(0.0, audio_seconds - (item.start_ms - self.base_ms) / 1000)
        extra = {"logprobs": item.logprobs} if self.config.logprobs else {}
        await self._send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item.id,
            content_index=0,
            transcript=item.text,
            usage={"type": "duration", "seconds": round(seconds, 3)},
            **extra,
        )


def attention(item_id: str, result: pb.StreamingRecognitionResult, base_ms: int) -> dict:
    """The `xattn.attention` event's fields: the rows of one delta's tokens, stacked as
    [n_tokens, n_rows, 1500] little-endian float16 (or float32), base64."""
    rows = [t.alignment for t in result.tokens]
    data = b"".join(r.data for r in rows)
    return {
        "item_id": item_id,
        "content_index": 0,
        "token_ids": [t.id for t in result.tokens],
        "tokens": [t.text for t in result.tokens],
        "peak_ms": [base_ms + int(round(t.peak_time * 1000)) for t in result.tokens],
        "window_start_ms": base_ms + int(round(result.buffer_offset * 1000)),
        "frames_per_second": FRAMES_PER_SECOND,
        "shape": [len(rows), *rows[0].shape],
        "dtype": "float16" if rows[0].data_type == pb.DATA_TYPE_FLOAT16 else "float32",
        "data": base64.b64encode(data).decode("ascii"),
    }


class Realtime:
    """One WebSocket's session: its config, the current stretch of audio, the items."""

    def __init__(
        self, websocket: WebSocket, engine: Engine, settings: LiveSettings, idle_seconds: float
    ) -> None:
        self.ws, self.engine, self.settings = websocket, engine, settings
        self.idle_seconds = idle_seconds  # no event for this long: closed (ClientTimeout)
        self.beta = websocket.headers.get("openai-beta", "").startswith("realtime")
        self.id = _id("sess")
        self.config = SessionConfig()
        self.turns: _Turns | None = None
        self.finishing: set[_Turns] = set()  # committed stretches still decoding
        self.audio_ms = 0.0  # all audio appended so far (the clock of audio_start_ms)
        self.previous: str | None = None  # the last committed item
        self._lock = asyncio.Lock()

    async def send(self, kind: str, **fields: object) -> None:
        async with self._lock:
            await self.ws.send_text(json.dumps({"type": kind, "event_id": _id("event"), **fields}))

    async def send_error(self, e: EventError, event_id: str | None = None) -> None:
        await self.send("error", error={**e.fields(), "event_id": event_id})

    def take_previous(self, item_id: str) -> str | None:
        previous, self.previous = self.previous, item_id
        return previous

    async def run(self) -> None:
        await self.ws.accept()
        query = self.ws.query_params
        try:
            self.config = initial_config(
                self.engine, query.get("model", ""), "attention" in query.getlist("include")
            )
        except EventError as e:
            await self.send_error(e)
            self.config = initial_config(self.engine, "", "attention" in query.getlist("include"))
        created = "transcription_session.created" if self.beta else "session.created"
        await self.send(created, session=session_json(self.config, self.id, self.beta))
        try:
            while (text := await self._receive()) is not None:
                await self._event(text)
        except WebSocketDisconnect:
            log.debug("realtime: %s hung up", self.id)
        except (MalformedMessage, ClientTimeout) as e:
            await self._refuse(e)
        finally:
            turns = [t for t in (self.turns, *self.finishing) if t is not None]
            for t in turns:
                t.drop()
            await asyncio.gather(*(t.task for t in turns), return_exceptions=True)

    async def _receive(self) -> str | None:
        """The next event's text; None once the client closed the socket. A binary frame
        is MalformedMessage, no event within the idle timeout ClientTimeout."""
        try:
            async with asyncio.timeout(self.idle_seconds):  # (wait_for may lose a cancel)
                message = await self.ws.receive()
        except TimeoutError:
            raise ClientTimeout(
                f"no event for {self.idle_seconds:g} s: the session is closed"
            ) from None
        if message["type"] == "websocket.disconnect":
            log.debug("realtime: %s closed by the client", self.id)
            return None
        if message.get("text") is not None:
            return str(message["text"])
        raise MalformedMessage(
            "a binary frame: events are JSON text frames (audio goes base64 in "
            "input_audio_buffer.append)"
        )

    async def _refuse(self, e: MalformedMessage | ClientTimeout) -> None:
        """The error event of the errors table's row, then a close frame (1003: data this
        server does not take; 1008: a timeout, the server's policy)."""
        fault = fault_of(e)
        assert fault is not None
        log.info("realtime: %s: %s", self.id, e)
        code = 1003 if isinstance(e, MalformedMessage) else 1008
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.send_error(EventError(fault.code, str(e), None, fault.kind))
            await self.ws.close(code=code, reason=fault.code)

    async def _event(self, text: str) -> None:
        event_id = None
        try:
            try:
                event = json.loads(text)
            except ValueError:
                raise EventError("invalid_json", "the event is not JSON") from None
            if not isinstance(event, dict):
                raise EventError("invalid_event", "an event is a JSON object")
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            kind = event.get("type")
            handler = self._handlers().get(kind) if isinstance(kind, str) else None
            if handler is None:
                raise EventError("unknown_event_type", f"unknown event type {kind!r}", "type")
            await handler(event)
        except EventError as e:
            await self.send_error(e, event_id)

    def _handlers(self) -> dict[str, Callable[[dict], object]]:
        return {
            "session.update": self._update,
            "transcription_session.update": self._update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit,
            "input_audio_buffer.clear": self._clear,
        }

    async def _update(self, event: dict) -> None:
        beta = event["type"] == "transcription_session.update"
        self.config = update_config(self.engine, self.config, event.get("session"), beta)
        kind = "transcription_session.updated" if beta else "session.updated"
        await self.send(kind, session=session_json(self.config, self.id, beta))

    async def _append(self, event: dict) -> None:
        audio = event.get("audio")
        try:
            data = base64.b64decode(audio, validate=True) if isinstance(audio, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None:
            raise EventError("invalid_value", "audio must be base64 PCM16 (a string)", "audio")
        if len(data) % 2:
            raise EventError(
                "invalid_value", f"audio of {len(data)} bytes is not whole 16-bit samples", "audio"
            )
        if not data:
            return
        if self.turns is None:
            self.turns = _Turns(self, self.config, int(self.audio_ms))
        self.audio_ms += len(data) / 2 / INPUT_RATE * 1000
        self.turns.append(data)

    async def _commit(self, event: dict) -> None:
        turns = self.turns
        if turns is None or (turns.config.vad and turns.item is None):
            raise EventError(
                "input_audio_buffer_commit_empty",
                "buffer is empty: no audio (or, with server_vad, no speech) since the last commit",
            )
        self.turns = None
        item = turns.item
        if item is not None:
            await turns.commit_item(item)
        turns.commit()
        self.finishing.add(turns)
        turns.task.add_done_callback(lambda _: self.finishing.discard(turns))

    async def _clear(self, event: dict) -> None:
        turns, self.turns = self.turns, None
        if turns is not None:
            turns.drop()
        await self.send("input_audio_buffer.cleared")


async def realtime_session(
    websocket: WebSocket, engine: Engine, settings: LiveSettings, idle_seconds: float = 75.0
) -> None:
    """One /v1/realtime WebSocket (already authenticated by the app; you call
    websocket.accept())."""
    await Realtime(websocket, engine, settings, idle_seconds).run()
