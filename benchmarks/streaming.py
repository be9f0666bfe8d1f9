"""Live recognition: how long after a word is spoken does its final arrive, and at what cost.

    python -m benchmarks.streaming [--clip ../shared/audio/jfk.flac] [--repeat 2] [--speed 1]
                                   [--streams 4] [--live-workers 2] [--commit-margin S]

A real server (tiny.en, in this process) and real channels. The clip (repeated `--repeat`
times with 1 s of silence between) is sent as 100 ms int16 chunks at `--speed` x real time.

- Reference end times: one Transcribe of the same audio with word timestamps. Final words
  pair with reference words of the same text (normalised) whose end lies within 1 s of
  their own, in order (benchmarks.live_match.matched_delays).
- Commit delay of a word: (wall time from the stream's start to its final's arrival) x
  speed - the word's reference end. Median and p90 (targets: <= 1.5 s and <= 2.5 s).
- Compute per audio second: this process's CPU seconds (server and client, all threads)
  over the audio seconds streamed, and the server's step wall time per audio second.
- Encoder cost: the encoder passes' wall time per decode step (every step re-encodes the
  whole buffer: Whisper's encoder cannot run on the new audio alone).
Then the same with `--streams` concurrent live streams.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import results
from benchmarks.live_match import matched_delays, norm
from xattn.clients.api import connect
from xattn.clients.streaming import (
    CHUNK_SECONDS,
    LiveDone,
    LiveResult,
    live_config,
    read_pcm16,
    stream_pcm,
)
from xattn.model.pipeline import load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIP = ROOT.parent / "shared" / "audio" / "jfk.flac"
RATE = 16000


@dataclass
class Run:
    delays: list[float]  # seconds, one per matched word
    matched: int
    reference_words: int
    done: LiveDone
    first_interim: float | None  # audio clock of the first interim result


def reference_words(address: str, pcm: bytes) -> list[tuple[str, float]]:
    """(word, end) of an offline Transcribe of the same PCM, greedy, with word timestamps."""
    with connect(address) as client:
        stub = transcriber_pb2_grpc.TranscriberStub(client._channel)  # no public stub in api
        request = pb.TranscribeRequest(
            audio=pb.Audio(pcm=pb.Pcm(data=pcm, sample_rate=RATE, encoding=pb.PCM_ENCODING_INT16)),
            options=pb.TranscriptionOptions(word_timestamps=True, temperatures=[0.0]),
        )
        response = stub.Transcribe(request, timeout=600)
    return [(w.word, w.end) for s in response.transcript.segments for w in s.words]


def stream_finals(
    address: str,
    pcm: bytes,
    speed: float,
    config: pb.StreamingRecognitionConfig,
    chunk_seconds: float = CHUNK_SECONDS,
) -> tuple[list[LiveResult], float | None, LiveDone]:
    """One live stream of `pcm` at `speed` x real time: its finals, the audio clock of its
    first interim result (None: none came) and its done."""
    finals: list[LiveResult] = []
    first_interim = None
    done = None
    with connect(address) as client:
        events = stream_pcm(client, pcm, speed, config, chunk_seconds=chunk_seconds)
        for event in events:
            if isinstance(event, LiveDone):
                done = event
            elif not isinstance(event, LiveResult):
                continue  # a speech event (vad)
            elif event.is_final:
                finals.append(event)
            elif first_interim is None:
                first_interim = event.arrived * speed
    assert done is not None
    return finals, first_interim, done


def one_stream(
    address: str,
    pcm: bytes,
    speed: float,
    ref: list[tuple[str, float]],
    margin: float | None,
    alignment: str = "mean",
    chunk_seconds: float = CHUNK_SECONDS,
) -> Run:
    config = live_config(interim=True, commit_margin=margin, alignment=alignment)
    finals, first_interim, done = stream_finals(address, pcm, speed, config, chunk_seconds)
    live = [(norm(w.word), w.end, r.arrived * speed) for r in finals for w in r.words]
    delays = matched_delays(ref, live)
    return Run(delays, len(delays), len(ref), done, first_interim)


def summary(
    label: str, runs: list[Run], audio_seconds: float, cpu: float, wall: float
) -> dict[str, object]:
    """Prints one level's figures and returns them (a row of the results file)."""
    delays = [d for r in runs for d in r.delays]
    steps = sum(r.done.decode_steps for r in runs)
    encode = sum(r.done.encode_seconds for r in runs)
    compute = sum(r.done.compute_seconds for r in runs)
    total_audio = audio_seconds * len(runs)
    median = statistics.median(delays)
    p90 = float(np.percentile(delays, 90))
    matched = sum(r.matched for r in runs)
    ref = sum(r.reference_words for r in runs)
    first = [r.first_interim for r in runs if r.first_interim is not None]
    print(f"== {label}")
    print(
        f"commit delay: median {median:.2f} s (target <= 1.5), p90 {p90:.2f} s (target <= 2.5),"
        f" max {max(delays):.2f} s over {matched}/{ref} matched words"
    )
    if first:
        print(f"first interim at audio clock {statistics.median(first):.2f} s (median)")
    print(
        f"compute: {cpu / total_audio:.3f} CPU s per audio s (process, all threads); "
        f"server steps {compute / total_audio:.3f} wall s per audio s; wall {wall:.1f} s"
    )
    print(
        f"decode steps: {steps} ({steps / total_audio:.2f} per audio s), encoder "
        f"{encode / steps * 1000:.0f} ms per step, whole step {compute / steps * 1000:.0f} ms"
    )
    for r in runs[:1]:
        print(f"text: {r.done.text!r}")
    return {
        "streams": len(runs),
        "commit delay median s": round(median, 2),
        "p90 s": round(p90, 2),
        "max s": round(max(delays), 2),
        "matched words": f"{matched}/{ref}",
        "first interim s": round(statistics.median(first), 2) if first else None,
        "CPU s per audio s": round(cpu / total_audio, 3),
        "step wall s per audio s": round(compute / total_audio, 3),
        "decode steps per audio s": round(steps / total_audio, 2),
        "encoder ms/step": round(encode / steps * 1000),
        "step ms": round(compute / steps * 1000),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument("--repeat", type=int, default=2, help="clip repeats, 1 s apart")
    parser.add_argument("--speed", type=float, default=1.0, help="times real time")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams, 2nd part")
    parser.add_argument("--live-workers", type=int, default=ServerConfig.live_workers)
    parser.add_argument("--commit-margin", type=float, default=None)
    parser.add_argument("--compute", default="auto", help="fp32, bf16-encoder or auto")
    results.add_arguments(parser)
    args = parser.parse_args(argv)

    clip = read_pcm16(args.clip)
    gap = bytes(2 * RATE)
    pcm = gap.join([clip] * args.repeat)
    audio_seconds = len(pcm) / 2 / RATE
    pipe = load_pipeline("tiny.en", compute=args.compute)
    config = ServerConfig(
        port=0,
        live_workers=args.live_workers,
        max_queue=max(8, args.streams),
        max_live_streams=args.streams,  # the policy measured, not the admission
    )
    print(
        f"tiny.en, {audio_seconds:.1f} s of audio ({args.clip.name} x {args.repeat}), speed "
        f"{args.speed:g}x, {os.cpu_count()} CPUs, torch threads {pipe_threads()}, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    levels = []
    with BackgroundServer(config, pipe) as server:
        ref = reference_words(server.address, pcm)
        for n in sorted({1, args.streams}):
            cpu0, t0 = time.process_time(), time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                futures = [
                    pool.submit(
                        one_stream, server.address, pcm, args.speed, ref, args.commit_margin
                    )
                    for _ in range(n)
                ]
                runs = [f.result() for f in futures]
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            levels.append(summary(f"{n} live stream(s)", runs, audio_seconds, cpu, wall))
        print(f"engine: {server.engine.counters()}")
    settings = {
        "model": "tiny.en",
        "compute": pipe.compute,
        "clip": args.clip.name,
        "repeat": args.repeat,
        "audio seconds": round(audio_seconds, 1),
        "speed": args.speed,
        "live workers": args.live_workers,
        "commit margin": args.commit_margin,
        "torch threads": pipe_threads(),
    }
    figures = {"live streams at real-time pace": levels, "text": runs[0].done.text}
    results.write_from(args, "streaming", settings, figures)


def pipe_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
