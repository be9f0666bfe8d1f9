"""The hostile-client probe as a benchmark: a steady valid client on each face (gRPC, HTTP,
Realtime, Wyoming; the HTTP one also transcribes samples/hello.wav) beside N hostile
connections of each kind of tests/hostile.py, against a server process run with its default
deadlines. Records, per recipe, the hostile connections still open after `--hold` seconds
and how long the closed ones took; the valid requests that failed; the server's log lines at
ERROR and WARNING and its tracebacks.

    python -m benchmarks.hostile                      # this checkout's server
    python -m benchmarks.hostile --before-python /work/main/.venv/bin/python \\
        --before-cwd /work/main                       # main's first (the before), then this

Results: benchmarks/results/hostile/<UTC time>.json, a row per server.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import hostile  # noqa: E402

from benchmarks import results  # noqa: E402

HELLO = ROOT / "samples" / "hello.wav"
LEVEL = re.compile(r"^\S+ \S+ (ERROR|WARNING|CRITICAL) ")
GRPC_CORE_ERROR = re.compile(r"^E\d{4} ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((hostile.HOST, 0))
        return int(s.getsockname()[1])


def start_server(python: str, cwd: Path, folder: Path, log: Path) -> tuple[subprocess.Popen, dict]:
    files = {name: folder / name for name in ("grpc", "http")}
    wyoming = free_port()
    command = [python, "-m", "xattn.service", "--port", "0", "--http-port", "0",
               "--port-file", str(files["grpc"]), "--http-port-file", str(files["http"]),
               "--wyoming-port", str(wyoming)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not all(p.is_file() and p.read_text().strip() for p in files.values()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    ports = {name: int(p.read_text()) for name, p in files.items()}
    while "serving " not in log.read_text():  # the model is loaded and warmed up
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not load: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, {"http": ports["http"], "realtime": ports["http"], "grpc": ports["grpc"],
                  "wyoming": wyoming}  # fmt: skip


async def transcribe(port: int, audio: bytes) -> str:
    """One transcription of `audio`: "ok", or what went wrong (the status line, an error)."""
    boundary = "xattnbench"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\ntiny.en\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    try:
        reader, writer = await asyncio.open_connection(hostile.HOST, port)
        writer.write(
            f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data = await asyncio.wait_for(reader.read(), 120)
        writer.close()
    except (OSError, TimeoutError) as e:
        return type(e).__name__
    if data.startswith(b"HTTP/1.1 200") and b'"text"' in data:
        return "ok"
    status = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")[9:] or "no answer"
    message = re.search(rb'"message": ?"([^"]{0,80})', data)
    return f"{status}: {message.group(1).decode()}" if message else status


async def steady(face: str, port: int, until: float, tally: Counter) -> None:
    """One valid request after another on `face` until `until` (monotonic)."""
    audio = HELLO.read_bytes()
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            if face == "http" and n % 5 == 0:
                outcome = await transcribe(port, audio)
                tally["transcription ok" if outcome == "ok" else "transcription failed"] += 1
                if outcome != "ok":
                    tally[f"(transcription failed: {outcome})"] += 1
                continue
            ok = await asyncio.wait_for(hostile.VALID[face](port), 60)
        except Exception:
            ok = False
        tally[f"{face} ok" if ok else f"{face} failed"] += 1
        await asyncio.sleep(0.2)


async def probe(ports: dict, n: int, hold: float) -> tuple[list[dict], Counter]:
    tally: Counter = Counter()
    until = time.monotonic() + hold + 5
    valid = [asyncio.ensure_future(steady(f, p, until, tally)) for f, p in ports.items()]
    jobs: dict[tuple[str, str], list] = {}
    for face, recipes in hostile.RECIPES.items():
        for name, recipe in recipes.items():
            jobs[face, name] = [
                asyncio.ensure_future(recipe(hostile.HOST, ports[face], hold)) for _ in range(n)
            ]
    rows = []
    for (face, name), tasks in jobs.items():
        done = await asyncio.gather(*tasks, return_exceptions=True)
        seen = [d for d in done if isinstance(d, hostile.Seen)]
        closed = [s.seconds for s in seen if s.closed]
        rows.append({
            "face": face, "recipe": name, "connections": n,
            f"still open after {hold:g} s": len(seen) - len(closed),
            "client errors": len(done) - len(seen),
            "median seconds to close": round(statistics.median(closed), 2) if closed else None,
        })  # fmt: skip
    await asyncio.gather(*valid)
    return rows, tally


def log_counts(text: str) -> dict[str, int]:
    lines = text.splitlines()
    return {
        "ERROR lines": sum(1 for x in lines if LEVEL.match(x) and "ERROR" in x.split()[2])
        + sum(1 for x in lines if GRPC_CORE_ERROR.match(x)),
        "WARNING lines": sum(1 for x in lines if LEVEL.match(x) and x.split()[2] == "WARNING"),
        "tracebacks": sum(1 for x in lines if x.startswith("Traceback")),
    }


def run_one(python: str, cwd: Path, n: int, hold: float) -> tuple[list[dict], Counter, str]:
    """One server's run: the rows per recipe, the valid requests' tally, its log."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        log = folder / "server.log"
        proc, ports = start_server(python, cwd, folder, log)
        try:
            rows, tally = asyncio.run(probe(ports, n, hold))
        finally:
            proc.terminate()
            proc.wait(60)
        return rows, tally, log.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-python", help="first run a server of this interpreter ...")
    parser.add_argument("--before-cwd", type=Path, help="... in this checkout (the before)")
    parser.add_argument("--before-label", default="main")
    parser.add_argument("--label", default="this branch")
    parser.add_argument("-n", type=int, default=20, help="hostile connections of each kind")
    parser.add_argument("--hold", type=float, default=90.0, help="seconds a hostile one waits")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    servers = [(args.label, sys.executable, ROOT)]
    if args.before_python:
        servers.insert(0, (args.before_label, args.before_python, args.before_cwd or ROOT))
    still = f"still open after {args.hold:g} s"
    summary, per_recipe, valid, logs = [], [], [], {}
    for label, python, cwd in servers:
        rows, tally, text = run_one(python, cwd, args.n, args.hold)
        counts = log_counts(text)
        summary.append({
            "server": label,
            f"hostile {still}": sum(r[still] for r in rows),
            "hostile connections": len(rows) * args.n,
            "valid requests failed": sum(v for k, v in tally.items() if k.endswith("failed")),
            "valid requests": sum(v for k, v in tally.items() if k.endswith(("ok", "failed"))),
            **counts,
        })  # fmt: skip
        per_recipe += [{"server": label, **r} for r in rows]
        valid.append({"server": label, **dict(sorted(tally.items()))})
        logs[label] = [x for x in text.splitlines() if LEVEL.match(x)][:20]
        print(summary[-1])
    for r in per_recipe:
        print(r)
    figures = {
        "summary": summary,
        "hostile connections by recipe": per_recipe,
        "valid requests beside them": valid,
    }
    settings = {
        "servers": {
            label: f"{python} -m xattn.service (cwd {cwd})" for label, python, cwd in servers
        },
        "deadlines": "each server's defaults",
        "connections per recipe": args.n,
        "hold seconds": args.hold,
        "note": "shared 2-core machine with other helpers' runs: times are loaded",
        "_first log lines at WARNING or above": logs,
    }
    results.write_from(args, "hostile", settings, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
