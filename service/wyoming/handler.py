"""One Wyoming connection: the `wyoming` library's AsyncEventHandler, with deadlines.

Events are read with the library's own framing (`async_read_event`: a JSON header line, then
its data and payload) through a guard that refuses a header naming more than the server's
limits, so no client can make it buffer what it likes. The loop waits for the next event for
at most `idle_timeout` seconds, counted from the last event (or the last answer sent): a
connection that opens and sends nothing, or half an event, or stops sending audio, gets an
`error` (deadline_exceeded) and is closed. While a transcript is being made the client may
send nothing for as long as that takes.

Events: describe -> info; transcribe (model, language, names and terms) applies to the next
audio; audio-start .. audio-chunk* .. audio-stop is one command (service.wyoming.command),
answered by transcript (batch) or transcript-start, transcript-chunk*, transcript,
transcript-stop (streamed); ping -> pong; other types are ignored, as Wyoming peers do.
A connection may carry several commands, one after the other.

Errors are the protocol's `error` event, its `code` from service.engine.errors' table:
a transcribe the server cannot honour (model_not_found, invalid_argument), audio before
audio-start, a format the server does not take, too much audio (audio_too_long), a full
server (server_busy). The command ends there: the rest of its audio is dropped (up to its
audio-stop, or the next transcribe) and the connection goes on. Bytes that are not an event
get an `error` and the connection closes (its framing is lost). A client that hangs up is
logged as a hang-up (INFO mid-command, else DEBUG), and its command stops. Each command is
one request in the engine's reports (face "wyoming", method "transcribe"): ok, cancelled, or
its error's code.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field

from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler

from xattn.model.audio.features import AudioError
from xattn.service.engine.engine import Engine
from xattn.service.engine.errors import INTERNAL, ClientTimeout, MalformedMessage, fault_of
from xattn.service.engine.live import LiveSettings, StreamOrderError
from xattn.service.engine.observe import RequestScope
from xattn.service.wyoming.audio import pcm_format
from xattn.service.wyoming.command import BatchCommand, Request, StreamedCommand, request_of
from xattn.service.wyoming.info import describe

log = logging.getLogger(__name__)

LINE_LIMIT = 64 << 10  # bytes of one header line (asyncio's default reader limit)
Command = BatchCommand | StreamedCommand


class BadEvent(MalformedMessage):
    """Bytes that are not a Wyoming event (invalid_argument; the connection closes)."""


class _Refused(Exception):
    """The guard's refusal of a header (not a ValueError: the library would swallow it)."""


@dataclass(frozen=True)
class WyomingSettings:
    streaming: bool = True  # transcript-chunks from the live path; False: one transcript
    idle_timeout: float = 10.0  # seconds a connection may send nothing (or half an event)
    max_connections: int = 64  # connections at once; more are refused with server_busy
    max_payload_bytes: int = 4 << 20  # one audio-chunk (10 s of 48 kHz 32-bit stereo)
    max_data_bytes: int = 1 << 20  # one event's JSON data
    live: LiveSettings = field(default_factory=LiveSettings)  # the live limit, the policy
    # streamed: seconds heard after a command's first words before they go out (LiveOptions.
    # first_context: a command is all first words, and a misread one is a wrong command);
    # 1.25 s: as few word errors as 1.5 s, more first words before the speech ends
    # (docs/home-assistant.md)
    first_context: float | None = 1.25


class _Guarded:
    """The connection's reader as `async_read_event` reads it, refusing a header whose data
    or payload length is not a count within the limits (before reading any of it)."""

    def __init__(self, reader: asyncio.StreamReader, settings: WyomingSettings) -> None:
        self.reader, self.settings = reader, settings

    async def readline(self) -> bytes:
        line = await self.reader.readline()
        try:
            header = json.loads(line)
        except ValueError:
            return line  # the library reports it (as None)
        if isinstance(header, dict):
            for key, limit in (
                ("data_length", self.settings.max_data_bytes),
                ("payload_length", self.settings.max_payload_bytes),
            ):
                n = header.get(key)
                if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
                    raise _Refused(f"not a Wyoming event: {key} must be a count, not {n!r}")
                if n is not None and n > limit:
                    raise _Refused(f"event too large: {key} {n} is over this server's {limit}")
        return line

    async def readexactly(self, n: int) -> bytes:
        return await self.reader.readexactly(n)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


class WyomingHandler(AsyncEventHandler):
    """One client connection on the engine."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        engine: Engine,
        settings: WyomingSettings,
    ) -> None:
        super().__init__(reader, writer)
        self.engine, self.settings = engine, settings
        self.peer = _peer(writer)
        self._guarded = _Guarded(reader, settings)
        self.request: Request | None = None  # the transcribe the next audio answers
        self.command: Command | None = None  # audio-start .. audio-stop
        self.answer: asyncio.Task[None] | None = None  # audio-stop .. the last answer sent
        self.discarding = False  # an error ended the command: drop its audio
        self.scope: RequestScope | None = None  # the command's report (service.engine.observe)
        self.draining = False  # the server is stopping: close once nothing is in progress
        self._stopped = False  # stop() closed it (a shutdown, not a hang-up)
        self.spoke = False  # a whole event has come (until then the server may evict it)

    @property
    def busy(self) -> bool:
        """A command is in progress: its audio arriving, or its answer being made."""
        return self.command is not None or (self.answer is not None and not self.answer.done())

    async def run(self) -> None:
        """Events until the client hangs up, idles, breaks the framing, or the server stops."""
        self._is_running = True
        loop = asyncio.get_running_loop()
        idle = self.settings.idle_timeout
        read: asyncio.Task[Event | None] | None = None
        try:
            while self._is_running:
                read = read or asyncio.ensure_future(self._read())
                deadline = loop.time() + idle
                while not read.done():
                    answer = self.answer if self.busy and self.command is None else None
                    timeout = None if answer is not None else deadline - loop.time()
                    if timeout is not None and timeout <= 0:
                        raise ClientTimeout(
                            f"no event for {idle:g} s: this server closes a connection that "
                            "sends nothing (or half an event) for that long"
                        )
                    waits = {read} if answer is None else {read, answer}
                    done, _ = await asyncio.wait(
                        waits, timeout=timeout, return_when="FIRST_COMPLETED"
                    )
                    if answer is not None and answer in done:
                        if self.draining:
                            return
                        deadline = loop.time() + idle
                event, read = read.result(), None
                self.spoke = True
                if event is None:
                    self._hung_up()
                    return
                if not await self.handle_event(event):
                    return
        except (ClientTimeout, BadEvent) as e:
            log.debug("wyoming %s: %s", self.peer, e)
            await self._report(e)
        finally:
            if read is not None:
                read.cancel()
            await self.disconnect()
            self.writer.close()

    async def _read(self) -> Event | None:
        """The next event; None when the client hung up (between events or inside one)."""
        try:
            event = await async_read_event(self._guarded)  # type: ignore[arg-type]
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        except _Refused as e:
            raise BadEvent(str(e)) from None
        except (KeyError, TypeError, AttributeError) as e:
            raise BadEvent(f"not a Wyoming event ({type(e).__name__}: {e})") from None
        if event is None:
            if self.reader.at_eof():
                return None
            raise BadEvent(
                f"not a Wyoming event: a header line that is not a JSON object (or is over "
                f"{LINE_LIMIT >> 10} KiB)"
            )
        if not isinstance(event.type, str) or not isinstance(event.data, dict):
            raise BadEvent("not a Wyoming event: its type must be a string, its data an object")
        return event

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._dispatch(event)
        except ConnectionError:
            self._hung_up()
            return False
        except Exception as e:  # the command ends; the connection goes on
            log.debug("wyoming %s: %s: %s", self.peer, event.type, e)
            self._end_command()
            if AudioStart.is_type(event.type) or AudioChunk.is_type(event.type):
                self.discarding = True  # its audio, up to its audio-stop, is dropped
            await self._report(e)
        return not (self.draining and not self.busy)

    async def _dispatch(self, event: Event) -> None:
        kind, data = event.type, event.data
        if Describe.is_type(kind):
            info = describe(self.engine.pipelines, self.settings.streaming)
            if not info.asr[0].models:
                self.engine.pipeline_for("")  # NotReady: the model is still loading
            await self.write_event(info.event())
        elif Ping.is_type(kind):
            text = data.get("text")
            await self.write_event(Pong(text=text if isinstance(text, str) else None).event())
        elif Transcribe.is_type(kind):
            await self._settle()
            if self.command is not None:
                raise StreamOrderError("transcribe while audio is streaming: send audio-stop first")
            self._begin()
            self.request, self.discarding = None, True  # until it is known to be good
            self.request = request_of(self.engine, Transcribe.from_event(event))
            self.discarding = False
        elif self.discarding and (AudioStart.is_type(kind) or AudioChunk.is_type(kind)):
            pass  # the rest of a command that failed
        elif self.discarding and AudioStop.is_type(kind):
            self.discarding = False
        elif AudioStart.is_type(kind):
            await self._settle()
            if self.command is not None:
                raise StreamOrderError(
                    "audio-start while audio is streaming: send audio-stop first"
                )
            self._begin()
            fmt = pcm_format(data.get("rate"), data.get("width"), data.get("channels"))
            request, self.request = self.request or request_of(self.engine, None), None
            if self.settings.streaming:
                # this loop keeps the deadline between events; the stream's own comes later
                idle = 2 * self.settings.idle_timeout
                policy = dataclasses.replace(
                    self.settings.live.defaults, first_context=self.settings.first_context
                )
                live = dataclasses.replace(self.settings.live, idle_timeout=idle, defaults=policy)
                self.command = StreamedCommand(
                    self.engine, live, request, fmt, self.write_event, self._command_failed
                )
            else:
                self.command = BatchCommand(
                    self.engine, request, fmt, self.settings.live.max_seconds
                )
        elif AudioChunk.is_type(kind):
            if self.command is None:
                self.discarding = True  # one error for the whole command, not one a chunk
                raise StreamOrderError("audio-chunk before audio-start")
            fmt = pcm_format(data.get("rate"), data.get("width"), data.get("channels"))
            if fmt != self.command.fmt:
                raise AudioError(
                    f"audio-chunk's format {fmt} differs from audio-start's {self.command.fmt}"
                )
            self.command.add(event.payload or b"")
        elif AudioStop.is_type(kind):
            if self.command is None:
                raise StreamOrderError("audio-stop before audio-start")
            command, self.command = self.command, None
            self.answer = asyncio.create_task(self._finish(command), name="xattn-wyoming-answer")
        else:
            log.debug("wyoming %s: ignored a %r event", self.peer, kind)

    async def _settle(self) -> None:
        """Wait for the previous command's answer (a client that sent the next one early)."""
        if self.answer is not None:
            await self.answer

    async def _finish(self, command: Command) -> None:
        try:
            await command.finish(self.write_event)
            log.debug("wyoming %s: answered %.2f s of audio", self.peer, command.seconds)
            self._ended("ok")
        except asyncio.CancelledError:
            command.close()
            self._ended("cancelled")
            raise
        except ConnectionError as e:
            log.debug("wyoming %s: went away before its transcript was sent: %r", self.peer, e)
            self._ended("cancelled")
        except Exception as e:
            await self._report(e)

    async def _command_failed(self, e: BaseException, command: object) -> None:
        """A streamed command's live stream failed while its audio was arriving."""
        if self.command is command:
            self.command, self.discarding = None, True
        await self._report(e)

    def _end_command(self) -> None:
        if self.command is not None:
            self.command.close()
            self.command, self.discarding = None, True

    async def _report(self, e: BaseException) -> None:
        """The `error` event for `e` (its code from the one table); unexpected ones logged."""
        fault = fault_of(e)
        if fault is None:
            log.error("wyoming %s: request failed", self.peer, exc_info=e)
            text, code = f"internal error: {type(e).__name__}", INTERNAL.code
        else:
            text, code = str(e), fault.code
        self._ended(code)
        try:
            await self.write_event(Error(text=text, code=code).event())
        except ConnectionError:
            pass

    def _begin(self) -> None:
        """A command begins (its transcribe, or its audio-start without one): its report."""
        if self.scope is None:
            self.scope = self.engine.observer.request("wyoming", "transcribe")

    def _ended(self, code: str) -> None:
        """The command's report ends with `code` (ok, cancelled or the table's code)."""
        if self.scope is not None:
            self.scope.end(code)
            self.scope = None

    def _hung_up(self) -> None:
        self._ended("cancelled")
        if self._stopped:
            return
        if self.command is not None:
            log.info(
                "wyoming %s hung up mid-command, after %.1f s of audio",
                *(self.peer, self.command.seconds),
            )
        elif self.answer is not None and not self.answer.done():
            log.info("wyoming %s hung up before its transcript was sent", self.peer)
        else:
            log.debug("wyoming %s hung up", self.peer)

    async def disconnect(self) -> None:
        self._ended("cancelled")  # a command the connection's end cut short
        if self.command is not None:
            self.command.close()
            self.command = None
        if self.answer is not None and not self.answer.done():
            self.answer.cancel()
            await asyncio.gather(self.answer, return_exceptions=True)

    @property
    def silent(self) -> bool:
        """No whole event has come yet, and it is still open."""
        return not self.spoke and not self.busy and not self._stopped

    async def evict(self, why: Exception) -> None:
        """Send `why`'s error and close: a full server makes room for a new connection."""
        fault = fault_of(why)
        code = fault.code if fault is not None else INTERNAL.code
        try:
            await self.write_event(Error(text=str(why), code=code).event())
        except ConnectionError:
            pass
        await self.stop()

    async def stop(self) -> None:
        """Close the connection now (a shutdown): its command, if any, stops."""
        self._stopped = True
        await super().stop()
