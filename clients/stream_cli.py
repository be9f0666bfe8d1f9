"""`xattn stream AUDIO [--speed X] [--json | --inspect]`: live recognition of a file fed at
real-time pace; `xattn stream - [--rate R --channels C --format s16le|f32le]`: of raw PCM
read from standard input as it comes (arecord, sox, parec, ffmpeg ... | xattn stream -).
`xattn listen` (clients/listen.py) and the page's bridge (clients/bridge.py) feed the same
path, `run_chunks` / `streaming.stream_chunks`.

The stream of a pipe ends at the end of its input; Ctrl-C ends it cleanly (the audio so far
is decoded, every final shown), a second Ctrl-C at once.

The terminal shows the final text, the interim guess after it (grey, replaced as it changes)
and the heatmap of the finals' rows growing, one line per final token (a new heatmap each
time the server's buffer slides). `--json` prints the finished stream on
stdout as `xattn transcribe --json` does; `--inspect [--port N] [--open]` serves the
inspection page following the stream instead (clients/stream_inspect.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.text import Text

from xattn.clients.api import AudioFileError, Client, connect
from xattn.clients.data import FRAMES, FRAMES_PER_SECOND, ModelInfo, Token, Window
from xattn.clients.pcm import SAMPLES, PcmFormat, PcmQueue, read_pipe
from xattn.clients.render.terminal import heatmap
from xattn.clients.streaming import (
    LiveDone,
    LiveEvent,
    LiveResult,
    LiveSpeech,
    live_config,
    read_pcm16,
    result_dict,
    stream_chunks,
    stream_pcm,
)
from xattn.v1 import transcriber_pb2 as pb


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
        "--vad", action="store_true", help="the server's voice activity detection (status line)"
    )
    parser.add_argument(
        "--inspect",
        action="store_true",
        help="serve the inspection page on 127.0.0.1, following the live stream",
    )
    parser.add_argument("--port", type=int, default=0, help="port for --inspect (0: a free one)")
    parser.add_argument("--open", action="store_true", help="open the --inspect page in a browser")
    raw = parser.add_argument_group("raw PCM on standard input (AUDIO is -)")
    raw.add_argument("--rate", type=int, default=16000, help="samples per second (default 16000)")
    raw.add_argument("--channels", type=int, default=1, help="interleaved channels (default 1)")
    raw.add_argument(
        "--format", choices=sorted(SAMPLES), default="s16le", help="sample format (default s16le)"
    )


class StreamView:
    """What `xattn stream` shows while the stream runs; feed it events with `update`."""

    def __init__(
        self,
        info: ModelInfo,
        source: str,
        duration: float | None,
        speed: float = 1.0,
        heard: Callable[[], float] | None = None,
    ) -> None:
        """`duration` None: a live source (a pipe, a microphone), `heard()` its seconds sent."""
        self.info, self.source, self.duration, self.speed = info, source, duration, speed
        self.heard = heard
        self.speaking: bool | None = None  # None: no voice activity events (no --vad)
        self.finals: list[LiveResult] = []
        self.interim: LiveResult | None = None
        self.windows: list[Window] = []
        self.done: LiveDone | None = None
        self.started = time.monotonic()

    @classmethod
    def of(
        cls,
        source: str,
        duration: float | None,
        speed: float = 1.0,
        heard: Callable[[], float] | None = None,
    ) -> Callable[[ModelInfo], StreamView]:
        """A view, once the model's info is known."""
        return lambda info: cls(info, source, duration, speed, heard)

    def update(self, event: LiveEvent) -> None:
        if isinstance(event, LiveSpeech):
            self.speaking = event.kind == "begin"
            return
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
        if self.done is None and self.duration is None:
            heard = self.heard() if self.heard else time.monotonic() - self.started
            status = f"{self.info.name} · listening to {self.source} · {heard:.1f} s sent"
            if self.speaking is not None:
                status += " · speech" if self.speaking else " · silence"
        elif self.done is None:
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
    """Stream `args.audio` (a file, or - for raw PCM on stdin) to `args.server`; raises
    xattn.clients.api's errors (cli maps them)."""
    if args.audio == "-":
        if sys.stdin.isatty():
            raise AudioFileError(
                "standard input is a terminal: pipe raw PCM into `xattn stream -`, e.g. "
                "`arecord -q -f S16_LE -r 16000 -c 1 -t raw | xattn stream -`"
            )
        chunks = PcmQueue(PcmFormat(args.rate, args.channels, args.format))
        read_pipe(sys.stdin.buffer.fileno(), chunks)
        what = f"{args.rate} Hz, {args.channels} ch, {args.format}"
        err.print(f"streaming standard input ({what}); Ctrl-C ends it", highlight=False)
        return run_chunks(args, console, chunks, "stdin", chunks.stop, chunks.sent_seconds)
    pcm = read_pcm16(args.audio)
    duration = len(pcm) / 2 / 16000

    def events(client: Client, config: pb.StreamingRecognitionConfig) -> Iterator[LiveEvent]:
        return stream_pcm(client, pcm, speed=args.speed, config=config, token=args.token)

    view = StreamView.of(args.audio, duration, args.speed)
    return show(args, console, events, view)


def run_chunks(
    args: argparse.Namespace,
    console: Console,
    chunks: Iterable[bytes],
    source: str,
    stop: threading.Event,
    heard: Callable[[], float],
) -> int:
    """The live path of a pipe and a microphone: `chunks` (16 kHz mono int16) until they end
    or Ctrl-C sets `stop`; then the finals, as for a file."""

    def events(client: Client, config: pb.StreamingRecognitionConfig) -> Iterator[LiveEvent]:
        return stream_chunks(client, chunks, config=config, token=args.token)

    with interrupt_sets(stop):
        return show(args, console, events, StreamView.of(source, None, 1.0, heard))


@contextlib.contextmanager
def interrupt_sets(stop: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets `stop` (the stream ends cleanly); the next one interrupts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


Events = Callable[[Client, pb.StreamingRecognitionConfig], Iterator[LiveEvent]]


def show(
    args: argparse.Namespace,
    console: Console,
    events: Events,
    view_of: Callable[[ModelInfo], StreamView],
) -> int:
    """Run the stream `events` makes, showing the live view (or, --json, the result after)."""
    token = args.token  # cli.main resolved --token-file into it
    with connect(args.server, ca_file=args.ca, timeout=args.timeout, token=token) as client:
        info = client.info()
        config = live_config(
            language=args.language,
            interim=not args.json,
            commit_margin=args.commit_margin,
            vad=args.vad,
        )
        finals: list[LiveResult] = []
        done: LiveDone | None = None
        view = None if args.json else view_of(info)
        live = Live(view, console=console, refresh_per_second=10) if view else None
        if live is not None:
            live.start()
        try:
            for event in events(client, config):
                if view is not None:
                    view.update(event)
                if isinstance(event, LiveDone):
                    done = event
                elif isinstance(event, LiveResult) and event.is_final:
                    finals.append(event)
        finally:
            if live is not None:
                live.stop()
    if done is None:  # stream_chunks raises first; kept for the type checker
        raise RuntimeError("the stream ended without `done`")
    if args.json:
        result = result_dict(finals, done, info.name)
        sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
        sys.stdout.flush()
    return 0
