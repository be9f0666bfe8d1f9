"""Server start-up: seconds from launching `python -m xattn.service` to health SERVING, by part.

    python -m benchmarks.startup [--repeats 5] [--model tiny.en] [--compute auto] [--threads N]

Each run launches `python -m xattn.service --port 0 --port-file <tmp>` (the log at INFO to a file),
polls every 50 ms for the port file and then the standard gRPC health service
(grpc.health.v1.Health/Check, service "", which the server sets SERVING once the model is
loaded and warmed up), then sends SIGTERM and waits for the exit. From the server's own log
lines: launch -> "listening" (interpreter, imports, gRPC start), the `load_pipeline` seconds
("loaded ... in X s"), the warm-up seconds ("warmed up ... in X s"), and the rest. Beside it,
as separate processes, `python -c pass`, `-c "import torch"` and
`-c "import xattn.service.__main__"`
(everything the server imports), and in this process `load_pipeline` and `Pipeline.warm_up`.

All cases run round-robin (see benchmarks/decode.py), median of `--repeats`. Target: under
5 s to SERVING with tiny.en. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import results
from benchmarks.decode import contention, median, round_robin
from xattn.model.net.whisper import COMPUTES
from xattn.model.pipeline import load_pipeline

ROOT = Path(__file__).resolve().parents[1]
POLL = 0.05  # seconds between polls
TIMEOUT = 120.0  # seconds a launch may take to SERVING
TARGET = 5.0  # seconds to SERVING (tiny.en)
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")


@dataclass
class Launch:
    """One server start, seconds from the launch (wall clock, as the log's timestamps)."""

    serving: float  # health Check first answered SERVING
    listening: float | None  # the "xattn listening on" log line
    load: float | None  # "loaded ... in X s" (load_pipeline's own timing)
    warm_up: float | None  # "warmed up ... in X s"
    stop: float  # SIGTERM -> exit
    exit_code: int


@dataclass
class Records:
    launches: list[Launch] = field(default_factory=list)
    load: list[float] = field(default_factory=list)  # in-process load_pipeline
    warm_up: list[float] = field(default_factory=list)  # in-process Pipeline.warm_up
    compute: str = ""  # the compute path that ran (Pipeline.compute)


def child_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def python_case(code: str, env: dict[str, str]) -> Callable[[], None]:
    """A fresh interpreter running `code` (round_robin times the whole process)."""

    def run() -> None:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)

    return run


def log_times(log: str, launched: float) -> dict[str, float]:
    """Seconds from `launched` of the "listening" line, and the load and warm-up seconds."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = LOG_LINE.match(line)
        if not m:
            continue
        stamp = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - launched
        message = m[2]
        if message.startswith("xattn listening on"):
            out["listening"] = stamp
        elif (hit := re.match(r"loaded .* in ([\d.]+) s$", message)) is not None:
            out["load"] = float(hit[1])
        elif (hit := re.match(r"warmed up .* in ([\d.]+) s$", message)) is not None:
            out["warm_up"] = float(hit[1])
    return out


def health_status(port: int) -> int | None:
    """The health status of service "" (None: no answer yet)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0).status
        except grpc.RpcError:
            return None


def launch(args: argparse.Namespace, env: dict[str, str], out: list[Launch]) -> None:
    """Start the server, wait for SERVING, SIGTERM it, wait; append what was seen to `out`."""
    with tempfile.TemporaryDirectory(prefix="xattn-startup-") as tmp:
        port_file, log_path = Path(tmp) / "port", Path(tmp) / "server.log"
        command = [sys.executable, "-m", "xattn.service", "--port", "0"]
        command += ["--port-file", str(port_file)]
        command += ["--model", args.model, "--compute", args.compute, "--log-level", "INFO"]
        with log_path.open("w") as log:
            launched, t0 = time.time(), time.perf_counter()
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
            try:
                serving = wait_serving(proc, port_file, t0)
            finally:
                t_stop = time.perf_counter()
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(60)
                stop = time.perf_counter() - t_stop
        if serving is None:
            raise SystemExit(f"the server did not reach SERVING:\n{log_path.read_text()}")
        seen = log_times(log_path.read_text(), launched)
        times = (seen.get("listening"), seen.get("load"), seen.get("warm_up"))
        out.append(Launch(serving, *times, stop=stop, exit_code=code))


def wait_serving(proc: subprocess.Popen, port_file: Path, t0: float) -> float | None:
    """Seconds from t0 to the first SERVING answer, polling every POLL s (None: it died)."""
    port = None
    while time.perf_counter() - t0 < TIMEOUT and proc.poll() is None:
        if port is None and port_file.exists():
            port = int(port_file.read_text())
        if port is not None and health_status(port) == health_pb2.HealthCheckResponse.SERVING:
            return time.perf_counter() - t0
        time.sleep(POLL)
    return None


def in_process(args: argparse.Namespace, records: Records) -> None:
    t0 = time.perf_counter()
    pipe = load_pipeline(args.model, compute=args.compute)
    records.load.append(time.perf_counter() - t0)
    records.warm_up.append(pipe.warm_up())
    records.compute = pipe.compute


def header(title: str) -> None:
    print(f"\n{title:<47} {'seconds':>8}")


def row(label: str, seconds: float | None, note: str = "") -> None:
    value = "       -" if seconds is None else f"{seconds:8.3f}"
    print(f"   {label:<44} {value}  {note}".rstrip())


def known(xs: list[float | None]) -> float | None:
    values = [x for x in xs if x is not None]
    return median(values) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="launches (median)")
    parser.add_argument("--model", default="tiny.en", help="the server's --model")
    parser.add_argument("--compute", default="auto", choices=(*COMPUTES, "auto"))
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS (default: not set)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = child_env(args.threads)
    threads = torch.get_num_threads()
    t_start = time.perf_counter()
    print(
        f"xattn start-up benchmark: {args.model}, --compute {args.compute}, torch "
        f"{torch.__version__}, {threads} threads, median of {args.repeats}, polls every "
        f"{POLL * 1e3:.0f} ms"
    )
    before = contention(threads)
    print(f"machine: {before}")

    records = Records()
    cases = {
        "python -c pass": python_case("pass", env),
        "import torch": python_case("import torch", env),
        "import xattn.service.__main__": python_case("import xattn.service.__main__", env),
        "server": lambda: launch(args, env, records.launches),
        "in-process": lambda: in_process(args, records),
    }
    times = round_robin(cases, args.repeats, warmup=1)  # the warm-up round fills file caches
    launches = records.launches[1:]
    records.load, records.warm_up = records.load[1:], records.warm_up[1:]
    serving = median([x.serving for x in launches])
    listening = known([x.listening for x in launches])
    load, warm = known([x.load for x in launches]), known([x.warm_up for x in launches])

    header("1. separate processes, start to exit")
    for name in ("python -c pass", "import torch", "import xattn.service.__main__"):
        row(f"python -c {name!r}" if name != "python -c pass" else name, median(times[name]))
    header("2. in this process (imports done)")
    row("load_pipeline", median(records.load), f"compute {records.compute}")
    row("Pipeline.warm_up (1 s of near-silence)", median(records.warm_up))
    header("3. python -m xattn.service, launch to health SERVING")
    row("launch -> listening (python, imports, gRPC)", listening)
    row("load_pipeline ('loaded ... in X s')", load)
    row("warm-up ('warmed up ... in X s')", warm)
    parts = [listening, load, warm]
    rest = serving - sum(p for p in parts if p is not None) if None not in parts else None
    row("the rest (thread hops, health set, poll)", rest, f"poll resolution {POLL:g} s")
    verdict = "met" if serving < TARGET else "NOT met"
    row("launch -> SERVING", serving, f"target < {TARGET:g} s: {verdict}")
    each = ", ".join(f"{x.serving:.2f}" for x in launches)
    print(f"   each launch: {each}")
    stops = median([x.stop for x in launches])
    codes = sorted({x.exit_code for x in launches})
    print(f"   SIGTERM -> exit {stops:.3f} s (median), exit codes {codes}")
    after = contention(threads)
    print(f"\nmachine: {after}")
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s")

    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    settings = {
        "model": args.model,
        "compute": records.compute,
        "threads": args.threads,
        "repeats": args.repeats,
        "poll s": POLL,
    }
    figures = {
        "machine before": before,
        "separate processes, start to exit (s)": {
            name: r3(median(times[name]))
            for name in ("python -c pass", "import torch", "import xattn.service.__main__")
        },
        "in this process, imports done (s)": {
            "load_pipeline": r3(median(records.load)),
            "Pipeline.warm_up": r3(median(records.warm_up)),
        },
        "python -m xattn.service, launch to health SERVING (s)": {
            "launch -> listening": r3(listening),
            "load_pipeline": r3(load),
            "warm-up": r3(warm),
            "the rest": r3(rest),
            "launch -> SERVING": r3(serving),
            f"under {TARGET:g} s": serving < TARGET,
            "each launch": [r3(x.serving) for x in launches],
            "SIGTERM -> exit": r3(stops),
            "exit codes": codes,
        },
        "machine after": after,
    }
    results.write_from(args, "startup", settings, figures)


if __name__ == "__main__":
    main()
