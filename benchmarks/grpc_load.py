"""The load clients of benchmarks.service: StreamTranscribe requests sent back to back by C
threads, in a process of their own (`main`) so that they share neither the server's GIL nor
its memory; this module imports gRPC and the stubs only, not torch."""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np

from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc


def streamed(
    stub: transcriber_pb2_grpc.TranscriberStub,
    data: bytes,
    options: pb.TranscriptionOptions | None = None,
    first_text: bool = False,
) -> tuple[float, float]:
    """(seconds to done, seconds to the first token: with `first_text`, the first text token,
    as an HTTP stream's first delta; 0.0 when none came) of one StreamTranscribe, with
    float16 rows of the mean alignment head."""
    request = pb.StreamTranscribeRequest(
        audio=pb.Audio(encoded=data),
        options=options,
        alignment=pb.AlignmentOptions(
            mode=pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS, data_type=pb.DATA_TYPE_FLOAT16
        ),
    )
    t0 = time.perf_counter()
    first = None
    for response in stub.StreamTranscribe(request, timeout=600):
        if first is None and response.WhichOneof("event") == "token":
            if not first_text or response.token.kind == pb.TOKEN_KIND_TEXT:
                first = time.perf_counter() - t0
    return time.perf_counter() - t0, first or 0.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def load(address: str, data: bytes, streams: int, each: int) -> dict:
    """`streams` client threads, each sending `each` requests back to back over one channel:
    wall time, requests/s, p50/p99 latency to done and p50 time to the first token."""
    with grpc.insecure_channel(address) as channel:
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        streamed(stub, data)  # the channel's first call, not timed

        def client(_: int) -> list[tuple[float, float]]:
            return [streamed(stub, data) for _ in range(each)]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(streams) as pool:
            runs = [r for rs in pool.map(client, range(streams)) for r in rs]
        wall = time.perf_counter() - t0
    latencies = [total for total, _ in runs]
    return {
        "streams": streams,
        "requests": len(runs),
        "wall": wall,
        "rps": len(runs) / wall,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "ttft": percentile([first for _, first in runs], 50),
    }


def main(argv: list[str] | None = None) -> None:
    """`python -m benchmarks.grpc_load ADDRESS CLIP STREAMS EACH`: one level, as JSON."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("address")
    parser.add_argument("clip", type=Path)
    parser.add_argument("streams", type=int)
    parser.add_argument("each", type=int)
    args = parser.parse_args(argv)
    row = load(args.address, args.clip.read_bytes(), args.streams, args.each)
    sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
