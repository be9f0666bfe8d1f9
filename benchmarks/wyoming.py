"""Wyoming speech-to-text servers side by side, in one run on one host: xattn (streamed and
batch) and wyoming-faster-whisper (Home Assistant's standard server: its defaults, and int8),
the same CTranslate2 weights, the same CPU threads.

    nice -n 10 .venv/bin/python -m benchmarks.wyoming                  # tiny.en and base
    nice -n 10 .venv/bin/python -m benchmarks.wyoming --models tiny.en --sentences 4

The corpus (benchmarks.wyoming_setup): 12 voice commands spoken by espeak-ng and the English
clips of ../shared/eval up to 12 s, 16 kHz 16-bit mono, each followed by `--trailing` seconds
of silence before audio-stop (a satellite's voice activity detection ends a command so).

Every server is started first and each sample goes to each server in turn, so that the load
of a busy machine falls on all of them alike (idle servers cost nothing meanwhile).
Our client (the `wyoming` library's AsyncTcpClient, reading while it sends) feeds each
command at real time (1024-sample chunks on a schedule, as a satellite streams the
microphone) and as fast as the socket takes it, and measures:
- stop: from audio-stop written to the final `transcript` read (what the user waits for);
- first partial: from audio-start to the first `transcript-chunk`; "before speech end" counts
  the commands whose first partial came before their speech ended (real-time feed);
- RTF: from audio-start to the transcript, over the audio's seconds (at real time at least 1);
- WER: word errors over reference words (openai-whisper's English normaliser, jiwer).
wyoming-bench cannot time audio-stop (its clock starts before `transcribe`), so that part is
ours; `wyoming-bench stt` also runs against every server (--bench), and its own summary per
mode (non_streaming: audio as fast as possible; streaming: --chunk-delay at real time) is kept
beside ours. Results: benchmarks/results/wyoming/ (python -m benchmarks.render).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient

from benchmarks import results
from benchmarks.wer import errors
from benchmarks.wyoming_setup import (
    BENCH,
    CACHE,
    PEER,
    Peer,
    Process,
    Sample,
    Xattn,
    bench_binary,
    corpus,
    write_corpus,
)

CHUNK = 1024  # samples per audio-chunk (wyoming-bench's default; 64 ms)
RATE = 16000


@dataclass(frozen=True)
class Measurement:
    server: str
    model: str
    feed: str  # "real time" or "fast"
    sample: str
    speech: float  # seconds of speech (the trailing silence aside)
    stop: float | None  # audio-stop -> transcript, s
    first_partial: float | None  # audio-start -> first transcript-chunk, s
    total: float | None  # audio-start -> transcript, s
    audio: float  # seconds sent, trailing silence included
    text: str
    errors: int
    words: int
    failure: str | None = None


async def measure(
    port: int, server: str, model: str, sample: Sample, realtime: bool, trailing: float
) -> Measurement:
    """One command on a fresh connection, read while it is sent."""
    pcm = sample.pcm + bytes(2 * round(trailing * RATE))
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    stamps: dict[str, float] = {}
    text, failure = "", None

    async def read() -> None:
        nonlocal text, failure
        streamed = False
        while (event := await asyncio.wait_for(client.read_event(), 600)) is not None:
            now = time.perf_counter()
            if event.type == "error":
                failure = f"{event.data.get('code')}: {event.data.get('text')}"
                return
            streamed |= event.type == "transcript-start"
            if event.type == "transcript-chunk":
                stamps.setdefault("first", now)
            if event.type == "transcript":
                stamps["final"], text = now, event.data["text"]
                if not streamed:
                    return
            if event.type == "transcript-stop":
                return

    reader = asyncio.create_task(read())
    await client.write_event(Transcribe(name=model, language="en").event())
    t0 = time.perf_counter()
    await client.write_event(AudioStart(RATE, 2, 1).event())
    for i in range(0, len(pcm), 2 * CHUNK):
        await client.write_event(AudioChunk(RATE, 2, 1, pcm[i : i + 2 * CHUNK]).event())
        if realtime:  # on a schedule: late chunks do not push the later ones back
            await asyncio.sleep(max(0.0, t0 + (i + 2 * CHUNK) / (2 * RATE) - time.perf_counter()))
    await client.write_event(AudioStop().event())
    t_stop = time.perf_counter()
    try:
        await reader
    finally:
        await client.disconnect()
    final, first = stamps.get("final"), stamps.get("first")
    wrong, words = errors(sample.text, text, "en")
    return Measurement(
        server=server,
        model=model,
        feed="real time" if realtime else "fast",
        sample=sample.id,
        speech=sample.seconds,
        stop=final - t_stop if final is not None else None,
        first_partial=first - t0 if first is not None else None,
        total=final - t0 if final is not None else None,
        audio=len(pcm) / (2 * RATE),
        text=text,
        errors=wrong,
        words=words,
        failure=failure or (None if final is not None else "no transcript"),
    )


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    rank = 0.95 * (len(ordered) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def row(ms: list[Measurement]) -> dict:
    """One (server, model, feed): medians and p95, counts."""
    ok = [m for m in ms if m.failure is None]
    stops = [m.stop for m in ok if m.stop is not None]
    firsts = [m.first_partial for m in ok if m.first_partial is not None]
    early = sum(1 for m in ok if m.first_partial is not None and m.first_partial < m.speech)
    rtf = [m.total / m.audio for m in ok if m.total is not None]
    wrong, words = sum(m.errors for m in ok), sum(m.words for m in ok)
    return {
        "server": ms[0].server,
        "model": ms[0].model,
        "feed": ms[0].feed,
        "commands": f"{len(ok)}/{len(ms)}",
        "stop median s": round(statistics.median(stops), 3) if stops else None,
        "stop p95 s": round(p95(stops), 3) if stops else None,
        "first partial median s": round(statistics.median(firsts), 3) if firsts else None,
        "partial before speech end": f"{early}/{len(ok)}" if firsts else "-",
        "RTF median": round(statistics.median(rtf), 3) if rtf else None,
        "WER %": round(100 * wrong / words, 1) if words else None,
        "word errors": f"{wrong}/{words}",
    }


def wyoming_bench(port: int, folder: Path, model: str) -> dict:
    """`wyoming-bench stt` against one server, both modes, one round: its summary per mode
    (pooled WER and edit counts, mean/median/p95 total time, TTFT) and its output."""
    command = [str(bench_binary()), "stt", f"127.0.0.1:{port}", "--corpus", str(folder)]
    command += ["--mode", "both", "--rounds", "1", "--warmup", "1", "--timeout", "600"]
    command += ["--chunk-samples", str(CHUNK), "--chunk-delay", f"{CHUNK / RATE:g}"]
    command += ["--config", json.dumps({"name": model, "language": "en"})]
    out = subprocess.run(command, capture_output=True, text=True, timeout=7200).stdout
    modes: dict[str, dict] = {}
    mode = None
    for line in out.splitlines():
        if m := re.match(r"\[(\w+)\] ok=(\d+) fail=(\d+)", line):
            mode = m.group(1)
            modes[mode] = {"ok": int(m.group(2)), "fail": int(m.group(3))}
        elif mode and (m := re.match(r"\s+(Total|TTFT) \(ms\)\s+(.+)", line)):
            cells = m.group(2).split()  # min mean median p95 max
            for name, cell in zip(("mean", "median", "p95"), cells[1:4], strict=True):
                modes[mode][f"{m.group(1)} {name} ms"] = None if cell == "n/a" else float(cell)
        elif mode and (m := re.search(r"WER=([\d.]+)%", line)):
            modes[mode]["WER %"] = float(m.group(1))
        elif mode and (m := re.search(r"S=(\d+) I=(\d+) D=(\d+)\s+\(ref words=(\d+)\)", line)):
            s, i, d, n = (int(g) for g in m.groups())
            modes[mode]["word errors"] = f"{s + i + d}/{n}"
    skipped = "NOT SUPPORTED" in out
    return {"modes": modes, "streaming skipped": skipped, "output": out[-4000:]}


def servers(models: list[str], threads: int, which: list[str]) -> list[tuple[str, str, object]]:
    """(label, model, factory of a started-later Process) for every server of the run."""
    out: list[tuple[str, str, object]] = []
    for name in which:
        for model in models:
            if name.startswith("xattn"):
                mode = name.split("-")[1]
                out.append((f"xattn {mode}", model, lambda mode=mode: Xattn(models, mode, threads)))
            else:
                compute = None if name == "peer-default" else name.split("-")[1]
                label = f"wyoming-faster-whisper {compute or 'default'}"
                out.append((label, model, lambda m=model, c=compute: Peer(m, c, threads)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    parser.add_argument("--servers", nargs="+", default=["xattn-streamed", "xattn-batch"]
                        + ["peer-default", "peer-int8"])  # fmt: skip
    parser.add_argument("--commands", type=int, default=12, help="spoken commands (<= 12)")
    parser.add_argument("--sentences", type=int, default=11, help="eval clips (<= 12 s)")
    parser.add_argument(
        "--bench-samples", type=int, default=0, help="wyoming-bench's corpus: the first N (0: all)"
    )
    parser.add_argument("--feeds", nargs="+", default=["real time", "fast"])
    parser.add_argument("--trailing", type=float, default=0.5, help="silence before audio-stop")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of every server")
    parser.add_argument(
        "--bench",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run wyoming-bench stt against every server (the first model)",
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    samples = corpus(args.commands, args.sentences)
    folder = CACHE / "wyoming-corpus"  # wyoming-bench's
    write_corpus(folder, samples[: args.bench_samples or None])
    print(f"corpus: {len(samples)} samples, {sum(s.seconds for s in samples):.0f} s of speech")
    measurements: list[Measurement] = []
    bench: dict[str, dict] = {}
    started: dict[str, Process] = {}
    plan = []  # (label, model, port): every server up at once, each sample to each in turn
    try:
        for label, model, factory in servers(args.models, args.threads, args.servers):
            key = label if label.startswith("xattn") else f"{label} {model}"
            if key not in started:
                print(f"starting {key}")
                started[key] = factory().start()  # type: ignore[operator]
            port = started[key].port
            asyncio.run(measure(port, label, model, samples[0], False, args.trailing))  # warm-up
            plan.append((label, model, port))
        for feed in args.feeds:
            for sample in samples:
                for label, model, port in plan:
                    m = asyncio.run(
                        measure(port, label, model, sample, feed == "real time", args.trailing)
                    )
                    measurements.append(m)
                    print(f"{label:32} {model:8} {feed:9} {sample.id:12} stop={m.stop} "
                          f"first={m.first_partial} {m.failure or m.text!r}")  # fmt: skip
        for label, model, port in plan:
            if args.bench and model == args.models[0]:
                bench[label] = wyoming_bench(port, folder, model)
                print(json.dumps(bench[label]["modes"]))
    finally:
        for process in started.values():
            process.stop()
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.server, m.model, m.feed), []).append(m)
    rows = [row(ms) for ms in groups.values()]
    figures = {"per server, model and feed": rows, "goals at real time": goals(rows)}
    if bench:
        figures["wyoming-bench stt (its own figures; tiny.en)"] = [
            {"server": label, "mode": mode, **summary}
            for label, b in bench.items()
            for mode, summary in b["modes"].items()
        ]
    for r in rows:
        print(r)
    settings = {
        "models": args.models,
        "servers": args.servers,
        "samples": [{"id": s.id, "kind": s.kind, "seconds": round(s.seconds, 2)} for s in samples],
        "trailing silence s": args.trailing,
        "chunk samples": CHUNK,
        "threads": args.threads,
        "peer": PEER,
        "bench": BENCH if args.bench else None,
        "bench samples": [s.id for s in samples[: args.bench_samples or None]],
        "load average before": [round(x, 2) for x in load_before],
        "load average after": [round(x, 2) for x in os.getloadavg()],
        "_measurements": [asdict(m) for m in measurements],  # not rendered
    }
    results.write_from(args, "wyoming", settings, figures)


def goals(rows: list[dict]) -> list[dict]:
    """Per model: xattn streamed's median stop time over the peer's at its defaults (goal
    <= 0.5), both WERs, and whether a first partial came before the speech ended."""
    out = []
    realtime = [r for r in rows if r["feed"] == "real time"]
    for model in dict.fromkeys(r["model"] for r in realtime):
        by = {r["server"]: r for r in realtime if r["model"] == model}
        ours, peer = by.get("xattn streamed"), by.get("wyoming-faster-whisper default")
        if ours is None or peer is None or not peer["stop median s"] or not ours["stop median s"]:
            continue
        ratio = ours["stop median s"] / peer["stop median s"]
        out.append({
            "model": model,
            "stop median ratio (goal <= 0.5)": round(ratio, 2),
            "xattn streamed WER %": ours["WER %"],
            "xattn batch WER %": by.get("xattn batch", {}).get("WER %"),
            "peer WER %": peer["WER %"],
            "partial before speech end": ours["partial before speech end"],
        })  # fmt: skip
    return out


if __name__ == "__main__":
    main()
