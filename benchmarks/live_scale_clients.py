"""The live streams of benchmarks.live_scale, in a process of their own (benchmarks.workers), so
that the clients' CPU is not the server's.

`cases(spec)` builds one case per door and level ("gRPC 4", "Realtime 8"): that many streams
at once, stream i feeding its own clip sequence (`spec["streams"][i]`: clip paths, joined by
1 s of silence) at real time in 100 ms chunks, all started together. Each returns, as JSON,
per stream: its final words with their arrival on the audio clock (live_match's LiveWord:
seconds since the stream's first chunk left; the first chunk leaves 0.1 s after the start, as
xattn.clients.streaming's Pacer sends it), its final text, refusals and the waits they asked.

- gRPC: `StreamingRecognize` through xattn.clients.streaming as `xattn stream` feeds a file
  (live_config's defaults: interim results and the mean rows on); a final's words carry their
  DTW end times.
- Realtime: `/v1/realtime?intent=transcription` over a WebSocket (the `websockets` package),
  `turn_detection: null` (one item: the whole stream, committed when its audio is over, the
  engine path the gRPC stream takes), the audio as 24 kHz PCM16 `input_audio_buffer.append`
  events of 100 ms; words are the `...transcription.delta` texts (no times: None).

A refusal (gRPC RESOURCE_EXHAUSTED, a Realtime `error` of code `server_busy`) is waited out as
it asks (benchmarks.load_clients' hint parsing) and the stream starts again from its first
chunk, at most RETRIES times; a stream never taken counts as not served.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import grpc
import numpy as np

from benchmarks.live_match import norm, words_of
from benchmarks.load_clients import DEFAULT_WAIT, HINTED, grpc_wait
from xattn.clients.api import ServerError
from xattn.clients.streaming import CHUNK_SECONDS, RATE, live_config, read_pcm16

GAP_SECONDS = 1.0  # silence between two clips of a stream
REALTIME_RATE = 24000  # OpenAI's audio/pcm
RETRIES = 3  # starts of a refused stream, at most
DRAIN = 600.0  # seconds a Realtime stream may take to complete after its audio
Stream = dict[str, Any]


class Refused(Exception):
    def __init__(self, wait: float, message: str) -> None:
        super().__init__(message)
        self.wait = wait


def feed(paths: list[str]) -> bytes:
    """A stream's audio: its clips as 16 kHz int16, 1 s of silence between them."""
    gap = bytes(2 * int(GAP_SECONDS * RATE))
    return gap.join(read_pcm16(p) for p in paths)


def to_24k(pcm: bytes) -> bytes:
    """16 kHz int16 mono -> 24 kHz int16 mono (FFmpeg's resampler through PyAV)."""
    frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, "<i2")[None], format="s16", layout="mono")
    frame.sample_rate = RATE
    resampler = av.AudioResampler(format="s16", layout="mono", rate=REALTIME_RATE)
    out = [*resampler.resample(frame), *resampler.resample(None)]
    return b"".join(f.to_ndarray().astype("<i2").tobytes() for f in out)


def hinted_wait(message: str) -> float:
    """Seconds a refusal's message asks to wait ("retry in about N ms")."""
    found = HINTED.search(message)
    return int(found.group(1)) / 1000 if found else DEFAULT_WAIT


def grpc_stream(address: str, pcm: bytes) -> Stream:
    """One gRPC live stream at real time: its words, text and the server's step figures."""
    from benchmarks.streaming import stream_finals

    try:
        finals, _, done = stream_finals(address, pcm, 1.0, live_config())
    except ServerError as e:
        cause = e.__cause__
        wait = grpc_wait(cause) if isinstance(cause, grpc.RpcError) else None
        if e.code == "RESOURCE_EXHAUSTED":
            raise Refused(wait if wait is not None else hinted_wait(e.details), str(e)) from e
        raise
    words = [[norm(w.word), w.end, r.arrived] for r in finals for w in r.words]
    return {
        "words": [w for w in words if w[0]],
        "text": done.text,
        "steps": done.decode_steps,
        "encode s": done.encode_seconds,
    }


async def _realtime(port: int, pcm24: bytes) -> Stream:
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
    words: list[list[Any]] = []
    texts: list[str] = []
    step = int(CHUNK_SECONDS * REALTIME_RATE) * 2
    async with connect(url, max_size=None, open_timeout=60, ping_interval=None) as ws:
        update = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        start = time.monotonic()
        sent = asyncio.Event()

        async def send() -> None:
            for at in range(0, len(pcm24), step):
                chunk = pcm24[at : at + step]
                due = start + (at + len(chunk)) / 2 / REALTIME_RATE
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                audio = base64.b64encode(chunk).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            sent.set()

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(len(pcm24) / 2 / REALTIME_RATE + DRAIN):
                async for message in ws:
                    event = json.loads(message)
                    kind, arrived = event["type"], time.monotonic() - start
                    if kind == "conversation.item.input_audio_transcription.delta":
                        words += [[w, None, arrived] for w in words_of(event["delta"])]
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        texts.append(event["transcript"])
                        if sent.is_set():
                            break
                    elif kind == "error":
                        error = event["error"]
                        if error.get("code") == "server_busy":
                            raise Refused(hinted_wait(error["message"]), error["message"])
                        raise RuntimeError(f"Realtime error: {error}")
        finally:
            sender.cancel()
    return {"words": words, "text": " ".join(t.strip() for t in texts), "steps": None}


def realtime_stream(port: int, pcm24: bytes) -> Stream:
    return asyncio.run(_realtime(port, pcm24))


def served(start: Callable[[], Stream], audio_seconds: float) -> Stream:
    """start() until it is not refused (at most RETRIES times): its figures, with the
    refusals, the waits they asked (ms) and an error (None: it ran to its end)."""
    hints: list[int] = []
    t0 = time.perf_counter()
    for _ in range(RETRIES):
        try:
            out = start() | {"error": None}
            break
        except Refused as e:
            hints.append(round(e.wait * 1000))
            time.sleep(e.wait)
        except Exception as e:  # noqa: BLE001 - a failed stream is a figure, not an end
            out = {"words": [], "text": "", "steps": None, "error": f"{type(e).__name__}: {e}"}
            break
    else:
        out = {"words": [], "text": "", "steps": None, "error": "refused every time"}
    return out | {
        "refusals": len(hints),
        "retry hints ms": hints,
        "audio s": audio_seconds,
        "wall s": time.perf_counter() - t0,
    }


def level(make: Callable[[int], Callable[[], Stream]], n: int, seconds: list[float]) -> str:
    """`n` streams at once (stream i: make(i)()); JSON of each stream's figures."""
    starts = [make(i) for i in range(n)]
    gate = threading.Barrier(n)

    def run(i: int) -> Stream:
        gate.wait()
        return served(starts[i], seconds[i])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        streams = list(pool.map(run, range(n)))
    return json.dumps({"streams": streams, "wall s": time.perf_counter() - t0})


def cases(spec: Mapping[str, Any]) -> dict[str, Callable[[], str]]:
    """{"<door> <n>": run() -> JSON} for every door of `spec` ("gRPC": address, "Realtime":
    HTTP port) and level of `spec["levels"]`; `spec["streams"]`: each stream's clip paths."""
    pcms = [feed(paths) for paths in spec["streams"]]
    seconds = [len(p) / 2 / RATE for p in pcms]
    out: dict[str, Callable[[], str]] = {}
    if "gRPC" in spec:
        address = spec["gRPC"]
        grpc_make = lambda i: lambda: grpc_stream(address, pcms[i])  # noqa: E731
        for n in spec["levels"]:
            out[f"gRPC {n}"] = lambda n=n: level(grpc_make, n, seconds)
    if "Realtime" in spec:
        port, pcm24 = spec["Realtime"], [to_24k(p) for p in pcms]
        rt_make = lambda i: lambda: realtime_stream(port, pcm24[i])  # noqa: E731
        for n in spec["levels"]:
            out[f"Realtime {n}"] = lambda n=n: level(rt_make, n, seconds)
    return out
