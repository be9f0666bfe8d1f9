"""The `wyoming` library's AsyncTcpClient driving our Wyoming face: one command, its events.

answer = await command(port, pcm, rate=16000, width=2, channels=1)
answer.text, answer.chunks, answer.types
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event

TIMEOUT = 300.0  # seconds for any one event: a busy 2-core machine, never a measurement


@dataclass
class Answer:
    events: list[Event] = field(default_factory=list)

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]

    @property
    def chunks(self) -> list[str]:
        return [e.data["text"] for e in self.events if e.type == "transcript-chunk"]

    @property
    def text(self) -> str:
        (transcript,) = [e for e in self.events if e.type == "transcript"]
        return str(transcript.data["text"])

    @property
    def error(self) -> Event | None:
        return next((e for e in self.events if e.type == "error"), None)


def pieces(pcm: bytes, frame: int, per_chunk: int | None) -> list[bytes]:
    """`pcm` cut into chunks of `per_chunk` frames (None: one chunk)."""
    if per_chunk is None:
        return [pcm]
    step = per_chunk * frame
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


async def connect(port: int) -> AsyncTcpClient:
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    return client


async def read(client: AsyncTcpClient) -> Event | None:
    return await asyncio.wait_for(client.read_event(), TIMEOUT)


async def answer_of(client: AsyncTcpClient, streamed: bool) -> Answer:
    """Events up to the command's last: transcript-stop (streamed), transcript, or error."""
    answer = Answer()
    while (event := await read(client)) is not None:
        answer.events.append(event)
        if event.type == "error" or event.type == ("transcript-stop" if streamed else "transcript"):
            break
    return answer


async def command(
    port: int,
    pcm: bytes,
    rate: int = 16000,
    width: int = 2,
    channels: int = 1,
    per_chunk: int | None = 1024,
    transcribe: Transcribe | None = None,
    streamed: bool = True,
) -> Answer:
    """One command on a connection of its own, the audio as fast as the socket takes it."""
    client = await connect(port)
    try:
        await client.write_event((transcribe or Transcribe()).event())
        await client.write_event(AudioStart(rate, width, channels).event())
        for chunk in pieces(pcm, width * channels, per_chunk):
            await client.write_event(AudioChunk(rate, width, channels, chunk).event())
        await client.write_event(AudioStop().event())
        return await answer_of(client, streamed)
    finally:
        await client.disconnect()


class Reader:
    """A command's events, read in the background as they come; `first_chunk` is set at the
    first transcript-chunk (or at the end, whatever ended it: the caller checks `answer`)."""

    def __init__(self, client: AsyncTcpClient, streamed: bool = True) -> None:
        self.client, self.streamed = client, streamed
        self.answer = Answer()
        self.first_chunk = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> Answer:
        last = "transcript-stop" if self.streamed else "transcript"
        try:
            while (event := await read(self.client)) is not None:
                self.answer.events.append(event)
                if event.type == "transcript-chunk":
                    self.first_chunk.set()
                if event.type in ("error", last):
                    break
        finally:
            self.first_chunk.set()
        return self.answer
