"""The Wyoming face against bad and hostile clients, on a real server on loopback (tiny.en):
each gets the protocol's `error` event with the code of service.engine.errors' table, or a
bounded wait and a close, and the server keeps serving the others. Synchronised on events
(the error, the end of the connection), never on time; the deadlines are made short."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_ref import pipeline
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Describe
from wyoming_client import TIMEOUT, Reader, answer_of, command, connect, read

from xattn.service.background import BackgroundServer
from xattn.service.engine.live import live_settings
from xattn.service.server import ServerConfig
from xattn.service.wyoming.handler import WyomingSettings
from xattn.service.wyoming.server import WyomingServer, bind

HELLO = Path(__file__).resolve().parents[1] / "samples" / "hello.wav"  # 8.6 s
IDLE = 2.0  # seconds: the server's idle deadline here


def hello_pcm() -> bytes:
    with wave.open(str(HELLO)) as w:
        return w.readframes(w.getnframes())


@pytest.fixture(scope="module")
def bg() -> Iterator[BackgroundServer]:
    """Three transcriptions in flight at most (workers 1, a queue of 2), 3 s of audio per
    command, idle after 2 s."""
    config = ServerConfig(
        port=0,
        wyoming_port=0,
        workers=1,
        max_queue=2,
        live_idle_timeout=IDLE,
        live_max_seconds=3.0,
        max_message_mb=0.25,  # a batch command's PCM: what one Transcribe may carry
        max_live_streams=4,  # the slots above bound the streams, not the live capacity
    )
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        yield server


@pytest.fixture(scope="module")
def port(bg: BackgroundServer) -> int:
    return bg.server.wyoming_port


def face(bg: BackgroundServer, **settings: object) -> WyomingServer:
    """Another Wyoming face on the same engine."""

    async def start() -> WyomingServer:
        live = live_settings(bg.engine.limits)
        server = WyomingServer(
            bg.engine, WyomingSettings(live=live, **settings), bind("127.0.0.1", 0)
        )
        await server.start()
        return server

    return bg.call(start())


async def raw(port: int, data: bytes) -> tuple[list[Event], bool]:
    """Bytes sent as they are; the events that come back until the server closes (True)."""
    client = await connect(port)
    assert client._writer is not None
    client._writer.write(data)
    events = []
    while (event := await read(client)) is not None:
        events.append(event)
    await client.disconnect()
    return events, True


def codes(events: list[Event]) -> list[str]:
    return [e.data.get("code", e.type) if e.type == "error" else e.type for e in events]


async def info_after(client) -> str:  # type: ignore[no-untyped-def]
    """The type of the event a describe gets next on this connection."""
    await client.write_event(Describe().event())
    event = await read(client)
    return event.type if event is not None else "closed"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"hello\n", "not a JSON object"),
        (b'{"data": {}}\n', "KeyError"),
        (b'{"type": "describe", "data": [1]}\n', "data an object"),
        (b'{"type": "audio-chunk", "payload_length": 1000000000}\n', "event too large"),
        (b'{"type": "audio-chunk", "data_length": "many"}\n', "must be a count"),
        (b"x" * 70000 + b"\n", "over 64 KiB"),
    ],
)
def test_bytes_that_are_not_an_event_get_an_error_and_a_close(
    port: int, data: bytes, says: str
) -> None:
    events, closed = asyncio.run(raw(port, data))
    assert codes(events) == ["invalid_argument"] and closed
    assert says in events[0].data["text"]
    assert asyncio.run(command(port, b"", per_chunk=None)).types[-1] == "transcript-stop"


@pytest.mark.parametrize(
    "data",
    [b"", b'{"type": "audio-chunk", "payload_length": 100}\n' + bytes(10), b'{"type": "descr'],
    ids=["nothing", "half-a-payload", "half-a-line"],
)
def test_a_connection_that_sends_nothing_or_half_an_event_is_closed(port: int, data: bytes) -> None:
    events, closed = asyncio.run(raw(port, data))
    assert codes(events) == ["deadline_exceeded"] and closed


def test_audio_before_audio_start_is_one_error_and_the_connection_goes_on(port: int) -> None:
    async def run() -> tuple[list[str], str]:
        client = await connect(port)
        for _ in range(3):
            await client.write_event(AudioChunk(16000, 2, 1, bytes(3200)).event())
        await client.write_event(AudioStop().event())
        events = [await read(client)]
        return codes(events), await info_after(client)

    assert asyncio.run(run()) == (["invalid_argument"], "info")


@pytest.mark.parametrize(
    ("ask", "code", "says"),
    [
        (Transcribe(name="large-v3"), "model_not_found", "unknown model 'large-v3'"),
        (Transcribe(language="de"), "invalid_argument", "unknown language 'de'"),
        (Transcribe(language="klingon"), "invalid_argument", "unknown language"),
        (Transcribe(language=["en"]), "invalid_argument", "must be a string"),  # type: ignore[arg-type]
        (Transcribe(transcript_names="Kitchen"), "invalid_argument", "list of strings"),  # type: ignore[arg-type]
    ],
)
def test_a_transcribe_the_server_cannot_honour_drops_its_command(
    port: int, ask: Transcribe, code: str, says: str
) -> None:
    """The error comes at once; the command's audio is dropped (no transcript for it); the
    connection goes on."""

    async def run() -> tuple[list[str], str, str]:
        client = await connect(port)
        await client.write_event(ask.event())
        await client.write_event(AudioStart(16000, 2, 1).event())
        await client.write_event(AudioChunk(16000, 2, 1, hello_pcm()[:32000]).event())
        await client.write_event(AudioStop().event())
        event = await read(client)
        assert event is not None
        return codes([event]), event.data["text"], await info_after(client)

    got, text, after = asyncio.run(run())
    assert got == [code] and says in text and after == "info"


@pytest.mark.parametrize(
    ("start", "chunk", "says"),
    [
        (AudioStart(16000, 5, 1), None, "width must be 1, 2, 3 or 4"),
        (AudioStart(0, 2, 1), None, "rate must be"),
        (AudioStart(16000, 2, 0), None, "channels must be"),
        (AudioStart(16000, 2, 1), AudioChunk(8000, 2, 1, bytes(100)), "differs from"),
        (AudioStart(16000, 2, 1), AudioChunk(16000, 2, 1, bytes(101)), "not whole samples"),
    ],
)
def test_audio_the_server_cannot_read_is_an_error(
    port: int, start: AudioStart, chunk: AudioChunk | None, says: str
) -> None:
    async def run() -> tuple[list[str], str, str]:
        client = await connect(port)
        await client.write_event(start.event())
        if chunk is not None:
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        event = await read(client)
        assert event is not None
        return codes([event]), event.data["text"], await info_after(client)

    got, text, after = asyncio.run(run())
    assert got == ["invalid_argument"] and says in text and after == "info"


@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "batch"])
def test_too_much_audio_is_audio_too_long(bg: BackgroundServer, streaming: bool) -> None:
    server = face(bg, streaming=streaming)
    try:
        answer = asyncio.run(command(server.port, hello_pcm(), streamed=streaming))
    finally:
        bg.call(server.stop())
    assert codes(answer.events)[-1] == "audio_too_long"
    assert "over 3 s of audio" in answer.events[-1].data["text"]


def in_flight(bg: BackgroundServer, n: int) -> None:
    """Wait until the engine holds `n` admitted requests (a stopped live step ends on its
    own before its slot is free)."""

    async def wait() -> None:
        while bg.engine.counters().in_flight != n:
            await asyncio.sleep(0.02)

    bg.call(asyncio.wait_for(wait(), TIMEOUT))


def test_a_batch_command_over_a_transcribe_message_is_audio_too_long(
    bg: BackgroundServer,
) -> None:
    """1 s of 48 kHz 32-bit stereo (384 KB): under the 3 s limit, over the 0.25 MiB a
    Transcribe may carry here."""
    server = face(bg, streaming=False)
    try:
        answer = asyncio.run(command(server.port, bytes(384000), 48000, 4, 2, streamed=False))
    finally:
        bg.call(server.stop())
    assert codes(answer.events) == ["audio_too_long"]
    assert "MiB of PCM" in answer.events[0].data["text"]


def slot_free(bg: BackgroundServer) -> None:
    in_flight(bg, 0)


def test_a_hang_up_mid_command_is_logged_as_a_hang_up(
    bg: BackgroundServer, port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="xattn.service")
    slot_free(bg)  # the commands of the tests before
    before = bg.engine.counters()

    async def run() -> None:
        client = await connect(port)
        await client.write_event(AudioStart(16000, 2, 1).event())
        await client.write_event(AudioChunk(16000, 2, 1, hello_pcm()[: 2 * 16000 * 2]).event())
        await client.write_event(Describe().event())
        assert (await read(client)).type == "info"  # type: ignore[union-attr]  # it has the audio
        await client.disconnect()

    asyncio.run(run())
    slot_free(bg)
    after = bg.engine.counters()
    assert after.cancelled == before.cancelled + 1 and after.failed == before.failed
    hung = [r for r in caplog.records if "hung up mid-command" in r.getMessage()]
    assert [r.levelno for r in hung] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_hang_up_before_the_transcript_cancels_the_transcription(
    bg: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="xattn.service")
    server = face(bg, streaming=False)
    slot_free(bg)
    before = bg.engine.counters()

    async def run() -> None:
        client = await connect(server.port)
        await client.write_event(AudioStart(16000, 2, 1).event())
        await client.write_event(AudioChunk(16000, 2, 1, hello_pcm()[: 29 * 1600 * 2]).event())
        await client.write_event(AudioStop().event())
        await asyncio.to_thread(in_flight, bg, 1)  # admitted: it is being transcribed
        await client.disconnect()

    try:
        asyncio.run(run())
        slot_free(bg)
    finally:
        bg.call(server.stop())
    after = bg.engine.counters()
    assert after.admitted == before.admitted + 1 and after.finished == before.finished
    assert after.cancelled == before.cancelled + 1
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("hung up before its transcript" in m for m in messages), messages
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_idle_mid_command_ends_it_and_frees_its_slot(bg: BackgroundServer, port: int) -> None:
    async def run() -> list[str]:
        client = await connect(port)
        await client.write_event(AudioStart(16000, 2, 1).event())
        await client.write_event(AudioChunk(16000, 2, 1, bytes(3200)).event())
        events = []
        while (event := await read(client)) is not None:  # then nothing, until it closes
            events.append(event)
        return codes(events)

    assert asyncio.run(run())[-1] == "deadline_exceeded"
    slot_free(bg)


def test_a_full_engine_answers_server_busy_and_the_others_go_on(
    bg: BackgroundServer, port: int
) -> None:
    """Three live streams hold the engine's three slots (workers 1, a queue of 2): a fourth
    command is refused with server_busy (a retry hint in its text); the three go on to their
    transcripts."""
    slot_free(bg)
    pcm = hello_pcm()[: 2 * 16000 * 2]  # 2 s

    async def run() -> tuple[list[str], str, list[list[str]]]:
        held = [await connect(port) for _ in range(3)]
        readers = [Reader(client) for client in held]
        for client in held:
            await client.write_event(AudioStart(16000, 2, 1).event())
        await asyncio.to_thread(in_flight, bg, 3)  # all three admitted
        refused = await command(port, pcm, per_chunk=None)
        for client in held:
            await client.write_event(AudioChunk(16000, 2, 1, pcm).event())
            await client.write_event(AudioStop().event())
        answers = [await reader.task for reader in readers]
        for client in held:
            await client.disconnect()
        return codes(refused.events), refused.events[-1].data["text"], [a.types for a in answers]

    refused, text, held = asyncio.run(run())
    assert refused == ["server_busy"] and "retry in about" in text
    assert [types[-2:] for types in held] == [["transcript", "transcript-stop"]] * 3


def test_a_connection_over_the_limit_is_refused_and_the_others_served(
    bg: BackgroundServer,
) -> None:
    server = face(bg, max_connections=2)

    async def run() -> tuple[list[str], list[str]]:
        held = [await connect(server.port) for _ in range(2)]
        for client in held:
            assert await info_after(client) == "info"  # accepted and counted
        refused, _ = await raw(server.port, b"")
        after = [await info_after(client) for client in held]
        for client in held:
            await client.disconnect()
        return codes(refused), after

    try:
        refused, after = asyncio.run(run())
    finally:
        bg.call(server.stop())
    assert refused == ["server_busy"] and after == ["info", "info"]


def test_hostile_clients_beside_a_good_one(port: int) -> None:
    """A valid streamed command while five hostile connections misbehave at once: each
    hostile one gets its error, the valid one its transcript."""
    pcm = hello_pcm()[: 2 * 16000 * 2]
    hostile = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b'{"type": "audio-chunk", "payload_length": 1000000000}\n',
        b'{"type": "audio-chunk", "data": {"rate": 16000, "width": 2, "channels": 1}}\n',
        b'{"type": "transcribe", "data": {"name": "nope"}}\n',
        b'{"type": "audio-start", "data": {"rate": "fast", "width": 2, "channels": 1}}\n',
    ]

    async def run() -> tuple[list, object]:
        good = command(port, pcm, per_chunk=None)
        bad = [raw(port, data) for data in hostile]
        *results, answer = await asyncio.gather(*bad, good)
        return [codes(events) for events, _ in results], answer

    bad, answer = asyncio.run(run())
    assert bad == [
        ["invalid_argument"],
        ["invalid_argument"],
        ["invalid_argument", "deadline_exceeded"],
        ["model_not_found", "deadline_exceeded"],
        ["invalid_argument", "deadline_exceeded"],
    ]
    assert answer.error is None and answer.types[-1] == "transcript-stop"  # type: ignore[attr-defined]


def test_shutdown_drains_a_command_in_progress() -> None:
    """stop(grace): no new connection; the command in progress gets its transcript."""
    config = ServerConfig(port=0, wyoming_port=0, wyoming_streaming=False, workers=1)
    bg = BackgroundServer(config, pipeline("tiny.en"))
    port = bg.server.wyoming_port
    stopped = threading.Thread(target=bg.stop, kwargs={"grace": 120.0})

    async def run() -> tuple[list[str], bool]:
        client = await connect(port)
        await client.write_event(AudioStart(16000, 2, 1).event())
        await client.write_event(AudioChunk(16000, 2, 1, hello_pcm()).event())
        await client.write_event(Describe().event())  # the command is under way
        assert (await read(client)).type == "info"  # type: ignore[union-attr]
        stopped.start()
        await client.write_event(AudioStop().event())
        answer = await answer_of(client, streamed=False)
        closed = await read(client) is None  # closed once its answer is sent
        await client.disconnect()
        return answer.types, closed

    try:
        types, closed = asyncio.run(run())
    finally:
        stopped.join(180)
    assert types == ["transcript"] and closed
    with pytest.raises(OSError):
        asyncio.run(connect(port))


def test_ping_is_answered_and_unknown_events_ignored(port: int) -> None:
    async def run() -> list[str]:
        client = await connect(port)
        await client.write_event(Event("run-satellite"))  # a satellite's: not ours
        await client.write_event(Event("ping", {"text": "x"}))
        pong = await read(client)
        assert pong is not None
        return [pong.type, json.dumps(pong.data), await info_after(client)]

    assert asyncio.run(run()) == ["pong", '{"text": "x"}', "info"]
