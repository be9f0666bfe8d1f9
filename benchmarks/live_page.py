"""The live page's latency: from the audio leaving the microphone to the final on the page.

    python -m benchmarks.live_page [--clip ../shared/audio/jfk.flac] [--repeat 1] [--tabs 4]
                                   [--json FILE|DIR | --no-json]

A real server (tiny.en, in this process), the bridge (`xattn live --serve`, a subprocess)
and Debian's Chromium, whose fake microphone plays the clip (repeated `--repeat` times,
1 s apart) from a WAV. For 1 tab and for `--tabs` tabs recording at once:

- page: the commit delay of a word = (when its final reached the page - when the first
  sample left the microphone) - the word's end in an offline Transcribe (word timestamps,
  greedy) of exactly the audio that tab sent (its recording, so both share one clock). The
  first sample left the microphone one chunk (40 ms) before the first chunk reached the page.
- bridge -> page: per final, the page's receipt minus the bridge's receipt of that result
  from gRPC (one machine, one clock): what the bridge and the page add on the way back.
- page -> bridge backlog: per final, the audio the page had sent minus the audio the bridge
  had forwarded to gRPC when the result came (so it includes the way back, and up to one
  40 ms chunk): what the way in adds.
- gRPC only: benchmarks.streaming.one_stream on the clip's audio (100 ms chunks at 1x, the
  mean row), as many streams at once: what `benchmarks/streaming.py` measures; and "as the
  bridge asks": the page's 40 ms chunks with every head's row (the page's views need them),
  the same requests the bridge makes.
- bridge only: a Python WebSocket client in each tab's place, the page's chunks at 1x through
  the bridge, no browser: the gap to "gRPC only, as the bridge asks" is what the bridge adds;
  the gap from there to the page is Chromium's (capture, worklet, drawing: on a 2-core host
  it competes with the model for the CPU).
- Then, at 1 tab, one page and one gRPC-only stream (as the bridge asks) at the same time:
  the same load for both (the other levels run one after the other, and on a busy host the
  load differs between them).
Words are matched to the reference by text and end time (benchmarks.live_match.s
`matched_delays`). Timings on a shared, busy host vary by the decode steps' length: say so
with them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from websockets.sync.client import connect as ws_connect

from benchmarks import results
from benchmarks.live_match import matched_delays, norm
from benchmarks.streaming import DEFAULT_CLIP, Run, one_stream, reference_words
from xattn.clients.streaming import CHUNK_SECONDS, Pacer, read_pcm16
from xattn.model.pipeline import load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
RATE = 16000
CHUNK_MS = 40.0  # the page's chunk (clients/render/assets/live.js)
GRPC_ONLY = "gRPC only (benchmarks/streaming.py)"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
ARGS += ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
AUTO_STOP = """(after) => setInterval(() => {
  if (xattnLive.phase === "recording" && xattnLive.sentSeconds > after)
    document.getElementById("stop").click();
}, 10)"""


def start_bridge(address: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "xattn.clients.cli", "live", "--serve", "--server", address],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:  # type: ignore[union-attr]
        if "live page at " in line:
            return proc, line.split("live page at ", 1)[1].split()[0]
    raise RuntimeError("the bridge did not start")


def wait(page: Any, expression: str, timeout: float) -> None:
    """Poll (the page's CSP forbids the eval that wait_for_function needs)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(expression)
        time.sleep(0.05)


def page_level(
    browser: Any, url: str, tabs: int, seconds: float, address: str, beside: bytes = b""
) -> list[dict]:
    """`tabs` tabs recording at once; `beside`: this PCM streamed over gRPC alone at the same
    time (one more stream, in this process), so both share the host's load."""
    contexts = [browser.new_context() for _ in range(tabs)]
    pages = [c.new_page() for c in contexts]
    errors: list[str] = []
    for page in pages:
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url)
        page.evaluate(AUTO_STOP, seconds + 0.6)
    pool = ThreadPoolExecutor(1)
    ref = reference_words(address, beside) if beside else []
    for page in pages:
        page.click("#record")
    asks = ("all", CHUNK_MS / 1000)  # what the bridge forwards: every head, 40 ms chunks
    grpc = pool.submit(one_stream, address, beside, 1.0, ref, None, *asks) if beside else None
    delays, hops, backlog, matched, words = [], [], [], 0, 0
    try:
        for page in pages:
            wait(page, "['done', 'failed'].includes(xattnLive.phase)", 120 + 2 * seconds)
            if page.evaluate("xattnLive.phase") != "done":
                raise RuntimeError(page.evaluate("xattnLive.message"))
            finals = page.evaluate("xattnLive.finals")
            first = page.evaluate("xattnLive.firstChunkAt")  # ms: the first chunk's start
            pcm = base64.b64decode(page.evaluate("xattnLive.recordedPcm()"))
            ref = reference_words(address, pcm)
            live = [
                (norm(w["word"]), w["end"], (f["at"] - first) / 1000)
                for f in finals
                for w in f["words"]
            ]
            found = matched_delays(ref, live)
            delays += found
            matched, words = matched + len(found), words + len(ref)
            hops += [f["wall"] - f["bridgeMs"] for f in finals]
            backlog += [f["backlog"] for f in finals]
    finally:
        for c in contexts:
            c.close()
    if errors:
        raise RuntimeError(f"console errors: {errors}")
    rows = []
    if grpc is not None:
        run = grpc.result()
        rows.append(
            {
                "path": "gRPC only, beside the page",
                "tabs": tabs,
                "median s": round(statistics.median(run.delays), 2),
                "p90 s": round(float(np.percentile(run.delays, 90)), 2),
                "matched words": f"{run.matched}/{run.reference_words}",
            }
        )
    pool.shutdown()
    return rows + [
        {
            "path": "page (Chromium + bridge)" + (", beside gRPC" if beside else ""),
            "tabs": tabs,
            "median s": round(statistics.median(delays), 2),
            "p90 s": round(float(np.percentile(delays, 90)), 2),
            "matched words": f"{matched}/{words}",
            "bridge->page median ms": round(statistics.median(hops), 1),
            "bridge->page p90 ms": round(float(np.percentile(hops, 90)), 1),
            "bridge->page max ms": round(max(hops), 1),
            "page->bridge backlog median ms": round(1000 * statistics.median(backlog), 1),
            "page->bridge backlog max ms": round(1000 * max(backlog), 1),
        }
    ]


def grpc_level(address: str, pcm: bytes, streams: int, as_the_bridge: bool = False) -> dict:
    """gRPC alone: benchmarks/streaming.py's stream (100 ms chunks, the mean row), or with
    what the bridge forwards (the page's 40 ms chunks, every head's row)."""
    ref = reference_words(address, pcm)
    alignment, chunk = ("all", CHUNK_MS / 1000) if as_the_bridge else ("mean", CHUNK_SECONDS)

    def one(_: int) -> Run:
        return one_stream(address, pcm, 1.0, ref, None, alignment, chunk)

    with ThreadPoolExecutor(streams) as pool:
        runs = list(pool.map(one, range(streams)))
    delays = [d for r in runs for d in r.delays]
    return {
        "path": "gRPC only, as the bridge asks" if as_the_bridge else GRPC_ONLY,
        "tabs": streams,
        "median s": round(statistics.median(delays), 2),
        "p90 s": round(float(np.percentile(delays, 90)), 2),
        "matched words": f"{sum(r.matched for r in runs)}/{sum(r.reference_words for r in runs)}",
    }


def socket_stream(url: str, pcm: bytes, ref: list[tuple[str, float]]) -> list[float]:
    """A Python WebSocket client in the page's place: its 40 ms chunks at 1x through the bridge,
    each word's delay from when its final arrived (no browser: what the bridge adds)."""
    base = url.rstrip("/")
    words: list[tuple[str, float, float]] = []
    with ws_connect("ws" + base.removeprefix("http") + "/ws", origin=base) as ws:  # type: ignore[arg-type]
        ws.send(json.dumps({"type": "start"}))
        pacer = Pacer(pcm, 1.0, CHUNK_MS / 1000)

        def send() -> None:
            for chunk in pacer:
                ws.send(chunk)
            ws.send(json.dumps({"type": "stop"}))

        start = time.monotonic()
        sender = threading.Thread(target=send)
        sender.start()
        for message in ws:  # until the bridge closes after `done`
            arrived = time.monotonic() - start
            for ev in json.loads(message):
                if ev["type"] == "segment":
                    words += [(norm(w["word"]), w["end"], arrived) for w in ev["words"]]
        sender.join()
    return matched_delays(ref, words)


def socket_level(url: str, address: str, pcm: bytes, streams: int) -> dict:
    ref = reference_words(address, pcm)
    with ThreadPoolExecutor(streams) as pool:
        found = list(pool.map(lambda _: socket_stream(url, pcm, ref), range(streams)))
    delays = [d for f in found for d in f]
    return {
        "path": "bridge only (a Python WebSocket client)",
        "tabs": streams,
        "median s": round(statistics.median(delays), 2),
        "p90 s": round(float(np.percentile(delays, 90)), 2),
        "matched words": f"{len(delays)}/{len(ref) * streams}",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument("--repeat", type=int, default=1, help="clip repeats, 1 s apart")
    parser.add_argument("--tabs", type=int, default=4, help="tabs at once, 2nd level")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    pcm = bytes(2 * RATE).join([read_pcm16(args.clip)] * args.repeat)
    seconds = len(pcm) / 2 / RATE
    load = os.getloadavg()[0]
    print(f"tiny.en, {seconds:.1f} s ({args.clip.name} x {args.repeat}), load average {load:.2f}")
    rows = []
    config = ServerConfig(port=0, max_queue=max(8, args.tabs), max_live_streams=args.tabs)
    with (
        tempfile.TemporaryDirectory() as tmp,
        BackgroundServer(config, load_pipeline("tiny.en")) as server,
    ):
        wav = Path(tmp) / "mic.wav"
        soundfile.write(wav, np.frombuffer(pcm, "<i2"), RATE, subtype="PCM_16")
        bridge, url = start_bridge(server.address)
        try:
            with sync_playwright() as p:
                mic = f"--use-file-for-fake-audio-capture={wav}%noloop"
                browser = p.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, mic])
                for n in sorted({1, args.tabs}):
                    level = [grpc_level(server.address, pcm, n)]
                    level += [grpc_level(server.address, pcm, n, as_the_bridge=True)]
                    level += [socket_level(url, server.address, pcm, n)]
                    level += page_level(browser, url, n, seconds, server.address)
                    if n == 1:  # the same load for both: one tab and one gRPC stream at once
                        level += page_level(browser, url, 1, seconds, server.address, pcm)
                    for row in level:
                        print(row)
                    rows += level
                browser.close()
        finally:
            bridge.terminate()
            bridge.wait(10)
    settings = {
        "model": "tiny.en",
        "clip": args.clip.name,
        "repeat": args.repeat,
        "audio seconds": round(seconds, 1),
        "page chunk ms": CHUNK_MS,
        "gRPC chunk ms": 100,
        "load average at start": round(load, 2),
    }
    results.write_from(args, "live_page", settings, {"word commit delay": rows})


if __name__ == "__main__":
    main()
