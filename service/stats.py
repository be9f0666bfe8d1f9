"""`--stats-file`: the engine's counters and the process's RSS and threads, as JSON, rewritten
every few seconds (atomically), for tests, soak runs and operators' scripts.

    {"time": 1712.3, "ready": true, "rss_kb": 612340, "threads": 23,
     "counters": {"admitted": 10, "rejected": 2, ..., "in_flight": 0}}
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from xattn.service.engine.engine import Engine

log = logging.getLogger(__name__)


def process_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS (kB) and Threads from /proc/PID/status; {} where there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "Threads"):
            values["rss_kb" if key == "VmRSS" else "threads"] = int(rest.split()[0])
    return values


def snapshot(engine: Engine) -> dict[str, object]:
    return {
        "time": time.time(),
        "pid": os.getpid(),
        "ready": engine.ready,
        **process_status(),
        "counters": asdict(engine.counters()),
        "decoder_crashes": engine.decoders.crashes if engine.decoders is not None else 0,
    }


def write_stats(engine: Engine, path: str) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(snapshot(engine)) + "\n")
    tmp.replace(path)  # readers never see a half-written file


async def stats_loop(engine: Engine, path: str, interval: float) -> None:
    """Rewrite `path` every `interval` s until cancelled (then once more)."""
    try:
        while True:
            try:
                write_stats(engine, path)
            except OSError as e:
                log.warning("cannot write stats to %s: %s", path, e)
            await asyncio.sleep(interval)
    finally:
        try:
            write_stats(engine, path)
        except OSError:
            pass
