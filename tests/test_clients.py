"""clients/: the library, the `xattn` CLI and its renderers against a real server.

One `python -m xattn.service` subprocess (tiny.en, ephemeral port) serves the whole module; the
audio is ../shared/audio/jfk.flac (one 30 s window, 11 s of speech).
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_tool
from rich.console import Console

from xattn.clients.api import Finished, Token, WindowStarted, connect
from xattn.clients.assemble import Assembler, decode_tensor
from xattn.clients.cli import main
from xattn.clients.data import ModelInfo
from xattn.clients.render.png import figure_pixels
from xattn.clients.render.terminal import LiveView
from xattn.clients.writers import FORMATS
from xattn.v1 import transcriber_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
JFK_TEXT = (
    " And so my fellow Americans ask not what your country can do for you"
    " ask what you can do for your country"
)


def start_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m xattn.service` on a free port; returns once GetModelInfo answers."""
    port_file = tmp / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("server wrote no port file within 60 s")
        time.sleep(0.05)
    address = f"127.0.0.1:{int(port_file.read_text())}"
    with connect(address, timeout=30) as client:
        client.info(ready_timeout=300)  # waits while the model loads (minutes on a busy machine)
    return proc, address


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, address = start_server(tmp_path_factory.mktemp("server"))
    try:
        yield address
    finally:
        stop_server(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it (a fresh process)."""
    return subprocess.run(
        [sys.executable, "-m", "xattn.clients.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_json_output(server: str, jfk_path: Path) -> None:
    argv = ["--server", server, "--json", "--words", "--beam-size", "1"]  # greedy: JFK_TEXT
    done = run_cli("transcribe", str(jfk_path), *argv)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout holds the JSON and nothing else
    assert result["text"] == JFK_TEXT
    assert result["language"] == "en"
    words = [w for s in result["segments"] for w in s["words"]]
    assert [w["word"].strip() for w in words] == JFK_TEXT.split()
    tokens = result["tokens"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))  # one window, no discards
    assert tokens[-1]["kind"] == "eot"
    text_tokens = [t for t in tokens if t["kind"] == "text"]
    assert "".join(t["text"] for t in text_tokens) == JFK_TEXT
    assert sum(len(s["tokens"]) for s in result["segments"]) + 1 == len(tokens)
    num_frames = result["windows"][0]["num_frames"]
    assert 540 <= num_frames <= 560  # 11.0 s of audio, 50 frames a second
    for t in tokens:
        assert set(t) >= {"id", "text", "logprob", "window", "peak_frame"}
        assert 0 <= t["peak_frame"] < num_frames and t["logprob"] <= 0 and t["window"] == 0
    # Peaks walk forward through the audio and sit near their word.
    peaks = [t["peak_frame"] for t in text_tokens]
    assert np.mean(np.diff(peaks) >= 0) >= 0.8
    near = [
        w["start"] - 0.6 <= t["peak_time"] <= w["end"] + 0.6
        for t, w in zip(text_tokens, words, strict=True)
    ]
    assert np.mean(near) >= 0.8, near
    assert all(t["start"] == w["start"] for t, w in zip(text_tokens, words, strict=True))


def test_cli_writes_whisper_files_for_several_audio(
    server: str, jfk_path: Path, tmp_path: Path
) -> None:
    """`xattn transcribe A B -o DIR -f all --words`: each file's txt/vtt/srt/tsv/json, named
    as whisper names them; the SRT and VTT read back (srt, webvtt-py) as the words of the
    JSON's segments (cues per segment, timed by its first and last word)."""
    import soundfile as sf
    import srt
    import webvtt

    from benchmarks.synth import speak

    requires_tool("espeak-ng")
    other = tmp_path / "hello.wav"
    sf.write(other, speak("Hello there, this is a second file."), 16000)
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(jfk_path), str(other), "--server", server, "-o", str(out), "--words"]
    console = Console(file=io.StringIO(), width=80)
    assert main(["transcribe", *argv, "--beam-size", "1"], console=console) == 0
    assert f"wrote {out / 'hello.srt'}" in console.file.getvalue()  # type: ignore[attr-defined]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(f"{s}.{f}" for s in ("jfk", "hello") for f in FORMATS)
    lines = (out / "jfk.txt").read_text().splitlines()  # a line per segment
    assert " ".join(lines) == JFK_TEXT.strip() and len(lines) == 2
    assert "hello" in (out / "hello.txt").read_text().lower()
    for stem in ("jfk", "hello"):
        segments = json.loads((out / f"{stem}.json").read_text())["segments"]
        expected = [
            (s["words"][0]["start"], s["words"][-1]["end"], "".join(w["word"] for w in s["words"]))
            for s in segments
            if s["words"]
        ]
        expected = [(round(a, 2), round(b, 2), text.strip()) for a, b, text in expected]
        subs = list(srt.parse((out / f"{stem}.srt").read_text()))
        got = [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs]
        assert [(round(a, 2), round(b, 2), t) for a, b, t in got] == expected
        cues = webvtt.read(str(out / f"{stem}.vtt"))
        assert [c.text for c in cues] == [t for _, _, t in expected]
        tsv = (out / f"{stem}.tsv").read_text().splitlines()
        assert tsv[0] == "start\tend\ttext" and len(tsv) == len(segments) + 1


def test_terminal_view_renders_at_80_columns(server: str, jfk_path: Path) -> None:
    console = Console(
        width=80, height=30, record=True, file=io.StringIO(), color_system="truecolor"
    )
    # Every intermediate state of the live view, event by event, then the final one.
    with connect(server) as client:
        info = client.info()
        view = LiveView(info, [0], jfk_path.name, jfk_path.stat().st_size)
        console.print(view)  # before the first event: upload / encoder progress
        for event in client.stream_transcribe(jfk_path, words=True):
            view.update(event)
            console.print(view)
            if isinstance(event, WindowStarted):
                assert event.num_frames > 0
    text = console.export_text()
    assert "uploading" in text and "encoder running" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    final = Console(width=80, record=True, file=io.StringIO())
    argv = ["transcribe", str(jfk_path), "--server", server, "--words", "--beam-size", "1"]
    assert main(argv, console=final) == 0
    out = final.export_text()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "time (s)" in out and "Americans" in out and "country" in out
    assert "window 0" in out and "27 tokens" in out
    assert "10.22  10.50  country" in out  # the words with their times


def test_png_has_the_expected_size(
    server: str, jfk_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "jfk.png"
    argv = ["transcribe", str(jfk_path), "--server", server, "--json", "--words", "--png", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert f"wrote {out}" in captured.err.replace("\n", "")
    assert out.stat().st_size > 10_000
    assert png_size(out) == figure_pixels(len(result["tokens"]))
    import matplotlib.image

    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == figure_pixels(len(result["tokens"]))[::-1]
    assert pixels[..., :3].std() > 0.05  # a picture, not a blank


def test_api_rows_all_heads_match_the_mean(server: str, jfk_path: Path) -> None:
    with connect(server) as client:
        info = client.info()
        mean = client.transcribe(jfk_path.read_bytes(), alignment="mean")
        every = client.transcribe(str(jfk_path), alignment="all", dtype="float32")
    heads = info.n_text_layer * info.n_text_head
    m_mean, m_all = mean.windows[0].matrix(), every.windows[0].matrix()
    assert m_mean.shape == (len(mean.tokens), 1, 1500)
    assert m_all.shape == (len(every.tokens), heads, 1500)
    assert np.allclose(m_all.sum(axis=-1), 1.0, atol=1e-3)  # softmax rows
    picked = [la * info.n_text_head + h for la, h in info.alignment_heads]
    assert np.allclose(m_all[:, picked].mean(axis=1), m_mean[:, 0], atol=2e-3)
    assert [t.peak_frame for t in every.tokens] == [t.peak_frame for t in mean.tokens]


def test_assembler_drops_a_discarded_attempt() -> None:
    info = ModelInfo("test", 1, 2, 8, 448, 1500, 8, 1, 2, 80, 100, ((0, 1),), ("en",), False)
    asm = Assembler(info, [(0, 0), (0, 1)])

    def token(
        index: int, peak: int, dtype: int = pb.DATA_TYPE_FLOAT16
    ) -> pb.StreamTranscribeResponse:
        row = np.zeros((2, 1500), np.float32)
        row[1, peak] = 1.0
        np_dtype = "<f2" if dtype == pb.DATA_TYPE_FLOAT16 else "<f4"
        tensor = pb.Tensor(shape=[2, 1500], data_type=dtype, data=row.astype(np_dtype).tobytes())
        return pb.StreamTranscribeResponse(
            token=pb.Token(
                index=index, id=7, text="x", window=0, kind=pb.TOKEN_KIND_TEXT, alignment=tensor
            )
        )

    msgs = [
        pb.StreamTranscribeResponse(window_start=pb.WindowStart(window=0, num_frames=100)),
        token(0, 5),
        token(1, 6),
        pb.StreamTranscribeResponse(
            window_discarded=pb.WindowDiscarded(window=0, reason="avg_logprob")
        ),
        token(2, 40, pb.DATA_TYPE_FLOAT32),
        pb.StreamTranscribeResponse(done=pb.Done(transcript=pb.Transcript(text="x"))),
    ]
    events = [e for m in msgs for e in asm.feed(m)]
    assert isinstance(events[-1], Finished)
    result = events[-1].result
    assert [t.index for t in result.tokens] == [2]
    assert result.windows[0].matrix().shape == (1, 2, 1500) and result.windows[0].discarded == 1
    assert result.tokens[0].peak_frame == 40 and result.tokens[0].peak_time == 0.8
    assert isinstance(events[1], Token) and events[1].row is not None
    bad = pb.Tensor(shape=[2, 1500], data_type=pb.DATA_TYPE_FLOAT16, data=b"\0" * 10)
    with pytest.raises(ValueError, match="bytes"):
        decode_tensor(bad)


def test_exit_codes(
    server: str, jfk_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    done = run_cli("transcribe", str(jfk_path), "--server", nowhere, "--timeout", "1")
    assert done.returncode == 3 and done.stdout == ""
    assert f"cannot reach server at {nowhere}: is `xattn-server` running?" in done.stderr

    def err(*argv: str) -> tuple[int, str]:
        code = main(["transcribe", *argv])
        return code, " ".join(capsys.readouterr().err.split())

    empty, noise = tmp_path / "empty.wav", tmp_path / "noise.wav"
    empty.write_bytes(b"")
    noise.write_bytes(b"this is not audio" * 100)
    code, message = err(str(tmp_path / "missing.flac"), "--server", server)
    assert code == 2 and "bad audio file: no such file" in message
    code, message = err(str(tmp_path), "--server", server)
    assert code == 2 and "not a file" in message
    code, message = err(str(empty), "--server", server)
    assert code == 2 and "empty" in message
    code, message = err(str(jfk_path), "--server", server, "--language", "xx")
    assert code == 4 and "server error INVALID_ARGUMENT: unknown language 'xx'" in message
    code, message = err(str(noise), "--server", server)
    assert code == 4 and "INVALID_ARGUMENT" in message and "decode" in message
