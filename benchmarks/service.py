"""What gRPC costs: the same clip in-process vs StreamTranscribe, then load at 1/4/8/16 streams.

    python -m benchmarks.service [--clip ../shared/audio/jfk.flac] [--workers 1] [--compute auto]

1. Overhead: the median wall time of `pipeline.transcribe` (file bytes decoded, every
   token's attention computed) against a StreamTranscribe of the same bytes through a real
   server and channel with float16 rows of the mean alignment head (target ratio < 1.1);
   the in-process side runs in a process of its own (benchmarks.workers), and the server
   loads its model itself (one OpenMP team per thread that calls torch: see
   xattn.service.engine.engine.in_passing_thread).
2. Load: C client threads, in a process of their own (benchmarks.grpc_load), each send
   StreamTranscribe requests back to back; throughput (requests/s, audio seconds per second,
   and its share of the encoder-bound limit: one request per encoder pass, the encoder's
   median time measured here, for a clip of one window), p50/p99 latency to `done`, p50 time
   to the first token, and the server's RSS (it runs in this process, without the clients)
   after each level and at its peak.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import torch

from benchmarks import results
from benchmarks.grpc_load import streamed
from benchmarks.workers import Workers
from xattn.model.audio.features import N_FRAMES, decode_audio, log_mel_spectrogram, pad_or_trim
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.engine.convert import SERVICE_BEAM_SIZE, SERVICE_BEST_OF
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CLIP = ROOT.parent / "shared" / "audio" / "jfk.flac"


def in_process_cases(
    model: str, compute: str, data: bytes, precision: str | None = None
) -> dict[str, Callable[[], str]]:
    """The in-process side, in a process of its own (benchmarks.workers): a transcription as
    the server runs it, and one encoder pass (at `precision`; None: the compute's). Beside
    the server in one process, the two threads' OpenMP teams made both sides ~30 % slower
    (xattn.service.engine.engine)."""
    pipe = load_pipeline(model, compute=compute)
    pipe.warm_up()
    mel = pad_or_trim(log_mel_spectrogram(decode_audio(data), pipe.dims.n_mels), N_FRAMES)

    def encoder() -> str:
        with torch.inference_mode():
            pipe.model.encoder(mel[None].to(pipe.model.device), precision)
        return ""

    return {"in-process": partial(in_process, pipe, data), "encoder": encoder}


def in_process(pipe: Pipeline, data: bytes) -> str:
    audio = decode_audio(data)
    # the search the server runs for a request that leaves it unset (beam 5, best-of 5)
    options = DecodeOptions(
        return_attention=True, beam_size=SERVICE_BEAM_SIZE, best_of=SERVICE_BEST_OF
    )
    for _ in pipe.transcribe(audio, options):
        pass
    return ""


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """A process's (default: this one, the server's) resident memory now and at its peak
    (since it started, or since `reset_peak`), MB."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def cpu_seconds(pid: int | str = "self") -> float:
    """A process's CPU seconds so far, user and system, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def reset_peak(pid: int | str = "self") -> bool:
    """Start a process's peak RSS afresh from its RSS now (Linux: clear_refs 5); False where
    that is not allowed."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def load_elsewhere(address: str, clip: Path, streams: int, each: int) -> dict:
    """One load level from a client process of its own (benchmarks.grpc_load)."""
    args = [str(clip), str(streams), str(each)]
    command = [sys.executable, "-m", "benchmarks.grpc_load", address, *args]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--workers", type=int, default=0, help="the server's --workers (0: auto)")
    parser.add_argument("--compute", default="auto", help="the server's --compute (auto)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side for the ratio")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=2, help="requests per stream per level")
    results.add_arguments(parser)
    args = parser.parse_args(argv)

    data = args.clip.read_bytes()
    with ThreadPoolExecutor(1) as passing:  # its torch (resampling) off this thread: it ends
        seconds = len(passing.submit(decode_audio, data).result()) / 16000
    config = ServerConfig(
        port=0,
        model=args.model,
        workers=args.workers,
        max_queue=max(args.levels) * 2,
        compute=args.compute,
    )
    builders = {"ours": ("benchmarks.service:in_process_cases", (args.model, args.compute, data))}
    with (
        Workers(builders, torch.get_num_threads()) as local_side,
        BackgroundServer(config) as server,  # loads the model on a thread that then ends
        grpc.insecure_channel(server.address) as ch,
    ):
        pipe = server.engine.pipeline
        stub = transcriber_pb2_grpc.TranscriberStub(ch)
        streamed(stub, data)  # the channel's first call
        local_side.warm_up()
        encoder = statistics.median(local_side.run("encoder")[0] for _ in range(5))
        local, remote = [], []
        for _ in range(args.repeats):  # interleaved, so drift hits both sides alike
            local.append(local_side.run("in-process")[0])
            remote.append(streamed(stub, data)[0])
        rows = []
        for level in args.levels:  # the clients in their own process, the RSS the server's
            row = load_elsewhere(server.address, args.clip, level, args.requests)
            rows.append({**row, "rss": rss_mb()})
        counters = server.engine.counters()

    base, grpc_s = statistics.median(local), statistics.median(remote)
    print(
        f"clip {args.clip.name}: {seconds:.1f} s of audio, model {pipe.name}, "
        f"({pipe.compute}), {args.workers} workers, {args.repeats} runs each"
    )
    print(f"{'path':<28}{'median s':>10}{'min s':>8}")
    print(f"{'in-process transcribe':<28}{base:>10.3f}{min(local):>8.3f}")
    print(f"{'gRPC StreamTranscribe f16':<28}{grpc_s:>10.3f}{min(remote):>8.3f}")
    print(f"overhead ratio (median): {grpc_s / base:.3f}  (target < 1.1)")
    print()
    windows = max(1, -(-int(seconds) // 30))
    limit = 1 / (encoder * windows)
    print(
        f"encoder {encoder * 1e3:.0f} ms per window, {windows} window(s) per request: "
        f"encoder-bound limit {limit:.2f} req/s"
    )
    header = ("streams", "requests", "wall s", "req/s", "of limit", "audio s/s", "p50 s")
    header += ("p99 s", "ttft s", "RSS MB", "peak MB")
    print("".join(f"{h:>10}" for h in header))
    for r in rows:
        print(
            f"{r['streams']:>10}{r['requests']:>10}{r['wall']:>10.2f}{r['rps']:>10.2f}"
            f"{r['rps'] / limit:>10.0%}{r['rps'] * seconds:>10.1f}{r['p50']:>10.2f}"
            f"{r['p99']:>10.2f}{r['ttft']:>10.2f}{r['rss'][0]:>10.0f}{r['rss'][1]:>10.0f}"
        )
    print(f"engine: {counters}")
    settings = {
        "model": pipe.name,
        "compute": pipe.compute,
        "clip": args.clip.name,
        "audio seconds": round(seconds, 1),
        "workers": args.workers,
        "repeats": args.repeats,
        "requests per stream": args.requests,
    }
    figures = {
        "gRPC overhead (median of the runs)": {
            "in-process transcribe s": round(base, 3),
            "gRPC StreamTranscribe f16 s": round(grpc_s, 3),
            "ratio": round(grpc_s / base, 3),
        },
        "encoder-bound limit": {
            "encoder ms per window": round(encoder * 1e3),
            "windows per request": windows,
            "req/s": round(limit, 2),
        },
        "load": [
            {
                "streams": r["streams"],
                "requests": r["requests"],
                "req/s": round(r["rps"], 2),
                "of limit": f"{r['rps'] / limit:.0%}",
                "audio s/s": round(r["rps"] * seconds, 1),
                "p50 s": round(r["p50"], 2),
                "p99 s": round(r["p99"], 2),
                "ttft s": round(r["ttft"], 2),
                "RSS MB": round(r["rss"][0]),
                "peak MB": round(r["rss"][1]),
            }
            for r in rows
        ],
    }
    results.write_from(args, "service", settings, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
