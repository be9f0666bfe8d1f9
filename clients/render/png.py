"""PNG heatmaps (matplotlib, Agg): one figure per window, tokens × time.

Tokens label the y axis, seconds (file clock) the x axis; the frames shown are the real
audio plus 0.5 s; the end of the real audio is a dashed line with the padding shaded; word
boundaries, when words were asked, are thin vertical lines with the words along the top.

Several windows: `out.png` becomes `out-1.png`, `out-2.png`, ... (one file per window,
numbered from 1); a single window is written to `out.png` itself.

Figure size is fixed by the token count: `figure_pixels(n_tokens)` gives (width, height).
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from xattn.clients.assemble import alignment_mean, mean_rows  # noqa: E402
from xattn.clients.data import FRAMES_PER_SECOND, Result, Window, frame_time  # noqa: E402
from xattn.clients.render.terminal import visible_frames  # noqa: E402

log = logging.getLogger(__name__)

DPI = 100
WIDTH_IN = 14.0
ROW_IN = 0.22  # inches per token row
EXTRA_IN = 2.2  # title and word labels (1.3 in) above, the time axis (0.9 in) below


def figure_pixels(n_tokens: int) -> tuple[int, int]:
    """(width, height) in pixels of the figure for a window of `n_tokens` rows."""
    return int(round(WIDTH_IN * DPI)), int(round(figure_height(n_tokens) * DPI))


def figure_height(n_tokens: int) -> float:
    return EXTRA_IN + ROW_IN * max(4, min(n_tokens, 200))


def output_paths(out: Path, n_windows: int) -> list[Path]:
    """`out` for one window; `out-1.png`, `out-2.png`, ... for several."""
    if n_windows <= 1:
        return [out]
    suffix = out.suffix or ".png"
    return [out.with_name(f"{out.stem}-{i + 1}{suffix}") for i in range(n_windows)]


def frame_pieces(window: Window, shown: int) -> list[tuple[int, int, float]]:
    """(first frame, frames, start s) of the window's pieces on the file's clock, the last
    one stretched to `shown` frames: one piece, unless vad_filter joined several spans."""
    pieces = [p for p in window.clock if p[0] < shown] or [(0, shown, window.offset)]
    first, _, start = pieces[-1]
    pieces[-1] = (first, shown - first, start)
    return pieces


def window_figure(window: Window, result: Result, picked: list[int]) -> plt.Figure:
    tokens = [t for t in window.tokens if t.row is not None]
    n = len(tokens)
    shown = visible_frames(window.num_frames)
    if n:
        matrix = alignment_mean(np.stack([t.row for t in tokens]), picked)[:, :shown]
        top = matrix[:, : max(1, window.num_frames)].max(axis=1, keepdims=True)
        matrix = matrix / np.where(top > 0, top, 1.0)  # each row scaled to its maximum
    else:
        matrix = np.zeros((1, shown), np.float32)
    fig = plt.figure(figsize=(WIDTH_IN, figure_height(n)), dpi=DPI)
    height = figure_height(n)
    ax = fig.add_axes((0.1, 0.75 / height, 0.86, 1 - 2.05 / height))
    pieces = frame_pieces(window, shown)
    t0, t1 = pieces[0][2], pieces[-1][2] + pieces[-1][1] / FRAMES_PER_SECOND
    for first, count, start in pieces:  # vad_filter: each span of speech where it was heard
        ax.imshow(
            matrix[:, first : first + count],
            aspect="auto",
            cmap="inferno",
            interpolation="nearest",
            extent=(start, start + count / FRAMES_PER_SECOND, max(n, 1) - 0.5, -0.5),
            vmin=0.0,
            vmax=1.0,
        )
    for (_, c, a), (_, _, b) in zip(pieces, pieces[1:], strict=False):  # skipped: no speech
        ax.axvspan(a + c / FRAMES_PER_SECOND, b, color="#9e9e9e", alpha=0.85, linewidth=0)
    last = window.num_frames - 1
    end = frame_time(window.clock, window.offset, last) + 1 / FRAMES_PER_SECOND
    ax.axvline(end, color="white", linestyle="--", linewidth=1.2)
    ax.axvspan(end, t1, color="grey", alpha=0.35, linewidth=0)
    ax.text(
        end, (max(n, 1) - 1) / 2, "end of audio ", color="white", fontsize=8, rotation=90,
        va="center", ha="right",
    )  # fmt: skip
    peaks = [(t.peak_time, i) for i, t in enumerate(tokens) if t.peak_time is not None]
    if peaks:
        ax.plot(*zip(*peaks, strict=True), "o", ms=3, mfc="none", mec="#00e5ff", mew=0.8)
    ax.set_yticks(range(n), [t.label.replace("$", r"\$") for t in tokens], fontsize=8)
    ax.set_xlabel("time (s)")
    ax.set_xlim(t0, t1)
    words = [w for s in result.segments if s.window == window.window for w in s.words]
    if words:
        top_ax = ax.secondary_xaxis("top")
        shown_words, last = [], -1e9  # thinned so that the labels stay readable
        for w in words:
            if (w.start + w.end) / 2 - last >= (t1 - t0) / 60:
                shown_words.append(w)
                last = (w.start + w.end) / 2
        top_ax.set_xticks(
            [(w.start + w.end) / 2 for w in shown_words], [w.word for w in shown_words]
        )
        top_ax.tick_params(labelsize=7, length=0, labelrotation=45)
        for w in words:
            ax.axvline(w.start, color="#7fffd4", linewidth=0.5, alpha=0.7)
        ax.axvline(words[-1].end, color="#7fffd4", linewidth=0.5, alpha=0.7)
    title = (
        f"{result.info.name} · window {window.window} · {n} tokens × 1500 frames "
        "(alignment-head mean, rows scaled to their max; ○ peak)"
    )
    fig.suptitle(title, fontsize=10, y=1 - 0.12 / height)
    return fig


def write_png(result: Result, out: str | Path) -> list[Path]:
    """Write one PNG per window (see the module doc for the names); returns the paths."""
    out = Path(out)
    picked = mean_rows(result.heads, result.info.alignment_heads)
    windows = result.windows or [Window(0, 0.0, 0, result.language)]
    paths = output_paths(out, len(windows))
    for window, path in zip(windows, paths, strict=True):
        fig = window_figure(window, result, picked)
        try:
            fig.savefig(path, dpi=DPI)
        finally:
            plt.close(fig)
        log.info("wrote %s", path)
    return paths
