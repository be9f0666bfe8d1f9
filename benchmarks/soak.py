"""Soak test: mixed traffic against an xattn server for a while; throughput, errors by status,
latency percentiles and the server's RSS over time (and its growth after warm-up).

    python benchmarks/soak.py --seconds 1800 --concurrency 2 --report /tmp/soak.txt
    python benchmarks/soak.py --server 127.0.0.1:50051 --pid 1234   # a running server

Without --server it starts `python -m xattn.service` itself (tiny.en, --workers/--max-queue as
given, OMP_NUM_THREADS=--threads) and stops it with SIGTERM at the end (its exit code is
reported). The traffic, chosen at random by each of --concurrency client threads: streams
and unary calls of good audio, undecodable and too-long files, bad options, cancels after
the first token, and short deadlines.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import results  # noqa: E402
from xattn.v1 import transcriber_pb2 as pb  # noqa: E402
from xattn.v1 import transcriber_pb2_grpc  # noqa: E402

Stub = transcriber_pb2_grpc.TranscriberStub


def rss_threads(pid: int) -> tuple[int, int]:
    """(VmRSS kB, Threads) of `pid`; (0, 0) when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"].split()[0])


def wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def make_traffic(audio_dir: Path) -> dict[str, tuple[float, Callable[[Stub, random.Random], str]]]:
    """Each kind of request: (weight, run(stub, rng) -> status name)."""
    jfk = (audio_dir / "jfk.flac").read_bytes()
    noise = np.random.default_rng(0).normal(0, 0.05, 16000 * 2).astype(np.float32)
    short = wav(noise)
    flac = io.BytesIO()
    sf.write(flac, np.zeros(16000, np.int16), 16000, format="FLAC")
    long_flac = bytearray(flac.getvalue())  # STREAMINFO declares ~2.5 days of audio
    long_flac[8 + 13] |= 0x0F
    long_flac[8 + 14 : 8 + 18] = b"\xff\xff\xff\xff"
    greedy = pb.TranscriptionOptions(temperatures=[0.0])

    def stream(audio: bytes, **fields: object) -> Callable[[Stub, random.Random], str]:
        def run(stub: Stub, rng: random.Random) -> str:
            request = pb.StreamTranscribeRequest(audio=pb.Audio(encoded=audio), **fields)
            events = list(stub.StreamTranscribe(request, timeout=120))
            assert events[-1].HasField("done"), "no done"
            return "OK"

        return run

    def unary(stub: Stub, rng: random.Random) -> str:
        stub.Transcribe(pb.TranscribeRequest(audio=pb.Audio(encoded=short), options=greedy))
        return "OK"

    def garbage(stub: Stub, rng: random.Random) -> str:
        data = bytearray(jfk[: rng.randint(1, 4096)])
        for _ in range(rng.randint(0, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        stub.Transcribe(pb.TranscribeRequest(audio=pb.Audio(encoded=bytes(data))), timeout=30)
        return "OK"

    def cancel_after_first_token(stub: Stub, rng: random.Random) -> str:
        call = stub.StreamTranscribe(pb.StreamTranscribeRequest(audio=pb.Audio(encoded=jfk)))
        for response in call:
            if response.HasField("token"):
                break
        call.cancel()
        return "CANCELLED"

    def short_deadline(stub: Stub, rng: random.Random) -> str:
        request = pb.StreamTranscribeRequest(audio=pb.Audio(encoded=jfk))
        list(stub.StreamTranscribe(request, timeout=rng.uniform(0.05, 1.0)))
        return "OK"

    bad_head = pb.AlignmentOptions(heads=[pb.AttentionHead(layer=99, head=0)])
    return {
        "stream_jfk": (25, stream(jfk)),
        "stream_jfk_words": (5, stream(jfk, options=pb.TranscriptionOptions(word_timestamps=True))),
        "unary_short": (20, unary),
        "bad_file": (15, garbage),
        "too_long": (5, stream(bytes(long_flac))),
        "bad_language": (5, stream(short, options=pb.TranscriptionOptions(language="xx"))),
        "bad_head": (5, stream(short, alignment=bad_head)),
        "cancel": (10, cancel_after_first_token),
        "deadline": (10, short_deadline),
    }


class Soak:
    def __init__(self, args: argparse.Namespace, address: str, pid: int | None) -> None:
        self.args, self.address, self.pid = args, address, pid
        self.traffic = make_traffic(Path(args.audio))
        self.outcomes: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.samples: list[tuple[float, int, int]] = []  # (seconds, rss kB, threads)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def client(self, seed: int) -> None:
        rng = random.Random(seed)
        names = list(self.traffic)
        weights = [self.traffic[n][0] for n in names]
        with grpc.insecure_channel(self.address) as channel:
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            while not self.stop.is_set():
                name = rng.choices(names, weights)[0]
                t0 = time.perf_counter()
                try:
                    status = self.traffic[name][1](stub, rng)
                except grpc.RpcError as e:
                    status = e.code().name
                except Exception as e:  # a broken stream: count it, keep going
                    status = f"CLIENT_{type(e).__name__}"
                seconds = time.perf_counter() - t0
                with self.lock:
                    self.outcomes[f"{name}:{status}"] += 1
                    if status == "OK":
                        self.latency[name].append(seconds)
                if status == "RESOURCE_EXHAUSTED":
                    time.sleep(0.2)

    def sampler(self, t0: float) -> None:
        while self.pid is not None and not self.stop.is_set():
            rss, threads = rss_threads(self.pid)
            self.samples.append((time.monotonic() - t0, rss, threads))
            self.stop.wait(self.args.sample_every)

    def run(self) -> dict:
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.sampler, args=(t0,), daemon=True)]
        threads += [
            threading.Thread(target=self.client, args=(self.args.seed + i,), daemon=True)
            for i in range(self.args.concurrency)
        ]
        for t in threads:
            t.start()
        try:
            self.stop.wait(self.args.seconds)
        except KeyboardInterrupt:
            pass
        self.stop.set()
        for t in threads:
            t.join(150)
        return self.report(time.monotonic() - t0)

    def report(self, elapsed: float) -> dict:
        by_status: Counter[str] = Counter()
        for key, n in self.outcomes.items():
            by_status[key.split(":", 1)[1]] += n
        total = sum(self.outcomes.values())
        latency = {
            name: {
                "n": len(v),
                **{f"p{q}": round(float(np.percentile(v, q)), 3) for q in (50, 90, 99)},
            }
            for name, v in sorted(self.latency.items())
        }
        report: dict = {
            "seconds": round(elapsed, 1),
            "concurrency": self.args.concurrency,
            "requests": total,
            "throughput_rps": round(total / elapsed, 3),
            "ok_rps": round(by_status["OK"] / elapsed, 3),
            "by_status": dict(by_status.most_common()),
            "by_kind": dict(sorted(self.outcomes.items())),
            "latency_ok_s": latency,
        }
        if self.samples:
            warm = self.args.warmup or max(30.0, 0.1 * self.args.seconds)
            after = [s for s in self.samples if s[0] >= warm] or self.samples[-1:]
            base, tail = after[0][1], [s[1] for s in self.samples[-3:]]
            report["rss_mb"] = {
                "start": round(self.samples[0][1] / 1024, 1),
                "after_warmup": round(base / 1024, 1),
                "max": round(max(s[1] for s in self.samples) / 1024, 1),
                "end": round(self.samples[-1][1] / 1024, 1),
                "growth_after_warmup_pct": round(100 * (np.mean(tail) - base) / base, 2),
            }
            report["threads"] = {"start": self.samples[0][2], "end": self.samples[-1][2]}
            step = max(1, len(self.samples) // 40)
            report["rss_timeline"] = [
                [round(t), round(rss / 1024, 1), n] for t, rss, n in self.samples[::step]
            ]
        return report


def start_server(args: argparse.Namespace, folder: Path) -> tuple[subprocess.Popen, str]:
    port_file = folder / "port"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)]
    command += ["--workers", str(args.workers), "--max-queue", str(args.max_queue)]
    command += ["--log-level", "INFO"]  # its final counters: the "stopped; counters" line
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start: {(folder / 'server.log').read_text()}")
        time.sleep(0.05)
    address = f"127.0.0.1:{int(port_file.read_text())}"
    with grpc.insecure_channel(address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        while True:
            try:
                stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
                return proc, address
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--server", help="HOST:PORT of a running server (default: start one)")
    parser.add_argument("--pid", type=int, help="with --server: its PID, for RSS sampling")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-queue", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    parser.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling, seconds")
    parser.add_argument("--warmup", type=float, default=0.0, help="default: 10%%, >= 30 s")
    parser.add_argument("--audio", default=str(ROOT.parent / "shared" / "audio"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", help="also write the report (JSON) to this file")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xattn-soak-") as tmp:
        proc = None
        if args.server:
            address, pid = args.server, args.pid
        else:
            proc, address = start_server(args, Path(tmp))
            pid = proc.pid
        report = Soak(args, address, pid).run()
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            report["server_exit_code"] = proc.wait(60)
            log = (Path(tmp) / "server.log").read_text()
            final = [line for line in log.splitlines() if "stopped; counters: " in line]
            if final:  # logged as it stopped
                report["server_counters"] = json.loads(final[-1].split("counters: ", 1)[1])
            report["server_log_tracebacks"] = log.count("Traceback")
            errors = [line for line in log.splitlines() if " ERROR " in line or "Error" in line]
            report["server_log_errors"] = errors[:20]  # what an INTERNAL was, if any
    text = "\n".join(f"{key}: {json.dumps(value)}" for key, value in report.items())
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    settings = {
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "server": args.server or "started here",
        "workers": args.workers,
        "max queue": args.max_queue,
        "server threads": args.threads,
        "seed": args.seed,
    }
    results.write_from(args, "soak", settings, soak_figures(report))
    return 0


def soak_figures(report: dict) -> dict[str, object]:
    """The report as results figures: tables for the counts, latencies and memory."""
    totals = ("seconds", "requests", "throughput_rps", "ok_rps")
    server = ("server_exit_code", "server_log_tracebacks", "server_counters")
    figures: dict[str, object] = {
        "traffic": {k.replace("_", " "): report[k] for k in totals},
        "by status": report["by_status"],
        "by kind": report["by_kind"],
        "latency of OK calls (s)": report["latency_ok_s"],
    }
    if "rss_mb" in report:
        figures["server RSS (MB)"] = report["rss_mb"]
        figures["server threads"] = report["threads"]
        figures["RSS timeline [s, MB, threads]"] = report["rss_timeline"]
    figures["server"] = {k.replace("_", " "): report[k] for k in server if k in report}
    figures["server log errors"] = report.get("server_log_errors", [])
    return figures


if __name__ == "__main__":
    sys.exit(main())
