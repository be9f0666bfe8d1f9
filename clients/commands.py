"""What every `xattn` command shares: the exit statuses, `Fail` (exit with a status and a
message), the check of output folders, and opening the audio and the server's client, and a
file's stream shown as it arrives (`run_stream`).

The commands (clients/cli.py, transcribe_cli.py, compare.py, ...) import it; it imports
none of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.live import Live

from xattn.clients.api import (
    AudioFileError,
    Client,
    ServerError,
    Unreachable,
    connect,
    read_audio,
    resolve_token,
)
from xattn.clients.assemble import mean_rows
from xattn.clients.data import Event, Finished, Head, Result
from xattn.clients.render.terminal import LiveView

OK, BAD_FILE, UNREACHABLE, SERVER_ERROR, INTERRUPTED = 0, 2, 3, 4, 130
HINTS = {
    "INVALID_ARGUMENT": "check the audio file and the options (e.g. --language)",
    "OUT_OF_RANGE": "the audio is longer than the server accepts; cut it",
    "RESOURCE_EXHAUSTED": "the server is busy; retry in a moment",
    "UNIMPLEMENTED": "the server is too old for this client",
}


class Fail(Exception):
    """Exit with `code` after telling the person `message`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_outputs(*paths: str | None) -> None:
    """Fail before transcribing when an output's folder does not exist."""
    for path in paths:
        if path and not Path(path).resolve().parent.is_dir():
            raise Fail(BAD_FILE, f"cannot write {path}: its folder does not exist")


def token_of(args: argparse.Namespace) -> str | None:
    """--token, else the first token in --token-file, else None."""
    try:
        return resolve_token(args.token, args.token_file)
    except (OSError, ValueError) as e:
        raise Fail(BAD_FILE, f"cannot use the token file: {e}") from e


def open_client(args: argparse.Namespace) -> tuple[bytes, Client]:
    try:
        audio = read_audio(args.audio)
    except AudioFileError as e:
        raise Fail(BAD_FILE, f"bad audio file: {e}") from e
    return audio, connect_client(args)


def connect_client(args: argparse.Namespace) -> Client:
    """A client of --server, its model info fetched (Fail when unreachable)."""
    try:
        client = connect(args.server, ca_file=args.ca, timeout=args.timeout, token=args.token)
        client.info()
    except Unreachable as e:
        raise Fail(UNREACHABLE, unreachable_message(e)) from e
    except OSError as e:
        raise Fail(BAD_FILE, f"cannot read the CA bundle: {e}") from e
    return client


def unreachable_message(e: Unreachable) -> str:
    return (
        f"cannot reach server at {e.address}: is `xattn-server` running? ({e.detail}; "
        "set --server HOST:PORT or XATTN_SERVER)"
    )


def server_message(e: ServerError) -> str:
    hint = HINTS.get(e.code)
    return f"server error {e.code}: {e.details}" + (f"\n  hint: {hint}" if hint else "")


def run_stream(events: Iterator[Event], console: Console, view: LiveView | None) -> Result:
    """Consume the stream, showing `view` live when given; the Result."""
    result: Result | None = None
    if view is None:
        for event in events:
            if isinstance(event, Finished):
                result = event.result
    else:
        with Live(view, console=console, refresh_per_second=8, vertical_overflow="visible"):
            for event in events:
                view.update(event)
                if isinstance(event, Finished):
                    result = event.result
        if not console.is_terminal:
            console.line()  # Live ends its last frame with a newline only on terminals
    if result is None:
        raise Fail(SERVER_ERROR, "server error: the stream ended without a result")
    return result


def all_heads(client: Client) -> list[Head]:
    info = client.info()
    return [(la, h) for la in range(info.n_text_layer) for h in range(info.n_text_head)]


def live_view(client: Client, heads: list[Head] | None, audio: bytes, path: str) -> LiveView:
    info = client.info()
    return LiveView(info, mean_rows(heads, info.alignment_heads), Path(path).name, len(audio))
