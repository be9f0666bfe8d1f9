"""The docs cannot drift: their marked examples run against a real server, and the benchmark
page is what the results files render to.

A fenced block (```sh, ```bash or ```python) right after a line `<!-- test -->` in README.md
or docs/*.md is an example that must run here. Each runs in a scratch folder that links the
repository's top-level entries (so `samples/hello.wav` and `.venv/bin/xattn` resolve and
anything it writes stays out of the tree), with `.venv/bin` first on PATH, against one
tiny.en server this module starts (`python -m xattn.service --port 0 --http-port 0`): the
address `127.0.0.1:50051` (or `localhost:50051`) in an example is replaced by that server's
gRPC address, `127.0.0.1:8000` (or `localhost:8000`) by its HTTP one, and XATTN_SERVER
(XATTN_PORT) points at it. A shell block runs under `bash -euo pipefail`, a
Python block as a script; both must exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from conftest import requires_tool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import render, results
from benchmarks.results import RESULTS, latest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- test -->"
LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}
# system tools an example may run (a shell block that runs one skips without it, naming it)
TOOLS = ("ffmpeg", "sox", "espeak-ng", "arecord", "grpcurl", "openssl", "docker-compose", "kubectl")
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):50051\b")
HTTP_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):8000\b")
TIMEOUT = 120  # seconds an example may take (a loaded 2-core CI machine)


@dataclass(frozen=True)
class Example:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str  # "sh" or "python"
    code: str

    @property
    def name(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page.as_posix()}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The marked blocks of one page; ValueError for a mark not followed by a runnable fence."""
    lines = page.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = lines[j].strip() if j < len(lines) else ""
        language = LANGUAGES.get(fence.removeprefix("```").split(" ")[0])
        if not fence.startswith("```") or language is None:
            raise ValueError(f"{page}:{i + 1}: {MARK} must precede a ```sh or ```python block")
        end = next((k for k in range(j + 1, len(lines)) if lines[k].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{j + 1}: the block never closes")
        out.append(Example(page, j + 1, language, "\n".join(lines[j + 1 : end]) + "\n"))
    return out


EXAMPLES = [e for page in PAGES if page.is_file() for e in examples(page)]


def tools_run(code: str) -> list[str]:
    """The TOOLS a shell block runs as a command (at a line's start, or after | ; && $( )."""
    return [
        tool
        for tool in TOOLS
        if re.search(rf"(?:^|[|;&(])\s*{re.escape(tool)}(?=\s|$)", code, re.M)
    ]


def test_tools_run_finds_commands_only() -> None:
    assert tools_run("ffmpeg -i a.wav -f s16le - | xattn stream -\n") == ["ffmpeg"]
    assert tools_run("x=$(sox a.wav -n stat) && openssl version") == ["sox", "openssl"]
    assert tools_run("xattn transcribe ffmpeg-notes.wav  # not sox\n") == []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real tiny.en server on free loopback ports; its gRPC and HTTP addresses once it is
    SERVING."""
    folder = tmp_path_factory.mktemp("docs-server")
    port_file, http_port_file = folder / "port", folder / "http-port"
    command = [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)]
    command += ["--http-port", "0", "--http-port-file", str(http_port_file)]
    command += ["--model", "tiny.en", "--log-level", "WARNING"]
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not all(p.is_file() and p.read_text().strip() for p in (port_file, http_port_file)):
            assert proc.poll() is None, (folder / "server.log").read_text()
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.05)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "the server never said SERVING"
                time.sleep(0.1)
        yield address, f"127.0.0.1:{int(http_port_file.read_text())}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch folder that looks like the repository root (links to its entries)."""
    folder = tmp_path_factory.mktemp("docs-examples")
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "out"}:
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_runs(example: Example, server: tuple[str, str], sandbox: Path) -> None:
    if example.language == "sh":
        for tool in tools_run(example.code):
            requires_tool(tool)
    server, http_server = server
    code = HTTP_ADDRESS.sub(http_server, ADDRESS.sub(server, example.code))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["XATTN_SERVER"] = server
    env["XATTN_PORT"] = server.rsplit(":", 1)[1]  # deploy/health_probe.py's default port
    if example.language == "sh":
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        command = [sys.executable, "-c", code]
    done = subprocess.run(
        command, cwd=sandbox, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, (
        f"{example.name} exited {done.returncode}\n--- code\n{code}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def test_examples_are_marked() -> None:
    """The pages mark examples (the parser found them), the API page's among them."""
    assert {e.page.name for e in EXAMPLES} >= {"api.md", "how-it-works.md"}


def test_mark_must_precede_a_runnable_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"text\n{MARK}\n\n```python\nprint(1)\n```\n{MARK}\n```json\n{{}}\n```\n")
    with pytest.raises(ValueError, match="page.md:7"):
        examples(page)
    page.write_text(f"{MARK}\n```sh\necho 1\n```\n")
    assert examples(page) == [Example(page, 2, "sh", "echo 1\n")]


def test_benchmarks_page_is_current() -> None:
    """docs/benchmarks.md, and README's results table when README has its markers, are what
    `python -m benchmarks.render` makes of the newest results files."""
    files = latest(RESULTS)
    stale = "stale: run `python -m benchmarks.render`"
    assert render.PAGE.read_text() == render.render(files), stale
    readme = render.README.read_text()
    spliced = render.splice(readme, render.summary(files))
    assert spliced is None or spliced == readme, stale
    home = render.HOME_ASSISTANT.read_text()  # the Wyoming table
    block = render.wyoming_summary(files)
    spliced = render.splice(home, block, render.WYOMING_BEGIN, render.WYOMING_END)
    assert spliced == home, stale


def test_splice_replaces_only_the_marked_block() -> None:
    text = f"a\n{render.BEGIN}\nold\n{render.END}\nb\n"
    assert render.splice(text, "new\n") == f"a\n{render.BEGIN}\nnew\n{render.END}\nb\n"
    assert render.splice("no markers\n", "new\n") is None


def test_results_round_trip(tmp_path: Path) -> None:
    """A run written by benchmarks.results reads back whole, where render looks for it."""
    ceilings = results.Ceilings(threads=2, fp32_gflops=100.0, memory_gbps=20.0, matmul={"x": 1})
    figures = {"table": [{"case": "a", "seconds": 0.5}], "pairs": {"k": 1}, "text": "t"}
    path = results.write(tmp_path, "demo", {"model": "tiny.en"}, figures, ceilings)
    assert path is not None and path.parent == tmp_path / "demo"
    assert re.fullmatch(r"\d{8}T\d{6}Z\.json", path.name)
    run = results.load(path)
    assert (run.name, run.settings, run.figures, run.ceilings) == (
        "demo",
        {"model": "tiny.en"},
        figures,
        ceilings,
    )
    assert run.machine.cores >= 1 and "torch" in run.machine.versions
    assert latest(tmp_path) == {"demo": path}
    assert results.write(tmp_path / "one.json", "demo", {}, {}, ceilings) == tmp_path / "one.json"
    page = render.render({"demo": path})
    assert "| case | seconds |" in page and "| a | 0.5 |" in page and "**text**: t" in page


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {render.anchor(h.replace("`", "")) for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_resolve(page: Path) -> None:
    """Every relative link of README.md and docs/ names a file that exists, and a heading
    of it when it has an anchor."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
