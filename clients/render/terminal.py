"""The terminal view (rich): status, the tokens so far, a heatmap with one line per token
(frames downsampled to the width, real audio plus a margin), a time axis, and at the end
the words (or segments) with their times. Renders at any width from 40 columns up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from xattn.clients.assemble import alignment_mean, mean_rows
from xattn.clients.data import (
    FRAMES,
    FRAMES_PER_SECOND,
    Event,
    Finished,
    ModelInfo,
    Result,
    Segment,
    Token,
    Window,
    WindowDiscarded,
    WindowStarted,
)

INFERNO = [
    "#000004", "#210c4a", "#57106e", "#8a226a", "#bc3754",
    "#e45a31", "#f98e09", "#f9cb35", "#fcffa4",
]  # fmt: skip
SHADES = " ░░▒▒▓▓██"
LABEL = 12  # columns for the token label
MARGIN_FRAMES = 25  # shown past the end of the real audio (0.5 s)
EARLY = " underline"  # a token a beam search sent while it still searched
EARLY_MARK = "▸"  # before its label in the heatmap


def visible_frames(num_frames: int) -> int:
    """The frames worth drawing: the real audio plus a little padding."""
    return max(1, min(FRAMES, (num_frames or FRAMES) + MARGIN_FRAMES))


def pool(row: np.ndarray, cells: int) -> np.ndarray:
    """Max-pool a row into `cells` bins, cells <= len(row) (max keeps sharp peaks visible)."""
    starts = np.linspace(0, len(row), cells + 1).astype(int)[:-1]
    return np.maximum.reduceat(row, starts)


def heat_line(row: np.ndarray, num_frames: int, shown: int, cells: int, peak: int | None) -> Text:
    """One token's row as `cells` shaded, coloured characters (normalized to its maximum)."""
    values = pool(row[:shown], cells)
    top = float(values.max()) or 1.0
    peak_cell = None if peak is None else min(cells - 1, peak * cells // shown)
    line = Text()
    for i, v in enumerate(values / top):
        level = int(round(float(v) * 8))
        if peak_cell == i:
            line.append("█", style="bold #ffffff")
        elif i * shown // cells >= num_frames:
            line.append(SHADES[level] if level else "·", style="grey30")
        else:
            line.append(SHADES[level], style=INFERNO[level])
    return line


def time_axis(offset: float, shown: int, cells: int) -> tuple[Text, Text]:
    """Tick marks and second labels under the heatmap, at round times on the file's clock."""
    seconds = shown / FRAMES_PER_SECOND
    step = next(s for s in (0.5, 1, 2, 5, 10, 30) if cells * s / seconds >= 6)
    ticks, labels = [" "] * cells, [" "] * cells
    k = math.ceil(offset / step - 1e-9)
    while (t := k * step - offset) <= seconds + 1e-9:
        col = min(cells - 1, int(t / seconds * cells))
        ticks[col] = "┴"
        label = f"{k * step:g}"
        at = min(col, cells - len(label))  # the last label ends at the right edge
        if at >= 0 and all(c == " " for c in labels[max(0, at - 1) : at + len(label) + 1]):
            labels[at : at + len(label)] = label
        k += 1
    return Text("".join(ticks), style="grey50"), Text("".join(labels), style="grey50")


def heatmap(
    window: Window, picked: list[int], width: int, max_rows: int | None = None
) -> RenderableType:
    """The window's matrix so far: one line per token, `width` columns in all."""
    cells = max(8, width - LABEL - 9)
    shown = visible_frames(window.num_frames)
    cells = min(cells, shown)
    tokens = [t for t in window.tokens if t.row is not None]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=LABEL, no_wrap=True, overflow="crop")
    grid.add_column(width=cells, no_wrap=True, overflow="crop")
    grid.add_column(width=6, no_wrap=True, justify="right")
    hidden = 0
    if max_rows is not None and len(tokens) > max_rows:
        hidden, tokens = len(tokens) - max_rows, tokens[-max_rows:]
        grid.add_row(Text(f"… {hidden} more", style="grey50"), "", "")
    for token in tokens:
        assert token.row is not None
        row = alignment_mean(token.row, picked)
        style = "grey50" if token.kind != "text" else logprob_style(token.logprob)
        style += EARLY if token.early else ""
        peak = "" if token.peak_time is None else f"{token.peak_time:.2f}s"
        mark = EARLY_MARK if token.early else ""  # visible without styles too
        label = Text((mark + token.label.replace("\n", " "))[:LABEL], style=style)
        grid.add_row(label, heat_line(row, window.num_frames, shown, cells, token.peak_frame), peak)
    ticks, labels = time_axis(window.offset, shown, cells)
    grid.add_row(Text("time (s)", style="grey50"), ticks, Text("peak", style="grey50"))
    grid.add_row("", labels, "")
    title = (
        f"window {window.window} · {window.offset:.2f}–{window.offset + window.duration:.2f} s"
        f" · {len(window.tokens)} tokens × {FRAMES} frames (showing {shown})"
    )
    if any(t.early for t in window.tokens):
        title += f" · {EARLY_MARK}: sent while the beam search ran"
    return Group(Text(title, style="bold"), grid)


def logprob_style(logprob: float) -> str:
    p = float(np.exp(logprob))
    return "green" if p > 0.8 else "yellow" if p > 0.4 else "red"


def transcript_text(windows: Iterable[Window]) -> Text:
    """The text tokens so far, coloured by confidence; underlined: sent early (a beam search's
    settled prefix, while it still searched)."""
    text = Text()
    for w in windows:
        for t in w.tokens:
            if t.kind == "text":
                text.append(t.text, style=logprob_style(t.logprob) + (EARLY if t.early else ""))
    return text


def words_table(result: Result) -> RenderableType:
    """Words with start/end/probability, or the segments when no words were asked."""
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    if result.words:
        table.add_column("start", justify="right")
        table.add_column("end", justify="right")
        table.add_column("word")
        table.add_column("p", justify="right")
        for w in result.words:
            table.add_row(f"{w.start:.2f}", f"{w.end:.2f}", w.word.strip(), f"{w.probability:.2f}")
    else:
        table.add_column("start", justify="right")
        table.add_column("end", justify="right")
        table.add_column("segment", overflow="fold")
        for s in result.segments:
            table.add_row(f"{s.start:.2f}", f"{s.end:.2f}", s.text.strip())
    return table


class LiveView:
    """What `xattn transcribe` shows while the stream runs; feed it events with `update`."""

    def __init__(self, info: ModelInfo, picked_heads: list[int], source: str, size: int) -> None:
        self.info = info
        self.picked = picked_heads
        self.windows: list[Window] = []
        self.result: Result | None = None
        self.started = time.monotonic()
        self.status = f"uploading {size / 1024:.0f} KiB of {source} · encoder running"
        self.spinner = Spinner("dots", style="cyan")
        self.notes: list[str] = []

    def update(self, event: Event) -> None:
        if isinstance(event, WindowStarted):
            self.windows.append(
                Window(event.window, event.offset, event.num_frames, event.language)
            )
            self.status = f"decoding window {event.window} (from {event.offset:g} s)"
        elif isinstance(event, Token):
            if self.windows and self.windows[-1].window == event.window:
                self.windows[-1].tokens.append(event)
            if event.kind == "eot":
                self.status = "checking the window · encoding the next one"
        elif isinstance(event, WindowDiscarded):
            if self.windows and self.windows[-1].window == event.window:
                self.windows[-1].tokens.clear()
            self.notes.append(
                f"window {event.window}: attempt at T={event.temperature:g} rejected "
                f"({event.reason}); retrying"
            )
        elif isinstance(event, Segment):
            self.status = f"segment {event.id} done ({event.start:.2f}–{event.end:.2f} s)"
        elif isinstance(event, Finished):
            self.result = event.result
            self.windows = event.result.windows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.result is None:
            elapsed = time.monotonic() - self.started
            status = Table.grid(padding=(0, 1))
            status.add_row(self.spinner, Text(f"{self.status} · {elapsed:.1f} s", style="cyan"))
            yield status
        else:
            r = self.result
            yield Text(
                f"{self.info.name} · language {r.language} · {r.duration:.2f} s of audio · "
                f"{len(r.tokens)} tokens in {r.timings.total:.2f} s",
                style="cyan",
            )
        for note in self.notes[-3:]:
            yield Text(note, style="yellow")
        yield transcript_text(self.windows)
        if self.result is None:
            if self.windows:
                rows = max(4, (options.height or console.height) - 12)
                yield heatmap(self.windows[-1], self.picked, width, max_rows=rows)
            return
        total = sum(len(w.tokens) for w in self.windows)
        shown = self.windows if total <= 200 else self.windows[-1:]
        if len(shown) < len(self.windows):
            yield Text("(heatmap of the last window only: see --png or --html)", style="grey50")
        for w in shown:
            yield heatmap(w, self.picked, width)
        yield words_table(self.result)


def final_view(result: Result) -> LiveView:
    """The finished view of a result (what the live view shows at its end)."""
    view = LiveView(result.info, mean_rows(result.heads, result.info.alignment_heads), "", 0)
    view.update(Finished(result))
    return view
