"""SIGTERM with streams in flight, against a real server process.

- health turns NOT_SERVING at once (an open Watch sees it);
- in-flight streams (running and queued) finish within the grace period, complete;
- new calls are refused with UNAVAILABLE; the process exits 0;
- a second SIGTERM, or the grace period running out, cancels the rest at once, cleanly
  (exit 0, every run counted cancelled, none failed).

Streams are kept in flight by clients that read slowly (the server's worker waits for them
once its buffer of 256 events is full), so the tests do not depend on how fast the machine
decodes: the clip (multilingual.mp3 six times, 6 minutes) has far more tokens than that.
"""

from __future__ import annotations

import io
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import soundfile
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_reliability import JFK_TEXT, ServerProcess, final_counters

from xattn.model.audio.features import decode_audio
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
GREEDY = pb.TranscriptionOptions(beam_size=1)  # the token counts below are greedy's


def long_clip(path: Path, times: int = 6) -> bytes:
    """`path` repeated `times` times, as 16 kHz WAV bytes."""
    out = io.BytesIO()
    soundfile.write(out, np.tile(decode_audio(path), times), 16000, format="WAV")
    return out.getvalue()


class SlowReader(threading.Thread):
    """Reads one StreamTranscribe, `pause` s per event; records what it saw and how it ended."""

    def __init__(
        self,
        stub: transcriber_pb2_grpc.TranscriberStub,
        audio: bytes,
        pause: float,
        alignment: pb.AlignmentOptions | None = None,
    ) -> None:
        super().__init__(daemon=True)
        request = pb.StreamTranscribeRequest(
            audio=pb.Audio(encoded=audio), alignment=alignment, options=GREEDY
        )
        self.call = stub.StreamTranscribe(request, timeout=120)
        self.pause, self.kinds, self.text = pause, [], ""
        self.code: grpc.StatusCode | None = None
        self.first = threading.Event()
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            for response in self.call:
                self.kinds.append(response.WhichOneof("event"))
                if response.HasField("done"):
                    self.text = response.done.transcript.text
                self.first.set()
                time.sleep(self.pause)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code = e.code()
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def watch_health(channel: grpc.Channel) -> tuple[grpc.Future, list[tuple[float, int]]]:
    """An open Health.Watch and the (time, status) pairs it receives, in a thread."""
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)
    seen: list[tuple[float, int]] = []

    def read() -> None:
        try:
            for reply in call:
                seen.append((time.monotonic(), reply.status))
        except grpc.RpcError:
            pass

    threading.Thread(target=read, daemon=True).start()
    return call, seen


def wait_for(predicate, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_sigterm_drains_in_flight_and_refuses_new(tmp_path: Path, jfk_path: Path) -> None:
    audio = jfk_path.read_bytes()
    flags = ("--workers", "2", "--max-queue", "2", "--grace", "60")
    with ServerProcess(tmp_path, *flags) as server:
        channel = grpc.insecure_channel(server.address)
        stub = transcriber_pb2_grpc.TranscriberStub(channel)
        watch, seen = watch_health(channel)
        assert wait_for(lambda: len(seen) >= 1, 10)
        readers = [SlowReader(stub, audio, pause=0.15) for _ in range(3)]  # 2 run, 1 queued
        for r in readers:
            r.start()
        assert readers[0].first.wait(60) and readers[1].first.wait(60)
        # the third is admitted before the signal, not merely sent: else it is refused (rightly)
        assert wait_for(lambda: server.counters()["admitted"] == 3, 60), server.counters()
        server.signal(signal.SIGTERM)
        assert wait_for(lambda: seen[-1][1] == NOT_SERVING, 30), seen
        watch.cancel()  # an open Watch is an in-flight RPC too
        for refused in (
            stub,
            transcriber_pb2_grpc.TranscriberStub(grpc.insecure_channel(server.address)),
        ):
            try:
                refused.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
                raise AssertionError("a new call was accepted during the drain")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        for r in readers:
            r.join(90)
            assert r.code == grpc.StatusCode.OK and r.text == JFK_TEXT
            assert r.kinds.count("token") == 27 and r.kinds[-1] == "done"
        assert server.proc.wait(60) == 0, server.output()
        channel.close()
        final = final_counters(server.output())
        assert final["finished"] >= 3 and final["in_flight"] == 0 and final["failed"] == 0
        assert "stopped" in server.output()


def slow_streams(
    tmp_path: Path, audio: bytes, grace: float, second_signal: bool
) -> tuple[ServerProcess, list[SlowReader], float]:
    server = ServerProcess(tmp_path, "--workers", "2", "--max-queue", "2", "--grace", str(grace))
    stub = transcriber_pb2_grpc.TranscriberStub(grpc.insecure_channel(server.address))
    # every head as float32: 144 KB a token, so flow control holds the server mid-stream
    heavy = pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_ALL_HEADS, data_type=pb.DATA_TYPE_FLOAT32)
    readers = [SlowReader(stub, audio, pause=1.0, alignment=heavy) for _ in range(2)]
    for r in readers:
        r.start()
    for r in readers:
        assert r.first.wait(60)
    server.signal(signal.SIGTERM)
    if second_signal:  # once the first is handled (two signals pending at once are one)
        assert wait_for(lambda: "draining in-flight RPCs" in server.output(), 30), server.output()
        server.signal(signal.SIGTERM)
    return server, readers, time.monotonic()


def check_cancelled_cleanly(
    server: ServerProcess, readers: list[SlowReader], t0: float, within: float
) -> None:
    try:
        assert server.proc.wait(within + 30) == 0, server.output()
        assert time.monotonic() - t0 < within + 5.0
        for r in readers:  # the client sees the end once it has read what was sent before
            r.pause = 0.0
            r.join(30)
            assert r.code is not None and r.code != grpc.StatusCode.OK  # cut, not finished
        final = final_counters(server.output())
        assert final["in_flight"] == 0 and final["failed"] == 0
        assert final["cancelled"] == 2 and final["finished"] == 0
        output = server.output()
        assert "stopped" in output and "Traceback" not in output
    finally:
        server.close()


def test_second_sigterm_cancels_at_once(tmp_path: Path, multilingual_path: Path) -> None:
    audio = long_clip(multilingual_path)
    server, readers, t0 = slow_streams(tmp_path, audio, 60, second_signal=True)
    check_cancelled_cleanly(server, readers, t0, within=5.0)
    assert "cancelling in-flight RPCs" in server.output()


def test_grace_running_out_cancels_the_rest(tmp_path: Path, multilingual_path: Path) -> None:
    audio = long_clip(multilingual_path)
    server, readers, t0 = slow_streams(tmp_path, audio, 2, second_signal=False)
    check_cancelled_cleanly(server, readers, t0, within=2.0 + 5.0)
