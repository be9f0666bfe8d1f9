"""Live recognition from a file, fed as if it were being spoken (StreamingRecognize).

    from xattn.clients.api import connect
    from xattn.clients.streaming import read_pcm16, stream_pcm

    with connect("127.0.0.1:50051") as client:
        for event in stream_pcm(client, read_pcm16("jfk.flac"), speed=1.0):
            print(event)  # LiveResult (interim or final) ..., then LiveDone

The file is decoded here (PyAV) into 16 kHz mono int16 and sent in 100 ms chunks at
`speed` times real time. Finals are never revised: their texts concatenated are the
transcript. Errors are xattn.clients.api's: AudioFileError, Unreachable, ServerError.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import grpc
import numpy as np

from xattn.clients.api import AudioFileError, Client, ServerError, _raise_for, alignment_options
from xattn.clients.assemble import decode_tensor
from xattn.clients.data import FRAMES_PER_SECOND, Word
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

log = logging.getLogger(__name__)

RATE = 16000  # the only rate the server takes live
CHUNK_SECONDS = 0.1
BYTES_PER_SECOND = 2 * RATE  # int16 mono


@dataclass(frozen=True)
class LiveToken:
    index: int  # among the stream's final tokens (interim: the place it would take)
    id: int
    text: str
    logprob: float
    peak_time: float  # stream clock
    buffer_offset: float  # stream time of frame 0 of the window its row covers
    row: np.ndarray | None = field(default=None, repr=False, compare=False)  # [n_heads, 1500]

    @property
    def peak_frame(self) -> int:
        return int(round((self.peak_time - self.buffer_offset) * FRAMES_PER_SECOND))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "text": self.text,
            "kind": "text",
            "logprob": round(float(self.logprob), 6),
            "peak_time": round(self.peak_time, 3),
            "peak_frame": self.peak_frame,
            "buffer_offset": round(self.buffer_offset, 3),
        }


@dataclass(frozen=True)
class LiveResult:
    is_final: bool
    stability: float
    text: str
    tokens: tuple[LiveToken, ...]
    words: tuple[Word, ...]  # finals only, stream clock
    buffer_offset: float
    audio_seconds: float  # audio the server had when it decided this
    sent_seconds: float  # audio this client had sent when the result arrived
    arrived: float  # seconds since the stream started (wall clock)


@dataclass(frozen=True)
class LiveDone:
    text: str
    language: str
    audio_seconds: float
    final_results: int
    tokens: int
    decode_steps: int
    encode_seconds: float
    compute_seconds: float
    total_seconds: float


@dataclass(frozen=True)
class LiveSpeech:
    """Voice activity (config.vad): speech began ("begin") or ended ("end"), or the single
    utterance is over ("end_of_utterance"), at `time` on the stream's clock."""

    kind: str
    time: float
    arrived: float  # seconds since the stream started (wall clock)


SPEECH_KINDS = {
    pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN: "begin",
    pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END: "end",
    pb.SPEECH_EVENT_TYPE_END_OF_SINGLE_UTTERANCE: "end_of_utterance",
}

LiveEvent = LiveResult | LiveDone | LiveSpeech


def read_pcm16(path: str | Path) -> bytes:
    """A file (wav, flac, mp3, ...) as 16 kHz mono little-endian int16 (AudioFileError)."""
    path = Path(path)
    if not path.is_file():
        raise AudioFileError(f"no such file: {path}")
    chunks: list[bytes] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                raise AudioFileError(f"no audio stream in {path}")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            frames = [*container.decode(container.streams.audio[0]), None]
            for frame in frames:  # None flushes the resampler
                chunks += [_s16(f) for f in resampler.resample(frame)]
    except av.FFmpegError as e:
        raise AudioFileError(f"cannot decode {path}: {e}") from e
    data = b"".join(chunks)
    if not data:
        raise AudioFileError(f"no audio in {path}")
    return data


def _s16(frame: av.AudioFrame) -> bytes:
    return frame.to_ndarray().astype("<i2").tobytes()  # packed mono s16: [1, n]


class Pacer:
    """A file's audio in chunks at `speed` times real time (from the first chunk asked): each
    chunk leaves when its last sample would have been recorded."""

    def __init__(self, pcm: bytes, speed: float, chunk_seconds: float = CHUNK_SECONDS) -> None:
        self.pcm, self.speed, self.chunk_seconds = pcm, speed, chunk_seconds
        self.stop = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        start = time.monotonic()
        step = int(self.chunk_seconds * RATE) * 2
        for at in range(0, len(self.pcm), step):
            chunk = self.pcm[at : at + step]
            due = start + (at + len(chunk)) / BYTES_PER_SECOND / self.speed
            if self.stop.wait(max(0.0, due - time.monotonic())):
                return
            yield chunk


def live_config(
    language: str | None = None,
    interim: bool = True,
    alignment: str = "mean",
    dtype: str = "float16",
    commit_margin: float | None = None,
    agreement: bool | None = None,
    vad: bool = False,
) -> pb.StreamingRecognitionConfig:
    """`vad`: the server's voice activity detection (no decode in silence; LiveSpeech events)."""
    config = pb.StreamingRecognitionConfig(
        encoding=pb.PCM_ENCODING_INT16,
        sample_rate=RATE,
        channels=1,
        language=language or "",
        interim_results=interim,
        alignment=alignment_options(alignment, dtype),
        vad=vad,
    )
    if commit_margin is not None:
        config.policy.commit_margin = commit_margin
    if agreement is not None:
        config.policy.agreement = agreement
    return config


def stream_pcm(
    client: Client,
    pcm: bytes,
    speed: float = 1.0,
    config: pb.StreamingRecognitionConfig | None = None,
    token: str | None = None,
    chunk_seconds: float = CHUNK_SECONDS,
) -> Iterator[LiveEvent]:
    """Send `pcm` (16 kHz mono int16) at `speed` x real time, `chunk_seconds` a request;
    yield results, then LiveDone.

    `token`: sent as `authorization: Bearer <token>` (the api's channel adds it to unary
    and server-streaming calls only)."""
    if speed <= 0:
        raise ValueError(f"speed must be > 0, not {speed}")
    pacer = Pacer(pcm, speed, chunk_seconds)
    yield from stream_chunks(client, pacer, config, token, pacer.stop)


class _Sent:
    """The requests: the config, then each chunk as it comes; counts what was sent."""

    def __init__(self, config: pb.StreamingRecognitionConfig, chunks: Iterable[bytes]) -> None:
        self.config, self.chunks = config, chunks
        self.sent = 0  # bytes
        self.start = time.monotonic()

    def __iter__(self) -> Iterator[pb.StreamingRecognizeRequest]:
        self.start = time.monotonic()
        yield pb.StreamingRecognizeRequest(config=self.config)
        for chunk in self.chunks:
            if chunk:
                self.sent += len(chunk)
                yield pb.StreamingRecognizeRequest(audio_content=chunk)

    @property
    def sent_seconds(self) -> float:
        return self.sent / BYTES_PER_SECOND


def stream_chunks(
    client: Client,
    chunks: Iterable[bytes],
    config: pb.StreamingRecognitionConfig | None = None,
    token: str | None = None,
    stop: threading.Event | None = None,
) -> Iterator[LiveEvent]:
    """The one live path (a file, a pipe, a microphone, the browser): send each chunk of
    16 kHz mono int16 as `chunks` yields it (its end half-closes the stream); yield results,
    then LiveDone. `stop` is set when this generator ends, so a source can stop waiting.

    `token`: sent as `authorization: Bearer <token>` (the api's channel adds it to unary
    and server-streaming calls only)."""
    requests = _Sent(config or live_config(), chunks)
    stub = transcriber_pb2_grpc.TranscriberStub(client._channel)  # api.Client has no public stub
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    call = stub.StreamingRecognize(iter(requests), metadata=metadata)
    done = False
    try:
        for response in call:
            arrived = time.monotonic() - requests.start
            kind = response.WhichOneof("event")
            if kind == "done":
                done = True
                yield _done(response.done)
            elif kind == "result":
                yield _result(response.result, requests.sent_seconds, arrived)
            elif kind == "speech_event":
                event = response.speech_event
                yield LiveSpeech(SPEECH_KINDS.get(event.type, "unknown"), event.time, arrived)
            else:  # a newer server's event this client does not know
                log.debug("skipping a live event of kind %s", kind)
    except grpc.RpcError as e:
        _raise_for(e, client.address)
    finally:
        if stop is not None:
            stop.set()
        call.cancel()  # no-op when the stream ended; frees the server if we stop early
    if not done:
        raise ServerError(grpc.StatusCode.UNKNOWN, "the stream ended without `done`")


def _result(msg: pb.StreamingRecognitionResult, sent: float, arrived: float) -> LiveResult:
    tokens = tuple(
        LiveToken(
            index=t.index,
            id=t.id,
            text=t.text,
            logprob=t.logprob,
            peak_time=t.peak_time,
            buffer_offset=msg.buffer_offset,
            row=decode_tensor(t.alignment) if t.HasField("alignment") else None,
        )
        for t in msg.tokens
    )
    return LiveResult(
        is_final=msg.is_final,
        stability=msg.stability,
        text=msg.text,
        tokens=tokens,
        words=tuple(Word(w.word, w.start, w.end, w.probability) for w in msg.words),
        buffer_offset=msg.buffer_offset,
        audio_seconds=msg.audio_seconds,
        sent_seconds=sent,
        arrived=arrived,
    )


def _done(msg: pb.StreamingRecognizeDone) -> LiveDone:
    return LiveDone(
        text=msg.text,
        language=msg.language,
        audio_seconds=msg.audio_seconds,
        final_results=msg.final_results,
        tokens=msg.tokens,
        decode_steps=msg.decode_steps,
        encode_seconds=msg.encode_seconds,
        compute_seconds=msg.compute_seconds,
        total_seconds=msg.total_seconds,
    )


def result_dict(finals: list[LiveResult], done: LiveDone, model: str) -> dict[str, Any]:
    """The finished stream as `xattn transcribe --json` shapes a result: text, language,
    segments (one per final, with its words), tokens; plus when each final arrived."""
    segments = []
    for i, r in enumerate(finals):
        start = r.words[0].start if r.words else r.buffer_offset
        end = r.words[-1].end if r.words else r.audio_seconds
        segments.append(
            {
                "id": i,
                "start": round(start, 3),
                "end": round(end, 3),
                "text": r.text,
                "tokens": [t.id for t in r.tokens],
                "words": [w.to_dict() for w in r.words],
                "buffer_offset": round(r.buffer_offset, 3),
                "decided_at_audio_seconds": round(r.audio_seconds, 3),
                "arrived_seconds": round(r.arrived, 3),
            }
        )
    return {
        "text": done.text,
        "language": done.language,
        "duration": round(done.audio_seconds, 3),
        "model": model,
        "segments": segments,
        "tokens": [t.to_dict() for r in finals for t in r.tokens],
        "timings": {
            "total": round(done.total_seconds, 3),
            "compute": round(done.compute_seconds, 3),
            "encode": round(done.encode_seconds, 3),
            "decode_steps": done.decode_steps,
        },
    }
