"""Render docs/benchmarks.md from the newest result file of each benchmark.

    python -m benchmarks.render            # rewrite docs/benchmarks.md (README's, live.md's tables)
    python -m benchmarks.render --check    # exit 1 if either is out of date

One section per benchmark (benchmarks/results/<name>/, its newest <UTC time>.json), with the
command that produced it, when, the commit, the settings (but those named _...: raw data) and
one table per figure group; the machine is stated once at the top (and a section names what
differs where a run came from another machine). README.md's one results table (the newest
decode run, end to end) is written between its BEGIN and END marker lines, when it has them,
docs/live.md's (the newest live_scale run's levels) between LIVE_BEGIN and LIVE_END, and
docs/home-assistant.md's (the newest Wyoming run) between WYOMING_BEGIN and WYOMING_END.
tests/test_docs.py checks that all equal what this renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from benchmarks.results import RESULTS, ROOT, Run, latest, load

PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
# README.md's results table lives between these two lines (when README has them).
BEGIN = "<!-- results: begin (python -m benchmarks.render writes this table) -->"
END = "<!-- results: end -->"
# docs/live.md's measured table (the newest live_scale run) lives between these two lines.
LIVE = ROOT / "docs" / "live.md"
LIVE_BEGIN = "<!-- live_scale: begin (python -m benchmarks.render writes this table) -->"
LIVE_END = "<!-- live_scale: end -->"
LIVE_COLUMNS = (
    "door", "streams", "lag median s", "lag p90 s", "WER live (S/D/I of words)",
    "WER offline default", "never committed", "refusals", "compute s per audio s",
    "encoder floor s per audio s", "peak RSS MB",
)  # fmt: skip
# docs/live.md's table of live finals per lever (the newest live_wer run) between these two.
LIVE_WER_BEGIN = "<!-- live_wer: begin (python -m benchmarks.render writes this table) -->"
LIVE_WER_END = "<!-- live_wer: end -->"
LIVE_WER_COLUMNS = (
    "model", "set", "lever", "WER %", "errors/words (S/D/I)", "vs full pp (95 % CI)",
    "vs offline pp", "lag median s", "lag p90 s", "encoder frames a step", "encoder ms a step",
    "decoder steps a step", "step ms", "steps", "skipped steps",
)  # fmt: skip
# docs/home-assistant.md's table of the newest Wyoming run lives between these two.
HOME_ASSISTANT = ROOT / "docs" / "home-assistant.md"
WYOMING_BEGIN = "<!-- wyoming: begin (python -m benchmarks.render writes this table) -->"
WYOMING_END = "<!-- wyoming: end -->"
END_TO_END = "end to end: file bytes -> text"
AGAINST_INT8 = "against faster-whisper int8: seconds over its seconds, plain text"  # end_to_end
# The sections come in this order; other benchmarks follow alphabetically.
ORDER = ("decode", "service", "longform", "longform_vad", "streaming", "startup", "wer", "scale")
ORDER += ("live_page", "http_api", "load", "live_scale", "live_wer", "soak", "wyoming")
TITLES = {
    "decode": "Decoding in one process: ceilings, encoder, decoder step, end to end",
    "service": "Through the server: gRPC overhead and load",
    "longform": "Long audio: real-time factor and cost per window",
    "streaming": "Live recognition: commit delay and compute",
    "startup": "Start-up to health SERVING",
    "longform_vad": "Long audio with VAD and batches, beside faster-whisper",
    "wer": "Word error rate on the shared real speech, greedy and beam 5",
    "scale": "Replicas behind HAProxy",
    "live_page": "The live page: word commit delay, page, bridge and gRPC alone",
    "http_api": "OpenAI's API over HTTP against gRPC: unary and first delta",
    "load": "Load: concurrent clients over gRPC and HTTP, beside faster-whisper-server",
    "live_scale": "Many live streams: gRPC and Realtime, beside WhisperLiveKit",
    "live_wer": "Live finals per lever: WER, lag and encoder cost beside the offline default",
    "soak": "Soak: mixed traffic for a while",
    "metrics": "What watching costs: metrics and traces against neither",
    "wyoming": "Wyoming (Home Assistant): audio-stop to transcript, beside wyoming-faster-whisper",
}


def cell(value: object) -> str:
    """One value as markdown table text."""
    if value is None or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict | list):
        return f"`{json.dumps(value, separators=(', ', ': '))}`"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: Iterable[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def figure(title: str, value: object) -> list[str]:
    """A figure group: rows -> a table; a mapping -> a table (two columns, or one row per key
    when its values are mappings); anything else -> one line."""
    if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
        columns = list(dict.fromkeys(k for r in value for k in r))
        return [f"**{title}**", "", *table(columns, ([r.get(c) for c in columns] for r in value))]
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        columns = list(dict.fromkeys(k for r in value.values() for k in r))
        rows = ([name, *(r.get(c) for c in columns)] for name, r in value.items())
        return [f"**{title}**", "", *table(["", *columns], rows)]
    if isinstance(value, dict) and value:
        rows = ([k, v] for k, v in value.items())
        return [f"**{title}**", "", *table(["figure", "value"], rows)]
    return [f"**{title}**: {cell(value)}"]


def machine_lines(run: Run) -> list[str]:
    m = run.machine
    has = [f for f, on in m.flags.items() if on]
    lacks = [f for f, on in m.flags.items() if not on]
    versions = ", ".join(f"{p} {v}" for p, v in m.versions.items() if v is not None)
    return table(
        ["", ""],
        [
            ["CPU", f"{m.cpu}, {m.cores} cores ({m.usable_cores} usable)"],
            ["flags", ", ".join(has) + (f" (not: {', '.join(lacks)})" if lacks else "")],
            ["torch CPU capability", m.torch_capability],
            ["versions", f"Python {m.python}, {versions}"],
            ["OS", m.os],
        ],
    )


def differences(run: Run, reference: Run) -> list[str]:
    """What in `run`'s machine differs from the one stated at the top."""
    a, b = run.machine, reference.machine
    out = [
        f"{k} {getattr(a, k)}"
        for k in ("cpu", "cores", "usable_cores")
        if getattr(a, k) != getattr(b, k)
    ]
    out += [f"{f} {'yes' if on else 'no'}" for f, on in a.flags.items() if b.flags.get(f) != on]
    out += [f"{p} {v}" for p, v in a.versions.items() if b.versions.get(p) != v]
    return out


def section(name: str, run: Run, path: Path, reference: Run) -> list[str]:
    commit = (run.commit or "unknown")[:10] + (" with uncommitted changes" if run.dirty else "")
    lines = [f"## {TITLES.get(name, name)}", ""]
    lines += [f"`{run.command}`", ""]
    lines += [
        f"{run.timestamp}, commit {commit}, load average {run.machine.load_average:g} "
        f"when written; file `{shown(path)}`.",
    ]
    if diff := differences(run, reference):
        lines += ["", f"Unlike the machine above: {', '.join(diff)}."]
    if run.ceilings is not None:
        c = run.ceilings
        lines += [
            "",
            f"Ceilings in this run, {c.threads} threads: fp32 matmul {c.fp32_gflops:g} GFLOP/s, "
            f"memory read {c.memory_gbps:g} GB/s.",
        ]
    settings = {k: v for k, v in run.settings.items() if not k.startswith("_")}  # _: raw data
    if settings:
        lines += ["", "Settings: " + ", ".join(f"{k} {cell(v)}" for k, v in settings.items())]
    for title, value in run.figures.items():
        lines += ["", *figure(title, value)]
    return lines + [""]


def shown(path: Path) -> str:
    """A result file's path from the repository root (absolute when outside it)."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def ordered(files: Mapping[str, Path]) -> list[str]:
    known = [n for n in ORDER if n in files]
    return known + sorted(n for n in files if n not in ORDER)


def render(files: Mapping[str, Path]) -> str:
    """The page for these result files ({benchmark name: its newest file})."""
    names = ordered(files)
    runs = {n: load(files[n]) for n in names}
    lines = [
        "<!-- Generated by `python -m benchmarks.render` from the newest file of each folder",
        "     under benchmarks/results/. Do not edit: rerun a benchmark, then the renderer. -->",
        "# Benchmark results",
        "",
        "The newest run of each script under [`benchmarks/`](../benchmarks/), as it wrote it "
        "(`--json`). What each figure means and how it is measured: "
        "[benchmarks/README.md](../benchmarks/README.md). Older runs are in "
        "`benchmarks/results/` and in git. On a shared or busy machine read the ratios, "
        "not the absolute numbers (each run states its load average).",
        "",
    ]
    if not runs:
        return "\n".join([*lines, "No results yet.", ""])
    reference = runs[names[0]]
    lines += ["## Machine", "", *machine_lines(reference), ""]
    lines += ["Contents: " + ", ".join(f"[{n}](#{anchor(TITLES.get(n, n))})" for n in names), ""]
    for n in names:
        lines += section(n, runs[n], files[n], reference)
    return "\n".join(lines)


def summary(files: Mapping[str, Path]) -> str:
    """README's one results table: the newest decode run's end to end figures, its machine
    and its command."""
    run = load(files["decode"]) if "decode" in files else None
    if run is None or END_TO_END not in run.figures:
        return "No results yet: run `python -m benchmarks.decode`.\n"
    m, c, st = run.machine, run.ceilings, run.settings
    flags = ", ".join(
        f for f, on in m.flags.items() if on and f in ("avx2", "avx512f", "avx512_bf16", "amx_tile")
    )
    ceilings = (
        f"; fp32 matmul {c.fp32_gflops:g} GFLOP/s, memory {c.memory_gbps:g} GB/s" if c else ""
    )
    lines = [
        f"{st.get('model')} on {st.get('clip')} ({st.get('audio seconds')} s), file bytes in, "
        f"text out, {st.get('threads')} threads, median of {st.get('repeats')}; "
        f"{m.cpu} ({flags}), {m.cores} cores{ceilings}; load average {m.load_average:g}; "
        f"{run.timestamp[:10]}, `{run.command}`:",
        "",
    ]
    rows = run.figures[END_TO_END]
    lines += table(
        ["", "seconds", "vs ours", "same text"],
        ([r["case"], r["seconds"], r["vs ours"], r["same text as ours"]] for r in rows),
    )
    against = run.figures.get(AGAINST_INT8)
    if isinstance(against, dict) and against:
        columns = list(dict.fromkeys(c for r in against.values() for c in r))
        lines += ["", f"Each clip and beam, {AGAINST_INT8} (below 1: faster):", ""]
        lines += table(
            ["", *columns], ([k, *(r.get(c) for c in columns)] for k, r in against.items())
        )
    lines += [
        "",
        "Every benchmark, its machine and settings: [docs/benchmarks.md](docs/benchmarks.md).",
    ]
    return "\n".join(lines) + "\n"


def live_summary(files: Mapping[str, Path]) -> str:
    """docs/live.md's table: the newest live_scale run's levels, its conditions and command."""
    run = load(files["live_scale"]) if "live_scale" in files else None
    rows = run.figures.get("live streams at real time") if run is not None else None
    if run is None or not rows:
        return "No results yet: run `python -m benchmarks.live_scale`.\n"
    m, st = run.machine, run.settings
    lines = [
        f"{st.get('model')}, {st.get('audio a stream s')} s of real speech a stream at real "
        f"time; {m.cpu}, {m.cores} cores, load average {st.get('load average at the start')} "
        f"at the start (a shared host: read the levels against each other); "
        f"{run.timestamp[:10]}, `{run.command}`. WER: % (substitutions/deletions/insertions "
        "of the references' words); all columns: [benchmarks.md](benchmarks.md).",
        "",
    ]
    lines += table(list(LIVE_COLUMNS), ([r.get(c) for c in LIVE_COLUMNS] for r in rows))
    return "\n".join(lines) + "\n"


def live_wer_summary(files: Mapping[str, Path]) -> str:
    """docs/live.md's lever table: the newest live_wer run's rows, its conditions and command,
    and which levers keep the finals' WER within 0.5 pp of the whole window on every set."""
    run = load(files["live_wer"]) if "live_wer" in files else None
    rows = run.figures.get("live finals per lever") if run is not None else None
    if run is None or not rows:
        return "No results yet: run `python -m benchmarks.live_wer`.\n"
    st = run.settings
    lines = [
        f"{run.timestamp[:10]}, `{run.command}`; {run.machine.cpu}, {run.machine.cores} cores, "
        f"{st.get('processes')} processes of {st.get('torch threads a process')} torch thread; "
        f"load average {cell(st.get('load average before (1, 5, 15 min)'))} before, "
        f"{cell(st.get('load average after (1, 5, 15 min)'))} after (1, 5, 15 min; a shared "
        f"host: milliseconds are noisy, frames exact); feeds of {st.get('chunk s')} s. Levers: "
        + "; ".join(f"{k} {cell(v)}" for k, v in st.get("levers", {}).items())
        + ".",
        "",
    ]
    lines += table(list(LIVE_WER_COLUMNS), ([r.get(c) for c in LIVE_WER_COLUMNS] for r in rows))
    full = {(r["model"], r["set"]): r["WER %"] for r in rows if r["lever"] == "full"}
    levers = dict.fromkeys(r["lever"] for r in rows if r["lever"] not in ("full", "offline"))
    within = [
        lv
        for lv in levers
        if all(
            r["WER %"] <= full.get((r["model"], r["set"]), -1.0) + 0.5
            for r in rows
            if r["lever"] == lv
        )
    ]
    lines += ["", f"Within 0.5 pp of the whole window on every model and set: {cell(within)}."]
    return "\n".join(lines) + "\n"


def wyoming_summary(files: Mapping[str, Path]) -> str:
    """docs/home-assistant.md's table: the newest Wyoming run at real-time feed, its goals
    and its conditions."""
    run = load(files["wyoming"]) if "wyoming" in files else None
    if run is None:
        return "No results yet: run `python -m benchmarks.wyoming`.\n"
    st = run.settings
    loads = st.get("load average before"), st.get("load average after")
    lines = [
        f"{run.timestamp[:10]}, `{run.command}`; {run.machine.cpu}, {st.get('threads')} CPU "
        f"threads each; load average {loads[0]} before, {loads[1]} after (1, 5, 15 min); "
        f"{len(st.get('samples', []))} commands and sentences, each followed by "
        f"{st.get('trailing silence s')} s of silence:",
        "",
    ]
    for title in ("per server, model and feed", "goals at real time"):
        if run.figures.get(title):
            lines += [*figure(title, run.figures[title]), ""]
    lines += [
        "Every figure: [docs/benchmarks.md](benchmarks.md#" + anchor(TITLES["wyoming"]) + ")."
    ]
    return "\n".join(lines) + "\n"


def splice(text: str, block: str, begin: str = BEGIN, end: str = END) -> str | None:
    """`text` with what lies between `begin` and `end` replaced by `block`; None without
    them."""
    if begin not in text or end not in text:
        return None
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}{end}{tail}"


def pages(files: Mapping[str, Path], page: Path = PAGE, readme: Path = README) -> dict[Path, str]:
    """Every generated page's text: docs/benchmarks.md, and the marked blocks of README,
    docs/live.md and docs/home-assistant.md where those files have their markers."""
    out = {page: render(files)}
    for path, block, begin, end in (
        (readme, summary(files), BEGIN, END),
        (LIVE, live_summary(files), LIVE_BEGIN, LIVE_END),
        (LIVE, live_wer_summary(files), LIVE_WER_BEGIN, LIVE_WER_END),
        (HOME_ASSISTANT, wyoming_summary(files), WYOMING_BEGIN, WYOMING_END),
    ):
        if path.is_file():  # a page with two blocks (docs/live.md): the second over the first
            spliced = splice(out.get(path) or path.read_text(), block, begin, end)
            if spliced is not None:
                out[path] = spliced
    return out


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page (docs/benchmarks.md)")
    parser.add_argument("--readme", type=Path, default=README, help="README with the markers")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    files = latest(args.results)
    texts = pages(files, args.out, args.readme)
    stale = [p for p, text in texts.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p} is out of date: python -m benchmarks.render", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(texts[p])
    return 0


if __name__ == "__main__":
    sys.exit(main())
