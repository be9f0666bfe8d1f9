"""`make demo`'s job end to end: a real server, the client streaming the bundled sample."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = (
    "Speech recognition turns sound into text. Cross attention shows where the model listens."
)


def test_the_sentence_is_the_samples() -> None:
    """SENTENCE is the text samples/hello.wav is made from."""
    assert f'text="{SENTENCE}"' in (ROOT / "samples" / "make_sample.sh").read_text()


def test_demo_prints_tokens_and_writes_the_page(tmp_path: Path) -> None:
    page = tmp_path / "inspector.html"
    done = subprocess.run(
        [sys.executable, ROOT / "scripts" / "demo.py", "--html", page],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "100", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # the transcript's line, under the header: every word of what samples/make_sample.sh says
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert SENTENCE in lines, done.stdout[:2000]
    assert page.is_file() and page.stat().st_size > 10_000
    assert "<canvas" in page.read_text()
