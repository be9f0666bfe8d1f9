"""One Wyoming command: `transcribe` (what to use), then `audio-start` .. `audio-stop`.

- `BatchCommand` keeps the audio and, at audio-stop, runs it as gRPC `Transcribe` runs the
  same PCM (`start_transcription`, the same defaults: beam 5, temperature fallback): one
  `transcript`, token-identical to Transcribe's.
- `StreamedCommand` feeds the audio, as it arrives, to a live stream (LiveSession: the live
  policy on the engine's live pool, one admission slot from audio-start on) and sends each
  final as a `transcript-chunk` while the speaker still speaks; at audio-stop the stream
  half-closes, `finish()` decodes what is left, and `transcript` (the chunks' concatenation:
  finals are never revised) and `transcript-stop` follow.

Both hold at most `max_seconds` of audio (the live limit): more is AudioTooLongError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.event import Event

from xattn.model.audio.features import SAMPLE_RATE, AudioTooLongError
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.pipeline import Pipeline
from xattn.service.engine.admit import start_transcription
from xattn.service.engine.engine import Engine
from xattn.service.engine.live import LiveSession, LiveSettings, StreamOrderError
from xattn.service.wyoming.audio import PcmFormat, StreamConverter, batch_pcm
from xattn.service.wyoming.info import PROGRAM
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]
Failed = Callable[[BaseException, object], Awaitable[None]]


@dataclass(frozen=True)
class Request:
    """What a `transcribe` asked for, checked against the engine's models."""

    model: str  # the pipeline's name
    language: str | None = None  # None: the model's own (English-only) or detected
    prompt: str | None = None  # transcript_terms, then transcript_names (batch only)


def _strings(value: object, name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StreamOrderError(f"transcribe {name} must be a list of strings")
    return [v.strip() for v in value if v.strip()]


def _language(pipe: Pipeline, value: object) -> str | None:
    """A Whisper language code for `value` ("en", "EN", "en-US" and "en_GB" give "en")."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise StreamOrderError(f"transcribe language must be a string, not {value!r}")
    code = value.strip().lower()
    base = code.replace("_", "-").split("-")[0]
    if code not in pipe.languages and base in pipe.languages:
        code = base
    pipe.validate(DecodeOptions(language=code))  # OptionsError naming the model's languages
    return code


def request_of(engine: Engine, transcribe: Transcribe | None) -> Request:
    """The request a `transcribe` (None: none came) makes: UnknownModel, OptionsError or
    StreamOrderError for one the server cannot honour."""
    if transcribe is None:
        return Request(engine.pipeline.name)
    name = transcribe.name
    if name is not None and not isinstance(name, str):
        raise StreamOrderError(f"transcribe name must be a string, not {name!r}")
    pipe = engine.pipeline_for("" if name in (None, "", PROGRAM) else name)
    # names last: Whisper keeps a prompt's end when it is too long, and names come first
    words = _strings(transcribe.transcript_terms, "transcript_terms")
    words += _strings(transcribe.transcript_names, "transcript_names")
    return Request(pipe.name, _language(pipe, transcribe.language), ", ".join(words) or None)


class BatchCommand:
    """The audio kept until audio-stop, then one Transcribe: at most `max_seconds`, and at
    most the PCM one Transcribe message may carry (the engine's receive limit)."""

    def __init__(self, engine: Engine, request: Request, fmt: PcmFormat, max_seconds: float):
        self.engine, self.request, self.fmt, self.max_seconds = engine, request, fmt, max_seconds
        self.max_bytes = engine.limits.max_receive_message_bytes or None
        self._parts: list[bytes] = []
        self.received = 0  # bytes

    @property
    def seconds(self) -> float:
        return self.fmt.seconds(self.received)

    def add(self, data: bytes) -> None:
        self.fmt.check(data)
        self.received += len(data)
        if self.seconds > self.max_seconds:
            raise AudioTooLongError(
                f"command too long: over {self.max_seconds:g} s of audio (the server's limit)"
            )
        if self.max_bytes is not None and self.received > self.max_bytes:
            raise AudioTooLongError(
                f"command too long: over {self.max_bytes / 2**20:.3g} MiB of PCM, what one "
                "Transcribe may carry (the server's --max-message-mb); send a lower rate, "
                "width or fewer channels"
            )
        self._parts.append(data)

    async def finish(self, send: Send) -> None:
        data, self._parts = b"".join(self._parts), []
        if not data:  # audio-stop right after audio-start: nothing was said
            await send(Transcript(text="", language=self.request.language).event())
            return
        options = pb.TranscriptionOptions(
            language=self.request.language or "", initial_prompt=self.request.prompt or ""
        )
        run = start_transcription(
            self.engine,
            pb.Audio(pcm=batch_pcm(self.fmt, data)),
            options,
            pb.AlignmentOptions(),
            self.request.model,
            pb.ALIGNMENT_MODE_NONE,
            stream=False,
        )
        async with aclosing(run.events()) as events:
            results = [r async for r in events]  # one: the whole result
        transcript = results[-1].transcript
        await send(Transcript(text=transcript.text, language=transcript.language).event())

    def close(self) -> None:
        self._parts = []


class StreamedCommand:
    """A live stream from audio-start on; its finals go out as transcript-chunks at once."""

    def __init__(
        self,
        engine: Engine,
        settings: LiveSettings,
        request: Request,
        fmt: PcmFormat,
        send: Send,
        failed: Failed,
    ) -> None:
        self.engine, self.settings, self.request, self.fmt = engine, settings, request, fmt
        self._send_event, self._failed = send, failed
        self._closed = False  # close(): nothing more is sent, whatever the stream still does
        self._converter = StreamConverter(fmt)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.received = 0  # bytes
        self.started = False  # transcript-start sent
        self.chunks: list[str] = []  # the transcript-chunks' texts
        self._task = asyncio.create_task(self._run(), name="xattn-wyoming-live")

    @property
    def seconds(self) -> float:
        return self.fmt.seconds(self.received)

    def add(self, data: bytes) -> None:
        self.fmt.check(data)
        self.received += len(data)
        if self.seconds > self.settings.max_seconds:
            raise AudioTooLongError(
                f"command too long: over {self.settings.max_seconds:g} s of audio (the "
                "server's limit)"
            )
        samples = self._converter.feed(data)
        if samples:
            self._queue.put_nowait(samples)

    async def finish(self, send: Send) -> None:
        """Half-close the stream; returns once transcript-stop is sent (or the error)."""
        rest = self._converter.flush()
        if rest:
            self._queue.put_nowait(rest)
        self._queue.put_nowait(None)
        await self._task

    def close(self) -> None:
        """Stop now and send nothing more; half-closed too, so that the live stream ends
        (and its admission is released) even where a cancellation were lost (a hang-up
        right after audio-start once held its slot for good: asyncio.wait_for on Python
        3.11 can swallow a cancel that comes as its awaitable finishes; the engine's live
        stream now waits with asyncio.timeout)."""
        self._closed = True
        self._queue.put_nowait(None)
        self._task.cancel()

    async def _send(self, event: Event) -> None:
        if not self._closed:
            await self._send_event(event)

    async def _requests(self) -> AsyncIterator[pb.StreamingRecognizeRequest]:
        config = pb.StreamingRecognitionConfig(
            encoding=pb.PCM_ENCODING_FLOAT32,
            sample_rate=SAMPLE_RATE,
            language=self.request.language or "",
            model=self.request.model,
        )
        yield pb.StreamingRecognizeRequest(config=config)
        while (audio := await self._queue.get()) is not None:
            yield pb.StreamingRecognizeRequest(audio_content=audio)

    async def _start(self) -> None:
        if not self.started:
            self.started = True
            await self._send(TranscriptStart(language=self.request.language).event())

    async def _run(self) -> None:
        session = LiveSession(self.engine, self.settings, self._requests())
        done: pb.StreamingRecognizeDone | None = None
        try:
            async with aclosing(session.steps()) as steps:
                async for step in steps:
                    for r in step:
                        if r.HasField("result") and r.result.is_final and r.result.text:
                            await self._start()
                            self.chunks.append(r.result.text)
                            await self._send(TranscriptChunk(text=r.result.text).event())
                        elif r.HasField("done"):
                            done = r.done
            if done is None:
                raise RuntimeError("the live stream ended without its done message")
            await self._start()
            language = done.language or self.request.language
            await self._send(Transcript(text=done.text, language=language).event())
            await self._send(TranscriptStop().event())
        except asyncio.CancelledError:
            raise
        except ConnectionError as e:  # the reader sees the hang-up and logs it
            log.debug("wyoming client went away while its transcript was sent: %r", e)
        except Exception as e:  # the stream's error ends this command, not the connection
            if not self._closed:
                await self._failed(e, self)
