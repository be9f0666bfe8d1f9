"""`xattn listen [--device NAME|INDEX] [--list-devices]`: live recognition of a microphone.

The input device (PortAudio through `sounddevice`, the optional extra `xattn[mic]`) is
opened at its own rate and channels; its blocks go through clients/pcm.py (mixed down,
resampled to the stream's 16 kHz) into the path `xattn stream -` takes
(stream_cli.run_chunks: the same live terminal view, Ctrl-C ends cleanly with the finals).

No PortAudio, no sounddevice or no input device: SourceError (exit 2) naming what to
install, or the pipe to use instead. Tests inject a virtual input as an object with
sounddevice's interface (`query_devices()`, `default.device`, `InputStream(device=,
samplerate=, channels=, dtype=, blocksize=, callback=)`: a context manager that calls
`callback(indata, frames, time, status)` from its own thread).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from xattn.clients.pcm import PcmFormat, PcmQueue, SourceError

log = logging.getLogger(__name__)

BLOCK_SECONDS = 0.05  # one PortAudio block
PIPE_HINT = (
    "Or pipe raw PCM into `xattn stream -` instead: "
    "`arecord -q -f S16_LE -r 16000 -c 1 -t raw | xattn stream -` (Linux), "
    "`sox -d -q -t raw -r 16000 -c 1 -b 16 -e signed - | xattn stream -`"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", help="input device: its index or (part of) its name")
    parser.add_argument("--list-devices", action="store_true", help="list input devices, exit")
    parser.add_argument("--json", action="store_true", help="the final result as JSON on stdout")
    parser.add_argument(
        "--commit-margin", type=float, help="seconds of audio a token's attention must leave"
    )
    parser.add_argument(
        "--vad", action="store_true", help="the server's voice activity detection (status line)"
    )


def sounddevice() -> Any:
    """The sounddevice module (SourceError: it or PortAudio is missing)."""
    try:
        import sounddevice as sd
    except ImportError as e:
        raise SourceError(
            f"no microphone support: sounddevice is not installed "
            f"(pip install 'xattn[mic]'). {PIPE_HINT}"
        ) from e
    except OSError as e:  # sounddevice raises OSError when libportaudio cannot be loaded
        raise SourceError(
            f"no microphone support: the PortAudio library is missing ({e}; Debian/Ubuntu: "
            f"apt-get install libportaudio2, macOS: brew install portaudio). {PIPE_HINT}"
        ) from e
    return sd


def input_devices(sd: Any) -> list[dict[str, Any]]:
    """PortAudio's devices that can record, each with its `index`."""
    return [
        {**d, "index": i} for i, d in enumerate(sd.query_devices()) if d["max_input_channels"] > 0
    ]


def pick_device(sd: Any, wanted: str | None) -> dict[str, Any]:
    """The device `wanted` names (an index or part of a name), else the default input."""
    devices = input_devices(sd)
    if not devices:
        raise SourceError(f"no input device found (PortAudio sees none). {PIPE_HINT}")
    if wanted is None:
        default = sd.default.device[0]
        if default is None or default < 0:
            return devices[0]
        return next((d for d in devices if d["index"] == default), devices[0])
    if wanted.isdigit():
        found = [d for d in devices if d["index"] == int(wanted)]
    else:
        found = [d for d in devices if wanted.lower() in d["name"].lower()]
    if len(found) != 1:
        names = ", ".join(f"{d['index']}: {d['name']}" for d in devices)
        why = "no" if not found else "more than one"
        raise SourceError(f"{why} input device matches --device {wanted!r} (inputs: {names})")
    return found[0]


def list_devices(sd: Any, console: Console) -> int:
    if not input_devices(sd):
        console.print("no input devices (PortAudio sees none)")
        return 0
    table = Table("index", "name", "channels", "rate (Hz)", title="input devices")
    for d in input_devices(sd):
        rate = f"{d['default_samplerate']:g}"
        table.add_row(str(d["index"]), d["name"], str(d["max_input_channels"]), rate)
    console.print(table)
    return 0


def run(args: argparse.Namespace, console: Console, err: Console, sd: Any = None) -> int:
    """Record until Ctrl-C, streaming to args.server; raises api's errors and SourceError.

    `sd`: the sounddevice module (default) or an object with the same `query_devices()`,
    `default.device` and `InputStream(...)` (tests: a virtual input)."""
    from xattn.clients.stream_cli import run_chunks

    sd = sd or sounddevice()
    if args.list_devices:
        return list_devices(sd, console)
    device = pick_device(sd, args.device)
    name, rate = device["name"], int(device["default_samplerate"])
    channels = min(2, device["max_input_channels"])
    chunks = PcmQueue(PcmFormat(rate, channels, "s16le"))

    def callback(indata: np.ndarray, frames: int, time: Any, status: Any) -> None:
        if status:
            log.warning("input: %s", status)
        chunks.put(np.ascontiguousarray(indata, "<i2").tobytes())  # [frames, channels]

    try:
        stream = sd.InputStream(
            device=device["index"],
            samplerate=rate,
            channels=channels,
            dtype="int16",
            blocksize=int(rate * BLOCK_SECONDS),
            callback=callback,
        )
    except Exception as e:  # sounddevice.PortAudioError, ValueError: the device refused
        raise SourceError(f"cannot open the input device {name!r}: {e}. {PIPE_HINT}") from e
    err.print(f"listening to {name} ({rate} Hz, {channels} ch); Ctrl-C stops", highlight=False)
    with stream:
        return run_chunks(args, console, chunks, name, chunks.stop, lambda: chunks.sent_seconds)
