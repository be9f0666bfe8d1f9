"""The alignment inspection page in a real headless Chromium (Debian's, via playwright).

A static page from `xattn transcribe --words --html` and the live page of
`xattn inspect --serve`, both against a real server. Without a browser these tests skip,
except under CI=true, where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import requires_tool
from test_clients import ROOT, start_server, stop_server

from xattn.clients.cli import main

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OUTPUT = Path(__file__).resolve().parent / "output"
PIXEL_HASH = """() => {
  const c = document.getElementById("heatmap");
  const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
  let h = 2166136261, lit = 0;
  for (let i = 0; i < d.length; i += 4) {
    h = Math.imul(h ^ d[i] ^ (d[i + 1] << 8) ^ (d[i + 2] << 16), 16777619) >>> 0;
    if (d[i] + d[i + 1] + d[i + 2] > 90) lit++;
  }
  return { hash: h, lit: lit / (d.length / 4) };
}"""


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and the browser is unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed")
    requires_tool("chromium", CHROMIUM)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, address = start_server(tmp_path_factory.mktemp("server"))
    try:
        yield address
    finally:
        stop_server(proc)


@pytest.fixture()
def page(browser: Any) -> Iterator[tuple[Any, list[str]]]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield pg, errors
    finally:
        context.close()


def test_static_page(
    server: str,
    jfk_path: Path,
    tmp_path: Path,
    page: tuple[Any, list[str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pg, errors = page
    html = tmp_path / "jfk.html"
    argv = [
        "transcribe",
        str(jfk_path),
        "--server",
        server,
        "--words",
        "--json",
        "--html",
        str(html),
        "--beam-size",
        "1",  # greedy: 27 tokens
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert "http://" not in html.read_text() and "https://" not in html.read_text()
    pg.goto(html.as_uri())
    pg.wait_for_function("window.xattn && window.xattn.done")
    pg.wait_for_function("document.getElementById('audio').readyState >= 1")

    # As many rows as tokens, and the canvas is not blank.
    n = len(result["tokens"])
    assert pg.evaluate("xattn.rows") == n
    assert pg.get_attribute("#heatmap", "data-rows") == str(n)
    assert len(pg.evaluate("xattn.views")) == 1 + 4 + 24  # mean, 4 layers, 24 heads
    mean = pg.evaluate(PIXEL_HASH)
    assert mean["lit"] > 0.05, mean

    # Hover a known cell: the first " country" at its peak frame.
    tokens = pg.evaluate("xattn.tokens")
    row = next(i for i, t in enumerate(tokens) if t["text"] == " country")
    frame = result["tokens"][row]["peak_frame"]
    assert tokens[row]["peakFrame"] == frame
    at = pg.evaluate(f"xattn.cellCenter({row}, {frame})")
    pg.mouse.move(at["x"], at["y"])
    tip = pg.locator("#tooltip")
    assert tip.is_visible()
    assert tip.get_attribute("data-token") == " country"
    assert tip.get_attribute("data-token-index") == str(result["tokens"][row]["index"])
    assert tip.get_attribute("data-time") == f"{frame / 50:.2f}"
    assert "country" in tip.inner_text() and f"{frame / 50:.2f} s" in tip.inner_text()

    # A single head draws a different picture.
    pg.evaluate("xattn.select('L3H2')")
    pg.wait_for_function("document.getElementById('heatmap').dataset.view === 'L3H2'")
    head = pg.evaluate(PIXEL_HASH)
    assert head["hash"] != mean["hash"] and head["lit"] > 0.01
    pg.select_option("#view", "mean")
    pg.wait_for_function("document.getElementById('heatmap').dataset.view === 'mean'")

    # Clicking a token plays from its start (its word's start): the second " ask".
    ask = [i for i, t in enumerate(tokens) if t["text"] == " ask"][1]
    start = tokens[ask]["start"]
    words = [w for s in result["segments"] for w in s["words"]]
    assert start == words[14]["start"] == result["tokens"][ask]["start"]
    assert pg.evaluate("xattn.cursorTime") == 0
    pg.click(f'.tok[data-row="{ask}"]')
    pg.wait_for_function(f"Math.abs(xattn.cursorTime - {start}) < 0.5")
    pg.evaluate("document.getElementById('audio').pause()")
    pg.mouse.move(at["x"], at["y"])  # the tooltip in the screenshot

    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / ".gitignore").write_text("*\n")
    pg.screenshot(path=str(OUTPUT / "inspector.png"), full_page=True)
    assert errors == []


@contextlib.contextmanager
def serving_cli(args: list[str], columns: int) -> Iterator[tuple[str, queue.Queue[str]]]:
    """`python -m xattn.clients.cli ARGS` that serves the page: (its URL, its output lines)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "xattn.clients.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        url = ""
        while not url:
            line = lines.get(timeout=30)
            if "inspector at " in line:
                url = line.split("inspector at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        yield url, lines
    finally:
        proc.terminate()
        proc.wait(10)


def test_live_page_grows_row_by_row(
    server: str, jfk_path: Path, page: tuple[Any, list[str]]
) -> None:
    pg, errors = page
    args = ["inspect", str(jfk_path), "--server", server, "--serve", "--port", "0"]
    with serving_cli(args, 200) as (url, _):
        pg.goto(url)
        pg.wait_for_function("window.xattn && window.xattn.done", timeout=60_000)
        assert pg.evaluate("xattn.error") is None
        n = pg.evaluate("xattn.rows")
        assert n == 29  # jfk.flac, beam 5 (the default): 28 segment tokens and the end of text
        history = pg.evaluate("xattn.history")
        grown = sorted({rows for _, rows in history})
        assert len(grown) >= 5 and grown[-1] == n, grown  # drawn while rows arrived
        assert pg.evaluate("xattn.text") == (
            " And so, my fellow Americans ask not what your country can do for you"
            " ask what you can do for your country."
        )
        assert errors == []


INTERIM_WATCH = """document.addEventListener("DOMContentLoaded", () => {
  window.__interims = [];
  new MutationObserver(() => {
    const el = document.getElementById("interim");
    if (el) window.__interims.push(el.textContent);
  }).observe(document.getElementById("transcript"), { childList: true });
});"""


def test_live_stream_page_follows_streaming_recognize(
    server: str, jfk_path: Path, page: tuple[Any, list[str]]
) -> None:
    """`xattn stream --inspect`: the finals' rows grow on the page as StreamingRecognize runs."""
    pg, errors = page
    pg.add_init_script(INTERIM_WATCH)
    args = ["stream", str(jfk_path), "--server", server, "--inspect", "--port", "0"]
    with serving_cli([*args, "--speed", "8"], 300) as (url, lines):
        pg.goto(url)
        pg.wait_for_function("window.xattn && window.xattn.done", timeout=90_000)
        assert pg.evaluate("xattn.error") is None
        done = ""
        while "final tokens in" not in done:
            done = lines.get(timeout=10)
        finals = int(re.search(r"\((\d+) final tokens in", done).group(1))  # type: ignore[union-attr]
        n = pg.evaluate("xattn.allRows")
        assert n == finals > 10
        assert pg.evaluate("xattn.windows") == 1  # 11 s: the buffer never slides
        assert pg.evaluate("xattn.rows") == n
        grown = sorted({rows for _, rows in pg.evaluate("xattn.history")})
        assert len([r for r in grown if 0 < r < n]) >= 1 and grown[-1] == n, grown
        assert pg.get_attribute("#heatmap", "data-rows") == str(n)
        tokens = pg.evaluate("xattn.tokens")
        assert sum(t["word"] is not None for t in tokens) > n // 2  # words on the stream clock
        # a word starts within the audio; a token's attention may peak anywhere in its 30 s
        # window, padding included (punctuation often looks at the end of the window)
        bad = [t for t in tokens if not (0 <= t["start"] <= 11.5 and 0 <= t["peakTime"] <= 30)]
        assert bad == [], bad
        assert "country" in pg.evaluate("xattn.text")
        assert pg.evaluate("xattn.interim") == "" and not pg.locator("#interim").count()
        assert any(pg.evaluate("window.__interims")), "no interim text was shown"
        pg.wait_for_function("document.getElementById('audio').readyState >= 1")
        assert errors == []


def test_live_results_become_page_events() -> None:
    """A final with a new buffer_offset opens a new window; the same offset widens it."""
    import numpy as np

    from xattn.clients.stream_inspect import PageEvents
    from xattn.clients.streaming import LiveResult, LiveToken

    def final(offset: float, heard: float, *texts: str) -> LiveResult:
        row = np.zeros((1, 1500), np.float32)
        toks = tuple(
            LiveToken(i, 100 + i, t, -0.1, offset + 1.0, offset, row) for i, t in enumerate(texts)
        )
        return LiveResult(True, 1.0, "".join(texts), toks, (), offset, heard, heard, 0.0)

    interim = LiveResult(False, 0.5, " maybe", (), (), 0.0, 3.0, 3.0, 0.0)
    translate = PageEvents("en")
    runs = [translate(e) for e in (final(0, 2, " a"), interim, final(0, 4, " b"), final(5, 6))]
    kinds = [[e["type"] for e in run] for run in runs]
    assert kinds[0] == ["window_start", "token", "segment", "interim"]
    assert runs[1] == [{"type": "interim", "text": " maybe", "stability": 0.5}]
    assert kinds[2] == ["window_start", "token", "segment", "interim"]
    assert [runs[0][0]["num_frames"], runs[2][0]["num_frames"]] == [100, 200]
    assert runs[2][0]["window"] == runs[2][1]["window"] == 0
    assert runs[3][0] | {"num_frames": 0} == {
        "type": "window_start",
        "window": 1,
        "offset": 5,
        "num_frames": 0,
        "language": "en",
    }
    assert runs[3][0]["num_frames"] == 50 and translate.tokens == 2
