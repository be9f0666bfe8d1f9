"""Benchmark runs as data: the machine, its ceilings, the settings and every figure, as JSON.

Every script under benchmarks/ keeps printing its table and also writes its run:

    from benchmarks import results

    parser = argparse.ArgumentParser(...)
    results.add_arguments(parser)                 # --json FILE|DIR, --no-json
    args = parser.parse_args(argv)
    ...
    results.write(args.json, "decode", settings, figures)

`write` measures the ceilings (fp32 matmul GFLOP/s, memory read GB/s) at the torch thread
count the run used, unless the script passes the ones it measured itself, and writes

    benchmarks/results/<name>/<UTC timestamp>.json       (the default folder)
    DIR/<name>/<UTC timestamp>.json                      (--json DIR)
    FILE                                                 (--json FILE.json)

holding `Run`: name, timestamp, git commit (and whether the tree had uncommitted changes), the
command, the machine (`Machine`: CPU model, the flags that matter, cores, load average, the
versions of torch and its peers), the ceilings (`Ceilings`), the settings and the figures.

Figures are JSON the renderer (scripts/render_benchmarks.py) turns into markdown: a mapping of
section title to either a list of rows (each a mapping column -> value: a table) or a mapping
figure -> value (a two-column table), or a single value. Put units in the names
("ms/token", "seconds", "RTF"). Nothing here is imported by the library.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# CPU flags that decide which kernels run (oneDNN/fbgemm/MKL paths, bf16 and AMX tiles).
FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# torch and the peers a benchmark compares with or runs through.
PACKAGES = (
    "torch",
    "numpy",
    "ctranslate2",
    "faster-whisper",
    "openai-whisper",
    "transformers",
    "grpcio",
    "silero-vad",
)


@dataclass(frozen=True)
class Machine:
    """Where a run ran: enough to tell two hosts apart and to read the figures against."""

    cpu: str
    flags: dict[str, bool]
    cores: int  # os.cpu_count()
    usable_cores: int  # the cores this process may run on (affinity, cgroups aside)
    torch_capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512...
    load_average: float  # 1-minute load average when the run was written
    os: str
    python: str
    versions: dict[str, str | None]  # None: not installed


@dataclass(frozen=True)
class Ceilings:
    """What the machine can do at the run's thread count, measured in the same run."""

    threads: int
    fp32_gflops: float  # best fp32 matmul of `matmul`
    memory_gbps: float  # best read bandwidth: the sum of a 256 MiB fp32 tensor
    matmul: dict[str, float]  # GFLOP/s per dtype and shape


@dataclass(frozen=True)
class Run:
    """One benchmark run, as written to and read from its JSON file."""

    name: str
    timestamp: str  # UTC, ISO 8601 ("2026-12-02T03:20:11Z")
    commit: str | None
    dirty: bool  # tracked files differed from `commit`
    command: str
    machine: Machine
    ceilings: Ceilings | None
    settings: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)


# --- the machine -------------------------------------------------------------------------------


def _cpuinfo() -> tuple[str, set[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (Linux); empty elsewhere."""
    model, flags = "", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> Machine:
    """The CPU model, the flags that matter, cores, load and the versions of torch's peers."""
    model, flags = _cpuinfo()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return Machine(
        cpu=model or platform.processor() or platform.machine(),
        flags={f: f in flags for f in FLAGS},
        cores=os.cpu_count() or 1,
        usable_cores=usable,
        torch_capability=torch.backends.cpu.get_cpu_capability(),
        load_average=round(os.getloadavg()[0], 2),
        os=platform.platform(),
        python=platform.python_version(),
        versions={p: _version(p) for p in PACKAGES},
    )


# --- the ceilings ------------------------------------------------------------------------------


def native_bf16() -> bool:
    """Whether the CPU computes bf16 natively (AVX-512 BF16 or AMX); elsewhere torch emulates
    it, at a small fraction of fp32's speed."""
    _, flags = _cpuinfo()
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def best_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """The shortest of `repeats` timed calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(repeats: int, bf16: bool = True) -> dict[str, float]:
    """Best-of-N GFLOP/s of the encoder's MLP shape (tiny.en) and of a square 2048 matmul,
    fp32 and (`bf16`) bfloat16, at torch's current thread count."""
    shapes = {"1500x384 @ 384x1536": (1500, 384, 1536), "2048 square": (2048, 2048, 2048)}
    dtypes = [(torch.float32, "fp32")] + ([(torch.bfloat16, "bf16")] if bf16 else [])
    out = {}
    for dtype, label in dtypes:
        for name, (m, k, n) in shapes.items():
            a = torch.randn(m, k).to(dtype)  # [m, k]
            b = torch.randn(k, n).to(dtype)  # [k, n]
            best = best_seconds(partial(torch.matmul, a, b), max(repeats, 3))
            out[f"{label} {name}"] = 2 * m * k * n / best / 1e9
    return out


def int8_gops(repeats: int) -> dict[str, float]:
    """Best-of-N GOP/s (a multiply-add counts 2) of torch's dynamic-quantized int8 linear
    (fbgemm, the int8 encoder's product: activations quantized in the call) on the encoder's
    MLP shape (tiny.en) and a square 2048, at torch's current thread count; {} without
    fbgemm."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return {}
    from xattn.model.net.quantized import Int8Linear, has_vnni

    out = {}
    shapes = {"1500x384 @ 384x1536": (1500, 384, 1536), "2048 square": (2048, 2048, 2048)}
    for name, (m, k, n) in shapes.items():
        linear = Int8Linear(torch.nn.Linear(k, n, bias=False), reduce_range=not has_vnni())
        x = torch.randn(m, k)  # [m, k]
        with torch.inference_mode():
            best = best_seconds(partial(linear, x), max(repeats, 3))
        out[f"int8 {name}"] = 2 * m * k * n / best / 1e9
    return out


def memory_gbps(repeats: int) -> float:
    """Best-of-N read bandwidth: the sum of a 256 MiB fp32 tensor."""
    x = torch.ones(64 * 1024 * 1024)  # [64 Mi] fp32 = 256 MiB
    return x.numel() * 4 / best_seconds(x.sum, max(repeats, 3)) / 1e9


def ceilings(repeats: int = 3, matmul: Mapping[str, float] | None = None) -> Ceilings:
    """The fp32 matmul and memory ceilings now, at torch's current thread count (a few
    seconds); `matmul` reuses GFLOP/s a script measured already (`matmul_gflops`)."""
    mm = dict(matmul) if matmul is not None else matmul_gflops(repeats, bf16=False)
    fp32 = max(v for k, v in mm.items() if k.startswith("fp32"))
    return Ceilings(
        threads=torch.get_num_threads(),
        fp32_gflops=round(fp32, 1),
        memory_gbps=round(memory_gbps(repeats), 2),
        matmul={k: round(v, 1) for k, v in mm.items()},
    )


# --- writing and reading -----------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def command_line() -> str:
    """How this process was started, as one would type it from the repository root."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if argv and Path(argv[0]).name.startswith("python"):
        argv[0] = "python"
        m = argv.index("-m") if "-m" in argv else 1
        argv[1:m] = [a for a in argv[1:m] if a != "-u"]  # python -u: output unbuffered
    return shlex.join(argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--json FILE|DIR and --no-json, for every benchmark script."""
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS,
        metavar="FILE|DIR",
        help="write the run as JSON: a .json file, or a folder for <name>/<UTC time>.json "
        "(default: benchmarks/results)",
    )
    parser.add_argument("--no-json", action="store_true", help="only print, write no JSON")


def target(path_or_dir: Path | str, name: str, timestamp: str) -> Path:
    """The file a run goes to: `path_or_dir` itself if it ends in .json, else
    <path_or_dir>/<name>/<timestamp without separators>.json."""
    path = Path(path_or_dir)
    if path.suffix == ".json":
        return path
    stamp = timestamp.replace("-", "").replace(":", "")  # 20261202T032011Z
    return path / name / f"{stamp}.json"


def write(
    path_or_dir: Path | str | None,
    name: str,
    settings: Mapping[str, Any],
    figures: Mapping[str, Any],
    measured: Ceilings | None = None,
) -> Path | None:
    """Write one run as JSON and return its path; `path_or_dir` None writes nothing.

    `measured`: the ceilings the script measured itself; None measures them now."""
    if path_or_dir is None:
        return None
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    timestamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if measured is None:
        measured = ceilings()
    run = Run(
        name=name,
        timestamp=timestamp,
        commit=_git("rev-parse", "HEAD"),
        dirty=bool(_git("status", "--porcelain", "--untracked-files=no")),
        command=command_line(),
        machine=machine(),
        ceilings=measured,
        settings=dict(settings),
        figures=dict(figures),
    )
    path = target(path_or_dir, name, timestamp)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(run), indent=1, default=_jsonable) + "\n")
    return path


def write_from(
    args: argparse.Namespace,
    name: str,
    settings: Mapping[str, Any],
    figures: Mapping[str, Any],
    measured: Ceilings | None = None,
) -> Path | None:
    """`write` with the --json / --no-json of `add_arguments`; says where it wrote (stderr)."""
    path = write(None if args.no_json else args.json, name, settings, figures, measured)
    if path is not None:
        print(f"results: {path}", file=sys.stderr)
    return path


def _jsonable(value: object) -> object:
    """Paths, tuples of numbers and numpy/torch scalars as JSON."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def load(path: Path | str) -> Run:
    """A run read back from its JSON file."""
    data = json.loads(Path(path).read_text())
    data["machine"] = Machine(**data["machine"])
    if data.get("ceilings") is not None:
        data["ceilings"] = Ceilings(**data["ceilings"])
    return Run(**data)


def latest(root: Path | str = RESULTS) -> dict[str, Path]:
    """Each benchmark's newest result file under `root` (<root>/<name>/<UTC time>.json)."""
    out: dict[str, Path] = {}
    if not Path(root).is_dir():
        return out
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.json"))
        if files:
            out[folder.name] = files[-1]
    return out
