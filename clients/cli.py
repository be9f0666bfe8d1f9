"""`xattn`: transcribe a file on an xattn server and show where the model listened.

    xattn transcribe AUDIO... [--server HOST:PORT] [--language L] [--words] [--json]
                              [--png FILE] [--html FILE] [-o DIR] [-f txt|vtt|srt|tsv|json|all]
                              [--task translate] [--initial-prompt TEXT] ... (whisper's options)
    xattn inspect AUDIO [--server HOST:PORT] [--out FILE.html] [--serve [--port N] [--open]]
    xattn stream AUDIO [--server HOST:PORT] [--language L] [--speed X] [--commit-margin S]
                       [--json | --inspect [--port N] [--open]]
    xattn stream - [--rate R] [--channels C] [--format s16le|f32le] [--json]
    xattn listen [--device NAME|INDEX] [--list-devices] [--json] [--vad]
    xattn live --serve [--port N] [--open] [--vad]
    xattn compare AUDIO --model A --model B [--beam N [--beam M]] [--html FILE]

`stream` feeds the file at X times real time through StreamingRecognize (live recognition)
and shows the finals, the greyed interim guess and the finals' rows growing; `--inspect`
serves the inspection page instead, following that live stream: one heatmap row per final
token, a new window each time the server's 30 s buffer slides, words on the stream's clock.
`inspect --serve` does the same for the file transcription (StreamTranscribe, every head).
`stream -` takes raw PCM from standard input (`arecord ... | xattn stream -`) until its end
or Ctrl-C; `listen` the default microphone (or --device); `live --serve` a page on
127.0.0.1 that records the browser's microphone and shows the attention growing.
`compare` transcribes AUDIO with two of the server's models (or one with two beam sizes) and
writes one page: both alignments on the same time axis, the words aligned, differences marked.

Exit status: 0 done; 2 bad audio file (missing, unreadable, empty), an output that cannot
be written, or bad usage; 3 server unreachable or not ready; 4 the server answered with an
error (its gRPC status name and message are shown); 130 interrupted.

`--png out.png` writes one figure per window: `out.png` for one window, `out-1.png`,
`out-2.png`, ... for several. `--html` and `inspect` ask for every head's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import webbrowser
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from rich.console import Console

from xattn.clients.api import (
    AudioFileError,
    Client,
    ServerError,
    Unreachable,
)
from xattn.clients.commands import (
    BAD_FILE,
    INTERRUPTED,
    OK,
    SERVER_ERROR,
    UNREACHABLE,
    Fail,
    all_heads,
    check_outputs,
    live_view,
    open_client,
    run_stream,
    server_message,
    token_of,
    unreachable_message,
)
from xattn.clients.data import Finished, Head
from xattn.clients.pcm import SourceError

DEFAULT_SERVER = "127.0.0.1:50051"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xattn",
        description="Speech to text that shows its cross-attention.",
        epilog=(__doc__ or "").split("\n\n", 1)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, audio: str | None = "", many: bool = False) -> None:
        if audio is not None:
            text = audio or "audio file: wav, flac, mp3, ogg, ..."
            p.add_argument("audio", metavar="AUDIO", nargs="+" if many else None, help=text)
        p.add_argument(
            "--server",
            default=os.environ.get("XATTN_SERVER", DEFAULT_SERVER),
            help="HOST:PORT of xattn-server; several, comma-separated, or a gRPC target such "
            "as dns:///NAME:PORT: calls are spread round-robin and retried on UNAVAILABLE / "
            f"RESOURCE_EXHAUSTED (env XATTN_SERVER; default {DEFAULT_SERVER})",
        )
        p.add_argument("--language", help="language code, e.g. en (default: detect)")
        p.add_argument("--ca", metavar="PEM", help="use TLS, trusting this CA bundle")
        p.add_argument(
            "--token",
            default=os.environ.get("XATTN_AUTH_TOKEN") or None,
            help="bearer token for a server with --auth-token (env XATTN_AUTH_TOKEN)",
        )
        p.add_argument(
            "--token-file",
            default=os.environ.get("XATTN_AUTH_TOKEN_FILE") or None,
            help="read the token from the first line of this file that is not blank or a "
            "#comment, e.g. the server's token file (env XATTN_AUTH_TOKEN_FILE)",
        )
        p.add_argument(
            "--timeout", type=float, default=5.0, help="seconds to wait for a connection"
        )

    t = sub.add_parser("transcribe", help="transcribe files, with a live attention view")
    common(t, "audio files: wav, flac, mp3, ogg, ...", many=True)
    t.add_argument("--words", action="store_true", help="word timestamps (DTW)")
    t.add_argument("--json", action="store_true", help="the full result as JSON on stdout")
    t.add_argument("--png", metavar="FILE", help="heatmap figure(s); FILE-1.png ... per window")
    t.add_argument("--html", metavar="FILE", help="the self-contained inspection page")
    add_search_arguments(t)
    from xattn.clients import transcribe_cli

    transcribe_cli.add_arguments(t)

    i = sub.add_parser("inspect", help="the alignment inspection page (file or live server)")
    common(i)
    i.add_argument("--out", metavar="FILE.html", help="default: AUDIO's name + .xattn.html")
    i.add_argument("--serve", action="store_true", help="serve the page live on 127.0.0.1")
    i.add_argument("--port", type=int, default=0, help="port for --serve (0: a free one)")
    i.add_argument("--open", action="store_true", help="open the page in a browser")
    i.add_argument("--no-words", action="store_true", help="skip word timestamps")

    s = sub.add_parser("stream", help="live recognition: a file at real-time pace, or - (stdin)")
    common(s, "audio file, or - for raw PCM on standard input (see --rate ...)")
    from xattn.clients.stream_cli import add_arguments

    add_arguments(s)
    m = sub.add_parser("listen", help="live recognition of the microphone, in the terminal")
    common(m, None)
    from xattn.clients import listen

    listen.add_arguments(m)
    w = sub.add_parser("live", help="live recognition in the browser: a page on 127.0.0.1")
    common(w, None)
    from xattn.clients import bridge

    bridge.add_arguments(w)
    c = sub.add_parser("compare", help="one audio, two models (or searches): one page")
    common(c)
    from xattn.clients import compare

    compare.add_arguments(c)
    return parser


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """The search's flags (xattn.model.decode.beams); unset, each keeps the server's default."""
    g = p.add_argument_group("search (openai-whisper's beam search and best-of sampling)")
    g.add_argument(
        "--beam-size", type=int, metavar="N", help="beams at temperature 0 (default 5; 1: greedy)"
    )
    g.add_argument(
        "--best-of", type=int, metavar="N", help="samples at fallback temperatures > 0 (default 5)"
    )
    g.add_argument(
        "--patience",
        type=float,
        metavar="P",
        help="beam search ends after round(N * P) finished candidates (default 1.0)",
    )
    g.add_argument(
        "--length-penalty",
        type=float,
        metavar="A",
        help="rank by logprob / ((5 + length) / 6) ** A (default: logprob / length)",
    )


def transcribe(args: argparse.Namespace, console: Console, err: Console) -> int:
    from xattn.clients.transcribe_cli import run

    return run(args, console, err)


def inspect(args: argparse.Namespace, console: Console) -> int:
    check_outputs(None if args.serve else args.out)
    audio, client = open_client(args)
    heads = all_heads(client)
    if args.serve:
        return serve_live(args, client, audio, heads, console)
    out = Path(args.out or f"{Path(args.audio).stem}.xattn.html")
    with client:
        events = client.stream_transcribe(
            audio, language=args.language, words=not args.no_words, alignment="all"
        )
        result = run_stream(events, console, live_view(client, heads, audio, args.audio))
    name = Path(args.audio).name
    from xattn.clients.render.html import write_html

    console.print(f"wrote {write_html(result, out, audio, name)}")
    return OK


def serve_live(
    args: argparse.Namespace,
    client: Client,
    audio: bytes,
    heads: list[Head] | None,
    console: Console,
) -> int:
    from xattn.clients.render.html import event_dict, page

    name = Path(args.audio).name
    html = page(client.info(), heads, [], audio, name, live="/events")

    def events() -> Iterator[str]:
        console.print("streaming to the page…")
        stream = client.stream_transcribe(
            audio, language=args.language, words=not args.no_words, alignment="all"
        )
        for event in stream:
            yield json.dumps(event_dict(event), separators=(",", ":"))
            if isinstance(event, Finished):
                console.print(f"[green]done[/]: {event.result.text.strip()}")

    return serve_page(args, client, html, events, console)


def serve_page(
    args: argparse.Namespace,
    client: Client,
    html: str,
    events: Callable[[], Iterable[str]],
    console: Console,
) -> int:
    """Serve `html` on 127.0.0.1:args.port, pumping `events` (JSON) from the first page on,
    until Ctrl-C; closes `client`."""
    from xattn.clients.live import LiveServer

    def on_error(e: BaseException) -> str:
        if isinstance(e, ServerError):
            code, message = e.code, e.details
        elif isinstance(e, Unreachable):
            code, message = "UNAVAILABLE", unreachable_message(e)
        else:
            code, message = type(e).__name__, str(e)
        console.print(f"[red]stream failed[/]: {code}: {message}")
        return json.dumps({"type": "error", "code": code, "message": message})

    try:
        server = LiveServer(html, events, on_error, args.port)
    except OSError as e:
        client.close()
        raise Fail(BAD_FILE, f"cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}") from e
    console.print(
        f"inspector at {server.url} (the transcription starts when it is opened; Ctrl-C stops)",
        soft_wrap=True,
        highlight=False,
    )
    console.file.flush()
    if args.open:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.shutdown()
        client.close()
    return OK


def main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """The `xattn` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    err = Console(stderr=True)
    out = console or Console()
    try:
        args.token = token_of(args)  # once, for every command: --token, else --token-file
        if args.command == "transcribe":
            return transcribe(args, out, err)
        if args.command == "compare":
            from xattn.clients.compare import run as compare

            return compare(args, out, err)
        if args.command == "listen":
            from xattn.clients.listen import run as listen

            return listen(args, out, err)
        if args.command == "live":
            from xattn.clients.bridge import run as live

            return live(args, out)
        if args.command == "stream":
            if args.inspect and args.audio == "-":
                raise Fail(BAD_FILE, "--inspect takes a file; for live audio: xattn live --serve")
            if args.inspect:
                if args.json:
                    raise Fail(BAD_FILE, "--inspect and --json do not go together")
                from xattn.clients.stream_inspect import prepare

                return serve_page(args, *prepare(args, out), out)
            from xattn.clients.stream_cli import run

            return run(args, out, err)
        return inspect(args, out)
    except Fail as e:
        err.print(f"[red]xattn:[/] {e.message}", highlight=False, soft_wrap=True)
        return e.code
    except AudioFileError as e:
        err.print(f"[red]xattn:[/] bad audio file: {e}", highlight=False, soft_wrap=True)
        return BAD_FILE
    except SourceError as e:  # a live source: its format, no microphone
        err.print(f"[red]xattn:[/] {e}", highlight=False, soft_wrap=True)
        return BAD_FILE
    except Unreachable as e:
        err.print(f"[red]xattn:[/] {unreachable_message(e)}", highlight=False, soft_wrap=True)
        return UNREACHABLE
    except ServerError as e:
        err.print(f"[red]xattn:[/] {server_message(e)}", highlight=False, soft_wrap=True)
        return SERVER_ERROR
    except OSError as e:  # an output file that cannot be written
        where = f" {e.filename}" if e.filename else ""
        message = f"cannot write{where}: {e.strerror or e}"
        err.print(f"[red]xattn:[/] {message}", highlight=False, soft_wrap=True)
        return BAD_FILE
    except KeyboardInterrupt:
        err.print("[yellow]xattn: interrupted[/]")
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
