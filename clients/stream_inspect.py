"""`xattn stream AUDIO --inspect`: the inspection page following a live StreamingRecognize.

The live results are translated here into the events the page already replays (the same
JSON `xattn inspect --serve` sends over SSE), so the page's event handling is shared:

    window_start  when a final's `buffer_offset` differs from the current window's: a new
                  30 s window (the server's buffer slid); a repeated window_start for the
                  same window only widens its `num_frames` as more audio arrives
    token         one per final token, with its row over that window (the alignment-head
                  mean); the page computes its peak frame over the window's audio
    segment       one per final: its text and words (stream clock), for the word boxes
    interim       the current guess after the finals (greyed on the page, replaced in
                  place); an empty text after each final clears it
    done          the finished stream (text, language, audio seconds)
    speech_activity  voice activity (config.vad): kind begin|end|end_of_utterance, speaking,
                  time (stream clock); the inspector skips it, the live page shows it
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from xattn.clients.api import Client, connect, read_audio
from xattn.clients.data import FRAMES, FRAMES_PER_SECOND
from xattn.clients.render.html import row_payload
from xattn.clients.streaming import (
    LiveDone,
    LiveEvent,
    LiveResult,
    LiveSpeech,
    live_config,
    read_pcm16,
    stream_pcm,
)


class PageEvents:
    """Turns live events into the page's event dicts; windows are numbered from 0."""

    def __init__(self, language: str = "") -> None:
        self.language = language
        self.window = -1
        self.offset: float | None = None
        self.num_frames = 0
        self.segments = 0
        self.tokens = 0  # final tokens sent

    def __call__(self, event: LiveEvent) -> list[dict[str, Any]]:
        if isinstance(event, LiveSpeech):
            speaking = event.kind == "begin"
            return [
                {
                    "type": "speech_activity",
                    "kind": event.kind,
                    "speaking": speaking,
                    "time": round(event.time, 3),
                }
            ]
        if isinstance(event, LiveDone):
            return [
                {"type": "interim", "text": ""},
                {
                    "type": "done",
                    "text": event.text,
                    "language": event.language,
                    "duration": round(event.audio_seconds, 3),
                },
            ]
        if not event.is_final:
            return [{"type": "interim", "text": event.text, "stability": event.stability}]
        return [
            *self._window(event),
            *self._tokens(event),
            self._segment(event),
            {"type": "interim", "text": ""},
        ]

    def _window(self, r: LiveResult) -> list[dict[str, Any]]:
        frames = min(FRAMES, max(1, round((r.audio_seconds - r.buffer_offset) * FRAMES_PER_SECOND)))
        if self.offset is not None and abs(self.offset - r.buffer_offset) < 1e-6:
            if frames <= self.num_frames:
                return []
        else:
            self.window += 1
            self.offset, self.num_frames = r.buffer_offset, 0
        self.num_frames = max(self.num_frames, frames)
        return [
            {
                "type": "window_start",
                "window": self.window,
                "offset": round(r.buffer_offset, 3),
                "num_frames": self.num_frames,
                "language": self.language,
            }
        ]

    def _tokens(self, r: LiveResult) -> list[dict[str, Any]]:
        events = []
        for t in r.tokens:
            if t.row is None:
                continue
            ev: dict[str, Any] = {
                "type": "token",
                "index": t.index,
                "id": t.id,
                "text": t.text,
                "kind": "text",
                "logprob": float(t.logprob),
                "window": self.window,
                "temperature": 0.0,
                "timestamp": None,
                "peak_time": round(t.peak_time, 3),
            }
            ev.update(row_payload(t.row))
            events.append(ev)
        self.tokens += len(events)
        return events

    def _segment(self, r: LiveResult) -> dict[str, Any]:
        start = r.words[0].start if r.words else r.buffer_offset
        end = r.words[-1].end if r.words else r.audio_seconds
        seg = {
            "type": "segment",
            "id": self.segments,
            "window": self.window,
            "start": round(start, 3),
            "end": round(end, 3),
            "text": r.text,
            "tokens": [t.id for t in r.tokens],
            "words": [w.to_dict() for w in r.words],
        }
        self.segments += 1
        return seg


def prepare(
    args: argparse.Namespace, console: Console
) -> tuple[Client, str, Callable[[], Iterator[str]]]:
    """The client, the page and its events for cli.serve_page (the stream starts when the
    first page subscribes)."""
    from xattn.clients.render.html import page

    pcm = read_pcm16(args.audio)
    audio = read_audio(args.audio)
    token = args.token  # cli.main resolved --token-file into it
    client = connect(args.server, ca_file=args.ca, timeout=args.timeout, token=token)
    info = client.info()
    name = Path(args.audio).name
    html = page(info, None, [], audio, name, live="/events")
    config = live_config(language=args.language, commit_margin=args.commit_margin, vad=args.vad)

    def events() -> Iterator[str]:
        console.print(f"streaming to the page at {args.speed:g}x…")
        translate = PageEvents(args.language or "")
        for event in stream_pcm(client, pcm, speed=args.speed, config=config, token=token):
            for ev in translate(event):
                yield json.dumps(ev, separators=(",", ":"))
            if isinstance(event, LiveDone):
                console.print(
                    f"[green]done[/]: {event.text.strip()} "
                    f"({event.tokens} final tokens in {translate.window + 1} window(s))"
                )

    return client, html, events
