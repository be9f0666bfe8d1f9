"""`xattn stream AUDIO [--speed X] [--json | --inspect]`: live recognition of a file fed at
real-time pace.

The terminal shows the final text, the interim guess after it (grey, replaced as it
changes) and the heatmap of the finals' rows growing, one line per final token (a new
heatmap each time the server's buffer slides). `--json` prints the finished stream on
stdout as `xattn transcribe --json` does; `--inspect [--port N] [--open]` serves the
inspection page following the stream instead (clients/stream_inspect.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.text import Text

from xattn.clients.api import connect
from xattn.clients.data import FRAMES, FRAMES_PER_SECOND, ModelInfo, Token, Window
from xattn.clients.render.terminal import heatmap
from xattn.clients.streaming import (
    LiveDone,
    LiveResult,
    live_config,
    read_pcm16,
    result_dict,
    stream_pcm,
)


def positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The stream subcommand's own flags (AUDIO, --server, --language ... come from cli)."""
    parser.add_argument(
        "--speed", type=positive, default=1.0, help="times real time to feed the audio (default 1)"
    )
    parser.add_argument("--json", action="store_true", help="the final result as JSON on stdout")
    parser.add_argument(
        "--commit-margin", type=float, help="seconds of audio a token's attention must leave"
    )
    parser.add_argument(
        "--inspect",
        action="store_true",
        help="serve the inspection page on 127.0.0.1, following the live stream",
    )
    parser.add_argument("--port", type=int, default=0, help="port for --inspect (0: a free one)")
    parser.add_argument("--open", action="store_true", help="open the --inspect page in a browser")


class StreamView:
    """What `xattn stream` shows while the stream runs; feed it events with `update`."""

    def __init__(self, info: ModelInfo, source: str, duration: float, speed: float) -> None:
        self.info, self.source, self.duration, self.speed = info, source, duration, speed
        self.finals: list[LiveResult] = []
        self.interim: LiveResult | None = None
        self.windows: list[Window] = []
        self.done: LiveDone | None = None
        self.started = time.monotonic()

    def update(self, event: LiveResult | LiveDone) -> None:
        if isinstance(event, LiveDone):
            self.done, self.interim = event, None
            return
        if not event.is_final:
            self.interim = event
            return
        self.finals.append(event)
        self.interim = None
        if not self.windows or abs(self.windows[-1].offset - event.buffer_offset) > 1e-6:
            self.windows.append(Window(len(self.windows), event.buffer_offset, 0, ""))
        window = self.windows[-1]
        frames = int((event.audio_seconds - event.buffer_offset) * FRAMES_PER_SECOND)
        window.num_frames = max(window.num_frames, min(FRAMES, frames))
        for t in event.tokens:
            window.tokens.append(
                Token(
                    index=t.index,
                    id=t.id,
                    text=t.text,
                    logprob=t.logprob,
                    window=window.window,
                    kind="text",
                    row=t.row,
                    peak_frame=t.peak_frame,
                    offset=t.buffer_offset,
                )
            )

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.done is None:
            heard = (time.monotonic() - self.started) * self.speed
            status = (
                f"{self.info.name} · streaming {self.source} at {self.speed:g}x · "
                f"{min(heard, self.duration):.1f} of {self.duration:.1f} s sent"
            )
        else:
            d = self.done
            status = (
                f"{self.info.name} · {d.audio_seconds:.2f} s of audio · {d.final_results} finals,"
                f" {d.tokens} tokens · {d.decode_steps} decodes "
                f"({d.encode_seconds / max(1, d.decode_steps) * 1000:.0f} ms encoder each)"
            )
        text = Text("".join(r.text for r in self.finals))
        if self.interim is not None:
            text.append(self.interim.text, style="grey50 italic")
        parts: list = [Text(status, style="cyan"), text]
        if self.windows:
            rows = max(4, (options.height or console.height) - 10)
            picked = [0]  # the rows are the alignment-head mean
            parts.append(heatmap(self.windows[-1], picked, options.max_width, max_rows=rows))
        yield Group(*parts)


def run(args: argparse.Namespace, console: Console, err: Console) -> int:
    """Stream `args.audio` to `args.server`; raises xattn.clients.api's errors (cli maps them)."""
    pcm = read_pcm16(args.audio)
    duration = len(pcm) / 2 / 16000
    token = args.token  # cli.main resolved --token-file into it
    with connect(args.server, ca_file=args.ca, timeout=args.timeout, token=token) as client:
        info = client.info()
        config = live_config(
            language=args.language, interim=not args.json, commit_margin=args.commit_margin
        )
        events = stream_pcm(client, pcm, speed=args.speed, config=config, token=token)
        finals: list[LiveResult] = []
        done: LiveDone | None = None
        view = None if args.json else StreamView(info, args.audio, duration, args.speed)
        live = Live(view, console=console, refresh_per_second=10) if view else None
        if live is not None:
            live.start()
        try:
            for event in events:
                if view is not None:
                    view.update(event)
                if isinstance(event, LiveDone):
                    done = event
                elif event.is_final:
                    finals.append(event)
        finally:
            if live is not None:
                live.stop()
    if done is None:  # stream_pcm raises first; kept for the type checker
        raise RuntimeError("the stream ended without `done`")
    if args.json:
        result = result_dict(finals, done, info.name)
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
        sys.stdout.flush()
    return 0
