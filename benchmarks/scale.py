"""Throughput and latency through HAProxy with 1, 2 and 3 replicas, at a fixed concurrency.

    python -m benchmarks.scale [--replicas 1,2,3] [--streams 8] [--each 3] [--threads 1]
                               [--clip samples/hello.wav] [--json FILE|DIR | --no-json]

For each replica count: that many `xattn.service` processes (tiny.en, one worker, --threads
torch threads each) behind HAProxy with deploy/haproxy/haproxy.cfg (benchmarks/replicas.py),
one untimed call per replica, then `--streams` client threads sending StreamTranscribe calls
back to back over one channel to the proxy (`--each` apiece; greedy where the contract has
beam_size). Prints calls/s, audio seconds per second and p50/p99 latency, and what N
machines would give if each replica had the cores the 1-replica run had (N x its
throughput, its latency): replicas on one host share its cores, so they cannot scale there.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import wave
from pathlib import Path

import grpc

from benchmarks import results
from benchmarks.replicas import Balancer, Replicas
from benchmarks.scale_load import Load, call, percentile
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


def clip_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def measure(count: int, data: bytes, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    """One row: `count` replicas behind the proxy under `args.streams` concurrent streams."""
    started = time.perf_counter()
    with Replicas(count, folder, threads=args.threads) as replicas:
        ready = time.perf_counter() - started
        with Balancer(replicas.ports, folder) as lb:
            for i, address in enumerate(replicas.addresses()):  # one untimed call each
                with grpc.insecure_channel(address) as channel:
                    stub = transcriber_pb2_grpc.TranscriberStub(channel)
                    warm = call(stub, "stream", data, f"warm-{i}", timeout=600)
                assert warm.status == "OK", warm.detail
            total = args.streams * args.each
            load = Load(lb.address, data, args.streams, total, timeout=600, kinds=("stream",))
            t0 = time.perf_counter()
            outcomes = load.start().join(timeout=3600)
            wall = time.perf_counter() - t0
    ok = [o.seconds for o in outcomes if o.status == "OK"]
    failed = len(outcomes) - len(ok)
    return {
        "replicas": count,
        "calls": len(outcomes),
        "failed": failed,
        "wall s": round(wall, 2),
        "calls/s": round(len(ok) / wall, 3),
        "audio s/s": round(len(ok) * args.audio_seconds / wall, 2),
        "p50 s": round(percentile(ok, 50) or 0.0, 3),
        "p99 s": round(percentile(ok, 99) or 0.0, 3),
        "start s": round(ready, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,3", help="replica counts (default 1,2,3)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams (default 8)")
    parser.add_argument("--each", type=int, default=3, help="calls per stream (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads a replica")
    parser.add_argument("--clip", type=Path, default=ROOT / "samples" / "hello.wav")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if Balancer.binary() is None:
        parser.error("haproxy is not installed (apt-get install haproxy)")
    args.audio_seconds = clip_seconds(args.clip)
    data = args.clip.read_bytes()
    counts = [int(n) for n in args.replicas.split(",")]
    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="xattn-scale-") as tmp:
            row = measure(count, data, args, Path(tmp))
        rows.append(row)
        print(
            f"{count} replica(s): {row['calls/s']} calls/s, {row['audio s/s']} audio s/s, "
            f"p50 {row['p50 s']} s, p99 {row['p99 s']} s, {row['failed']} failed",
            flush=True,
        )
    one = next((r for r in rows if r["replicas"] == 1), None)
    projected = []
    if one is not None:
        for count in counts:
            projected.append(
                {
                    "machines": count,
                    "calls/s": round(float(one["calls/s"]) * count, 3),  # type: ignore[arg-type]
                    "p50 s": one["p50 s"],
                    "p99 s": one["p99 s"],
                }
            )
            rate = projected[-1]["calls/s"]
            print(f"{count} machine(s), one replica each (projected): {rate} calls/s")
    settings = {
        "clip": args.clip.name,
        "clip seconds": round(args.audio_seconds, 2),
        "streams": args.streams,
        "calls per stream": args.each,
        "torch threads a replica": args.threads,
        "workers a replica": 1,
        "cores": os.cpu_count(),
        "balancer": "HAProxy, deploy/haproxy/haproxy.cfg (leastconn)",
    }
    figures = {
        "Through HAProxy, replicas on this host": rows,
        "One replica a machine (projected from the 1-replica row)": projected,
    }
    results.write_from(args, "scale", settings, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
