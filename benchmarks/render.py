"""Render docs/benchmarks.md from the newest result file of each benchmark.

    python -m benchmarks.render            # rewrite docs/benchmarks.md
    python -m benchmarks.render --check    # exit 1 if the page is out of date

One section per benchmark (benchmarks/results/<name>/, its newest <UTC time>.json), with the
command that produced it, when, the commit, the settings and one table per figure group; the
machine is stated once at the top (and a section names what differs where a run came from
another machine). tests/test_docs.py checks that the page equals what this renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from benchmarks.results import RESULTS, ROOT, Run, latest, load

PAGE = ROOT / "docs" / "benchmarks.md"
# The sections come in this order; other benchmarks follow alphabetically.
ORDER = ("decode", "service", "longform", "longform_vad", "streaming", "startup", "wer", "scale")
ORDER += ("live_page", "soak")
TITLES = {
    "decode": "Decoding in one process: ceilings, encoder, decoder step, end to end",
    "service": "Through the server: gRPC overhead and load",
    "longform": "Long audio: real-time factor and cost per window",
    "streaming": "Live recognition: commit delay and compute",
    "startup": "Start-up to health SERVING",
    "soak": "Soak: mixed traffic for a while",
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
    if run.settings:
        lines += ["", "Settings: " + ", ".join(f"{k} {cell(v)}" for k, v in run.settings.items())]
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


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page (docs/benchmarks.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render(latest(args.results) if args.results.is_dir() else {})
    if args.check:
        if not args.out.is_file() or args.out.read_text() != text:
            print(f"{args.out} is out of date: python -m benchmarks.render", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
