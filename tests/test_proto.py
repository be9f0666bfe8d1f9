"""The contract: stubs in sync with the protos, public names, and buf lint when available."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import requires_tool

from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def test_generated_stubs_are_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen_proto.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_service_names_and_shapes() -> None:
    service = pb.DESCRIPTOR.services_by_name["Transcriber"]
    assert service.full_name == "xattn.v1.Transcriber"
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"GetModelInfo", "Transcribe", "StreamTranscribe", "StreamingRecognize"}
    for name, method in methods.items():  # each RPC has its own request and response
        assert method.input_type.name == f"{name}Request"
        assert method.output_type.name == f"{name}Response"
    assert methods["StreamTranscribe"].server_streaming
    assert not methods["Transcribe"].server_streaming and not methods["Transcribe"].client_streaming
    live = methods["StreamingRecognize"]
    assert live.client_streaming and live.server_streaming
    assert hasattr(transcriber_pb2_grpc, "TranscriberStub")


def test_stream_events_and_options() -> None:
    event = pb.StreamTranscribeResponse.DESCRIPTOR.oneofs_by_name["event"]
    assert [f.name for f in event.fields] == [
        "window_start",
        "token",
        "window_discarded",
        "segment",
        "done",
    ]
    audio = pb.Audio.DESCRIPTOR.oneofs_by_name["source"]
    assert [f.name for f in audio.fields] == ["encoded", "pcm"]
    options = pb.TranscriptionOptions()
    assert not options.HasField("condition_on_previous_text")  # optional: on unless set off
    options.condition_on_previous_text = False
    assert options.HasField("condition_on_previous_text")
    assert pb.AlignmentMode.Name(0) == "ALIGNMENT_MODE_UNSPECIFIED"
    assert pb.DataType.Value("DATA_TYPE_FLOAT16") == 1


def test_buf_lint() -> None:
    buf = requires_tool("buf")
    done = subprocess.run(
        [buf, "lint", "proto"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
