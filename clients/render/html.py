"""The alignment inspection page: one self-contained HTML file (inline CSS/JS, no network).

The page replays a list of events (the same JSON the live server sends over SSE): rows
travel as base64 little-endian float16. With all heads streamed, the page offers the
alignment-head mean, each layer's mean and each head; it embeds the audio as a data URI.
Tests drive it through `window.xattn` (rows, tokens, views, select(), cellCenter(), ...).

Size: every head of tiny.en is 24 × 1500 float16 per token, ~96 KB of base64; 11 s of
speech (27 tokens) is ~2.6 MB of rows; the audio is embedded as base64 on top (4/3 its size).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from xattn.clients.data import (
    Event,
    Finished,
    Head,
    ModelInfo,
    Result,
    Segment,
    Token,
    WindowDiscarded,
    WindowStarted,
)

ASSETS = Path(__file__).with_name("assets")
MIME = {b"RIFF": "audio/wav", b"fLaC": "audio/flac", b"OggS": "audio/ogg", b"ID3": "audio/mpeg"}
SUFFIX_MIME = {
    ".wav": "audio/wav",
    ".flac": "audio/flac",
    ".mp3": "audio/mpeg",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".opus": "audio/ogg",
    ".m4a": "audio/mp4",
    ".webm": "audio/webm",
}


def audio_mime(data: bytes, name: str = "") -> str:
    """The audio's MIME type from its first bytes, else its name's suffix."""
    for magic, mime in MIME.items():
        if data.startswith(magic):
            return mime
    if data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    return SUFFIX_MIME.get(Path(name).suffix.lower(), "application/octet-stream")


def row_payload(row: np.ndarray) -> dict[str, Any]:
    data = np.ascontiguousarray(row, dtype="<f2").tobytes()
    return {"shape": list(row.shape), "dtype": "f16", "data": base64.b64encode(data).decode()}


def token_event(t: Token) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "type": "token",
        "index": t.index,
        "id": t.id,
        "text": t.text,
        "kind": t.kind,
        "logprob": float(t.logprob),
        "window": t.window,
        "temperature": float(t.temperature),
        "timestamp": t.timestamp,
    }
    if t.row is not None:
        ev.update(row_payload(t.row))
    return ev


def segment_event(s: Segment) -> dict[str, Any]:
    return {"type": "segment", **s.to_dict()}


def event_dict(event: Event) -> dict[str, Any]:
    """One streamed event as the page's JSON."""
    if isinstance(event, WindowStarted):
        return {
            "type": "window_start",
            "window": event.window,
            "offset": event.offset,
            "num_frames": event.num_frames,
            "clock": [list(p) for p in event.clock],
            "language": event.language,
        }
    if isinstance(event, Token):
        return token_event(event)
    if isinstance(event, WindowDiscarded):
        return {
            "type": "discarded",
            "window": event.window,
            "temperature": event.temperature,
            "reason": event.reason,
        }
    if isinstance(event, Segment):
        return segment_event(event)
    if isinstance(event, Finished):
        return done_event(event.result)
    raise TypeError(f"unexpected event {type(event).__name__}")


def done_event(r: Result) -> dict[str, Any]:
    return {
        "type": "done",
        "text": r.text,
        "language": r.language,
        "duration": r.duration,
        "segments": [s.to_dict() | {"type": "segment"} for s in r.segments],
    }


def result_events(result: Result) -> list[dict[str, Any]]:
    """The events that rebuild `result` (accepted attempts only)."""
    events: list[dict[str, Any]] = []
    for w in result.windows:
        started = WindowStarted(w.window, w.offset, w.num_frames, w.language, w.clock)
        events.append(event_dict(started))
        events.extend(token_event(t) for t in w.tokens if t.row is not None)
    events.append(done_event(result))
    return events


def _script_json(value: Any) -> str:
    """JSON safe inside <script>: no `</`, no `<!--`."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(
    info: ModelInfo,
    heads: list[Head] | None,
    events: list[dict[str, Any]],
    audio: bytes | None = None,
    audio_name: str = "",
    live: str | None = None,
    scripts: tuple[str, ...] = (),
    extra: dict[str, Any] | None = None,
) -> str:
    """The whole page. `live`: an SSE URL the page listens to for more events. `scripts`:
    more assets (JS, or CSS by suffix) run inside the inspector's scope after it, and
    `extra` more config for them (e.g. the live microphone page, clients/bridge.py)."""
    config: dict[str, Any] = {
        "info": info.to_dict(),
        "heads": None if heads is None else [list(h) for h in heads],
        "events": events,
        "live": live,
        "audio": None,
        **(extra or {}),
    }
    if audio:
        config["audio"] = {
            "name": audio_name,
            "mime": audio_mime(audio, audio_name),
            "b64": base64.b64encode(audio).decode(),
        }
    names = ("heatmap.js", "inspector.js", *(s for s in scripts if s.endswith(".js")))
    js = "\n".join((ASSETS / name).read_text("utf-8") for name in names)
    css_names = ("inspector.css", *(s for s in scripts if s.endswith(".css")))
    css = "\n".join((ASSETS / name).read_text("utf-8") for name in css_names)
    meta = (
        f"{html.escape(Path(audio_name).name)} · model {html.escape(info.name)} · "
        f"{info.n_text_layer} layers × {info.n_text_head} heads"
    )
    template = (ASSETS / "inspector.html").read_text("utf-8")
    replacements = {
        "{{TITLE}}": html.escape(f"xattn · {Path(audio_name).name or 'inspector'}"),
        "{{META}}": meta,
        "{{CSS}}": css,
        "{{JS}}": "(function () {\n" + js + "\n})();",
        "{{DATA}}": _script_json(config),
    }
    for key in ("{{TITLE}}", "{{META}}", "{{CSS}}", "{{JS}}", "{{DATA}}"):
        head, sep, tail = template.partition(key)
        template = head + replacements[key] + tail
    return template


def result_page(result: Result, audio: bytes | None, audio_name: str = "") -> str:
    """A static page of a finished result."""
    return page(result.info, result.heads, result_events(result), audio, audio_name)


def write_html(result: Result, out: str | Path, audio: bytes | None, audio_name: str = "") -> Path:
    out = Path(out)
    out.write_text(result_page(result, audio, audio_name), "utf-8")
    return out
