"""Shared fixtures: paths to the test audio in ../shared/audio beside the repository."""

from collections import Counter
from pathlib import Path

import pytest

SHARED_AUDIO = Path(__file__).resolve().parents[1].parent / "shared" / "audio"


def _shared(name: str) -> Path:
    path = SHARED_AUDIO / name
    if not path.is_file():
        pytest.skip(f"shared test audio missing: {path}")
    return path


@pytest.fixture(scope="session")
def shared_audio_dir() -> Path:
    """The folder ../shared/audio (relative to the repository root); skips without it, as
    the clips' own fixtures do."""
    if not SHARED_AUDIO.is_dir():
        pytest.skip(f"shared test audio missing: {SHARED_AUDIO}")
    return SHARED_AUDIO


@pytest.fixture(scope="session")
def jfk_path() -> Path:
    """11.0 s, 44.1 kHz, 24-bit stereo FLAC of J. F. Kennedy's "ask not ..."."""
    return _shared("jfk.flac")


@pytest.fixture(scope="session")
def multilingual_path() -> Path:
    """60 s, 24 kHz mono MP3: English, then German after 30 s."""
    return _shared("multilingual.mp3")


FUZZ_TRIED = pytest.StashKey[Counter]()


@pytest.fixture(scope="session")
def fuzz_tried(request: pytest.FixtureRequest) -> Counter:
    """Inputs the fuzz tests tried, by kind and outcome; printed in the summary."""
    return request.config.stash.setdefault(FUZZ_TRIED, Counter())


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    tried = config.stash.get(FUZZ_TRIED, None)
    if not tried:
        return
    terminalreporter.section("fuzzing: inputs tried")
    for kind, n in sorted(tried.items()):
        terminalreporter.write_line(f"{kind}: {n}")
    terminalreporter.write_line(f"total: {sum(tried.values())}")
