"""Fuzzing: the audio decoder and request handling end in a result or a precise refusal.

- Property-based (hypothesis): real wav/flac/mp3/ogg/opus/m4a seeds (tests/fuzz/corpus) mutated
  (byte flips, truncation, insertions, lying 16/32-bit size fields), WAV and FLAC headers with
  absurd rates, channel counts, sample widths and declared lengths, NaN/Inf float PCM, raw PCM
  with any rate/encoding/channels; every input decodes to valid audio or raises AudioError.
- Decompression bombs: ~100 KB of FLAC declaring (or, with the length erased, decoding to)
  minutes of 8-channel 48 kHz audio is refused after a few MB, never decoded in full.
- Requests with random options (languages, tasks, temperatures, heads, modes, data types) and
  random audio against an in-process server: only OK, INVALID_ARGUMENT or OUT_OF_RANGE.
- Coverage-guided (atheris / libFuzzer, tests/fuzz/fuzz_audio.py) for XATTN_FUZZ_SECONDS.
- tests/fuzz/regressions/ (inputs that once broke something) are replayed every run.

The number of inputs each part tried is printed in pytest's summary ("fuzzing"). A longer run
is one flag away: `make fuzz` (XATTN_FUZZ_EXAMPLES=5000 XATTN_FUZZ_SECONDS=600).
"""

from __future__ import annotations

import io
import math
import os
import re
import struct
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf
from fuzz.fuzz_audio import Decoder, check_output
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xattn.model.audio.features import AudioError, AudioTooLongError, decode_audio, pcm_to_audio
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

FUZZ = Path(__file__).resolve().parent / "fuzz"
SEEDS = {p.name: p.read_bytes() for p in sorted((FUZZ / "corpus").iterdir()) if p.suffix != ".raw"}
EXAMPLES = int(os.environ.get("XATTN_FUZZ_EXAMPLES", "250"))  # per decoder property
REQUESTS = int(os.environ.get("XATTN_FUZZ_REQUESTS", str(max(40, EXAMPLES // 5))))
ATHERIS_SECONDS = float(os.environ.get("XATTN_FUZZ_SECONDS", "20"))
MAX_SECONDS = 30.0
PRECISE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}
DEADLINE = 120.0  # a request still running after this has hung

decoder_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode(data: bytes, tried: Counter, name: str) -> np.ndarray | None:
    """decode_audio with the oracle's checks; None when refused. Counts what happened."""
    try:
        out = decode_audio(data, max_seconds=MAX_SECONDS)
    except AudioError:
        tried[f"{name}: refused"] += 1
        return None
    check_output(out, MAX_SECONDS)
    tried[f"{name}: decoded"] += 1
    return out


# --- mutated real files ------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(SEEDS[draw(st.sampled_from(sorted(SEEDS)))])
    for op in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=6)):
        if not data:
            break
        op(draw, data)
    return bytes(data)


def _pos(draw: st.DrawFn, data: bytearray, width: int = 1) -> int:
    """A position, mostly in the first 512 bytes where the headers are."""
    end = max(0, len(data) - width)
    return draw(st.one_of(st.integers(0, min(end, 512)), st.integers(0, end)))


def _flip(draw: st.DrawFn, data: bytearray) -> None:
    data[_pos(draw, data)] = draw(st.integers(0, 255))


def _truncate(draw: st.DrawFn, data: bytearray) -> None:
    del data[draw(st.integers(0, len(data))) :]


def _insert(draw: st.DrawFn, data: bytearray) -> None:
    pos = _pos(draw, data)
    data[pos:pos] = draw(st.binary(min_size=1, max_size=64))


def _delete(draw: st.DrawFn, data: bytearray) -> None:
    pos = _pos(draw, data)
    del data[pos : pos + draw(st.integers(1, 64))]


LYING = [0, 1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF]


def _size(width: int):  # noqa: ANN202 (a mutation)
    def op(draw: st.DrawFn, data: bytearray) -> None:
        if len(data) < width:
            return
        pos = _pos(draw, data, width)
        value = draw(st.one_of(st.sampled_from(LYING), st.integers(0, 256**width - 1)))
        order = draw(st.sampled_from(["little", "big"]))
        data[pos : pos + width] = (value % 256**width).to_bytes(width, order)

    return op


def _splice(draw: st.DrawFn, data: bytearray) -> None:
    other = SEEDS[draw(st.sampled_from(sorted(SEEDS)))]
    pos, start = _pos(draw, data), draw(st.integers(0, len(other) - 1))
    data[pos:] = other[start:]


MUTATIONS = [_flip, _truncate, _insert, _delete, _size(2), _size(4), _splice]


@decoder_settings
@given(data=mutated())
def test_mutated_files_decode_or_are_refused(data: bytes, fuzz_tried: Counter) -> None:
    decode(data, fuzz_tried, "mutated files")


# --- headers that lie ------------------------------------------------------------------------


def wav_bytes(
    fmt_tag: int, channels: int, rate: int, bits: int, block_align: int, data_size: int, body: bytes
) -> bytes:
    fmt = struct.pack(
        "<HHIIHH", fmt_tag, channels, rate, (rate * block_align) % 2**32, block_align, bits
    )
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data"
    chunks += struct.pack("<I", data_size) + body
    return b"RIFF" + struct.pack("<I", (4 + len(chunks)) % 2**32) + b"WAVE" + chunks


def u(bits: int, *plausible: int) -> st.SearchStrategy[int]:
    """An unsigned field: a plausible value, an edge (0, 1, all ones), or anything."""
    edges = st.sampled_from([0, 1, 2**bits - 1, 2 ** (bits - 1)])
    return st.one_of(st.sampled_from(plausible), edges, st.integers(0, 2**bits - 1))


@decoder_settings
@given(
    fmt_tag=st.one_of(st.sampled_from([1, 3]), u(16, 2, 6, 7, 0x11, 0x55, 0xFFFE)),
    channels=u(16, 1, 2, 8, 32, 33),
    rate=u(32, 8000, 16000, 44100, 384_000, 384_001),
    bits=st.one_of(st.sampled_from([8, 16, 24, 32]), u(16, 7, 12, 64)),
    block_align=u(16, 1, 2, 3, 4, 6, 8),
    data_size=u(32, 0, 64, 2048),
    body=st.binary(max_size=2048),
)
def test_wav_headers_that_lie(
    fmt_tag: int,
    channels: int,
    rate: int,
    bits: int,
    block_align: int,
    data_size: int,
    body: bytes,
    fuzz_tried: Counter,
) -> None:
    data = wav_bytes(fmt_tag, channels, rate, bits, block_align, data_size, body)
    decode(data, fuzz_tried, "lying WAV headers")


def flac_with_streaminfo(rate: int, channels: int, bps: int, total: int, blocks: int) -> bytes:
    """The FLAC seed with its STREAMINFO fields replaced (20-bit rate, 3-bit channels - 1,
    5-bit bits per sample - 1, 36-bit total samples, 16-bit block sizes)."""
    data = bytearray(SEEDS["tone-8k.flac"])
    info = 8  # "fLaC" + the metadata block header
    data[info : info + 4] = struct.pack(">HH", blocks, blocks)
    packed = (rate << 44) | (channels << 41) | (bps << 36) | total
    data[info + 10 : info + 18] = packed.to_bytes(8, "big")
    return bytes(data)


@decoder_settings
@given(
    rate=u(20, 8000, 16000, 655_350),
    channels=st.one_of(st.just(0), st.integers(0, 7)),
    bps=st.one_of(st.just(15), st.integers(0, 31)),
    total=u(36, 2000, 1000, 2**32, 8000 * 3600 * 10),
    blocks=u(16, 4096, 16),
)
def test_flac_streaminfo_that_lies(
    rate: int, channels: int, bps: int, total: int, blocks: int, fuzz_tried: Counter
) -> None:
    decode(flac_with_streaminfo(rate, channels, bps, total, blocks), fuzz_tried, "lying FLAC")


@decoder_settings
@given(
    samples=st.lists(st.floats(width=32), min_size=1, max_size=400),
    channels=st.integers(1, 3),
    container=st.sampled_from([("WAV", "FLOAT"), ("WAV", "DOUBLE"), ("AIFF", "FLOAT")]),
)
def test_float_pcm_with_nan_and_inf(
    samples: list[float], channels: int, container: tuple[str, str], fuzz_tried: Counter
) -> None:
    frames = np.array(samples[: max(channels, len(samples) // channels * channels)], np.float32)
    frames = np.resize(frames, (max(1, len(frames) // channels), channels))  # [n, channels]
    buffer = io.BytesIO()
    sf.write(buffer, frames, 16000, format=container[0], subtype=container[1])
    out = decode(buffer.getvalue(), fuzz_tried, "NaN/Inf float files")
    assert (out is None) == (not np.isfinite(frames).all())  # refused exactly when not finite


def test_loud_finite_floats_are_clipped_not_refused() -> None:
    """Found by test_float_pcm_with_nan_and_inf: the channel mean of 2^127 and 2^127 was
    summed in float32, overflowed to Inf, and the file was refused as non-finite."""
    frames = np.full((1600, 2), 3e38, np.float32)  # [n, 2]
    buffer = io.BytesIO()
    sf.write(buffer, frames, 16000, format="WAV", subtype="FLOAT")
    for audio in (
        decode_audio(buffer.getvalue()),
        pcm_to_audio(frames.tobytes(), 16000, "float32", 2),
        pcm_to_audio(frames.tobytes(), 44100, "float32", 2),  # through the resampler
    ):
        check_output(audio)
        assert float(audio[len(audio) // 2]) == 1.0  # full scale, not refused


@decoder_settings
@given(
    data=st.binary(min_size=1, max_size=4096),
    rate=st.one_of(
        st.sampled_from([8000, 16000, 22050, 44100, 48000, 44101, 384_000]),
        st.integers(-(2**31), 2**31 - 1),
    ),
    encoding=st.sampled_from(["int16", "float32", "int16", "float32", "int8", "mulaw", ""]),
    channels=st.one_of(st.integers(1, 4), st.integers(-2, 40)),
    whole_frames=st.booleans(),
    specials=st.lists(st.sampled_from([math.nan, math.inf, -math.inf, 1e30]), max_size=3),
)
def test_raw_pcm_any_format(
    data: bytes,
    rate: int,
    encoding: str,
    channels: int,
    whole_frames: bool,
    specials: list[float],
    fuzz_tried: Counter,
) -> None:
    if encoding == "float32":  # random bytes are mostly finite floats; add the others
        data = np.nan_to_num(np.frombuffer(data[: len(data) // 4 * 4], "<f4")).tobytes()
        data += np.array(specials, "<f4").tobytes()
    if whole_frames and channels > 0:  # else most lengths are not whole frames
        frame = (4 if encoding == "float32" else 2) * channels
        data = data[: len(data) // frame * frame] or data
    try:
        out = pcm_to_audio(data, rate, encoding, channels)
    except AudioError:
        fuzz_tried["raw PCM: refused"] += 1
        return
    check_output(out)
    fuzz_tried["raw PCM: decoded"] += 1


# --- decompression bombs ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def flac_bomb() -> bytes:
    """300 s of 8-channel 48 kHz silence: ~120 KB of FLAC, 460 MB as float32."""
    buffer = io.BytesIO()
    zeros = np.zeros((48000 * 10, 8), np.int16)
    with sf.SoundFile(buffer, "w", 48000, 8, format="FLAC", subtype="PCM_16") as f:
        for _ in range(30):
            f.write(zeros)
    return buffer.getvalue()


def peak_traced_mb(data: bytes) -> tuple[AudioTooLongError, float]:
    tracemalloc.start()
    try:
        with pytest.raises(AudioTooLongError) as err:
            decode_audio(data, max_seconds=MAX_SECONDS)
        return err.value, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_bomb_declaring_minutes_is_refused_before_decoding(flac_bomb: bytes) -> None:
    assert len(flac_bomb) < 300_000
    error, peak = peak_traced_mb(flac_bomb)
    assert "declared 300.0 s" in str(error)
    assert peak < 1, f"{peak:.1f} MB"  # the header was enough


def test_bomb_hiding_its_length_stops_at_the_budget(flac_bomb: bytes) -> None:
    hidden = bytearray(flac_bomb)  # STREAMINFO total samples = 0: "unknown"
    hidden[8 + 13] &= 0xF0
    hidden[8 + 14 : 8 + 18] = bytes(4)
    error, peak = peak_traced_mb(bytes(hidden))
    assert "too long to decode" in str(error)  # 30 s of stereo 48 kHz worth of values
    assert peak < 32, f"{peak:.1f} MB"  # the whole file would be 460 MB


# --- replay: the seeds and every input that once broke something -----------------------------


@pytest.mark.parametrize(
    "path",
    sorted((FUZZ / "regressions").iterdir()) + sorted((FUZZ / "corpus").iterdir()),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_replay(path: Path) -> None:
    outcome = Decoder()(path.read_bytes())
    assert outcome in ("ok", "refused")
    if path.parent.name == "corpus":
        assert outcome == "ok", "a seed must decode"


# --- coverage-guided: atheris ----------------------------------------------------------------


def test_atheris_finds_no_crash(tmp_path: Path, fuzz_tried: Counter) -> None:
    pytest.importorskip("atheris", reason="atheris builds only on Linux/macOS x86-64/arm64")
    work = tmp_path / "corpus"
    work.mkdir()
    command = [sys.executable, str(FUZZ / "fuzz_audio.py"), str(work), str(FUZZ / "corpus")]
    command += [f"-max_total_time={max(1, int(ATHERIS_SECONDS))}", "-print_final_stats=1"]
    command += [f"-artifact_prefix={tmp_path}/", "-close_fd_mask=1"]
    # libFuzzer's -rss_limit_mb reads the peak RSS (getrusage), which a child started from
    # this process inherits: pytest's own RSS, GBs once the models are loaded, would count as
    # the harness's. A shell in between (forking, not exec-ing, the harness) starts it at 0.
    command = ["sh", "-c", '"$@"; exit $?', "sh", *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=ATHERIS_SECONDS + 300)
    stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", run.stderr))
    crashes = [p.name for p in tmp_path.iterdir() if p.is_file()]
    assert run.returncode == 0 and not crashes, (
        f"atheris found a crash: {crashes}; keep it in tests/fuzz/regressions/\n"
        + run.stderr[-3000:]
    )
    fuzz_tried["atheris (coverage-guided)"] += int(stats["number_of_executed_units"])


# --- request handling --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline("tiny.en")


@pytest.fixture(scope="module")
def stub(pipeline: Pipeline) -> Iterator[transcriber_pb2_grpc.TranscriberStub]:
    config = ServerConfig(port=0, max_audio_seconds=20.0, workers=1, max_queue=8)
    with BackgroundServer(config, pipeline) as server:
        with grpc.insecure_channel(server.address) as channel:
            yield transcriber_pb2_grpc.TranscriberStub(channel)


def tone(seconds: float = 0.4) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.2 * np.sin(2 * np.pi * 300 * t) * 32767).astype("<i2").tobytes()


audios = st.one_of(
    st.just(pb.Audio(pcm=pb.Pcm(data=tone(), sample_rate=16000, encoding=1))),
    st.builds(
        lambda data, rate, enc, ch: pb.Audio(
            pcm=pb.Pcm(data=data, sample_rate=rate, encoding=enc, channels=ch)
        ),
        st.one_of(st.just(tone()), st.binary(max_size=2048)),
        st.one_of(st.just(16000), st.integers(-(2**31), 2**31 - 1)),
        st.integers(0, 4),
        st.integers(-(2**31), 2**31 - 1),
    ),
    mutated().map(lambda data: pb.Audio(encoded=data)),
    st.just(pb.Audio(encoded=wav_bytes(1, 1, 16000, 16, 2, 2**32 - 1, tone(30)))),  # > limit
    st.just(pb.Audio()),  # no audio at all
)
options = st.builds(
    pb.TranscriptionOptions,
    language=st.one_of(st.sampled_from(["", "en", "de", "xx", "EN"]), st.text(max_size=8)),
    task=st.one_of(st.sampled_from([0, 1, 2]), st.integers(-(2**31), 2**31 - 1)),
    word_timestamps=st.booleans(),
    temperatures=st.one_of(
        st.sampled_from([[], [0.0], [0.0, 0.4]]),
        st.lists(st.one_of(st.sampled_from([0.0, -1.0, 1e9]), st.floats(width=32)), max_size=3),
    ),
    condition_on_previous_text=st.booleans(),
)
valid_heads = st.builds(pb.AttentionHead, layer=st.integers(0, 3), head=st.integers(0, 5))
any_heads = st.builds(
    pb.AttentionHead,
    layer=st.one_of(st.integers(-1, 5), st.integers(-(2**31), 2**31 - 1)),
    head=st.one_of(st.integers(-1, 7), st.integers(-(2**31), 2**31 - 1)),
)
alignments = st.builds(
    pb.AlignmentOptions,
    mode=st.one_of(st.integers(0, 4), st.integers(-(2**31), 2**31 - 1)),
    heads=st.one_of(
        st.just([]), st.lists(valid_heads, max_size=3), st.lists(any_heads, max_size=3)
    ),
    data_type=st.one_of(st.integers(0, 2), st.integers(-(2**31), 2**31 - 1)),
)


# Half the requests are valid throughout (they must succeed, with any mix of valid options);
# the others draw every field from anything, valid or not.
TONE = pb.Audio(pcm=pb.Pcm(data=tone(), sample_rate=16000, encoding=pb.PCM_ENCODING_INT16))
valid_options = st.builds(
    pb.TranscriptionOptions,
    language=st.sampled_from(["", "en"]),
    task=st.sampled_from([0, 1]),
    word_timestamps=st.booleans(),
    temperatures=st.sampled_from([[], [0.0], [0.0, 0.4], [0.5]]),
    condition_on_previous_text=st.booleans(),
)
valid_alignments = st.builds(
    pb.AlignmentOptions,
    mode=st.integers(0, 3),
    data_type=st.integers(0, 2),
) | st.builds(pb.AlignmentOptions, heads=st.lists(valid_heads, min_size=1, max_size=3))
requests = st.one_of(
    st.tuples(
        st.just(True),
        st.builds(dict, audio=st.just(TONE), options=valid_options, alignment=valid_alignments),
    ),
    st.tuples(st.just(False), st.builds(dict, audio=audios, options=options, alignment=alignments)),
)


def call(stub: transcriber_pb2_grpc.TranscriberStub, rpc: str, request: object) -> grpc.StatusCode:
    try:
        if rpc == "Transcribe":
            stub.Transcribe(pb.TranscribeRequest(**request), timeout=DEADLINE)
        else:
            events = list(
                stub.StreamTranscribe(pb.StreamTranscribeRequest(**request), timeout=DEADLINE)
            )
            assert events[-1].HasField("done")
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@settings(max_examples=REQUESTS, deadline=None, suppress_health_check=list(HealthCheck))
@given(rpc=st.sampled_from(["Transcribe", "StreamTranscribe"]), request=requests)
def test_requests_end_in_a_result_or_a_precise_status(
    stub: transcriber_pb2_grpc.TranscriberStub,
    rpc: str,
    request: tuple[bool, dict],
    fuzz_tried: Counter,
) -> None:
    valid, fields = request
    code = call(stub, rpc, fields)
    fuzz_tried[f"requests: {code.name}"] += 1
    assert code in PRECISE, f"{rpc} ended in {code.name}"
    assert code == grpc.StatusCode.OK or not valid, f"valid {rpc}({fields}) -> {code.name}"


configs = st.builds(
    pb.StreamingRecognitionConfig,
    encoding=st.one_of(st.just(1), st.integers(-(2**31), 2**31 - 1)),
    sample_rate=st.one_of(st.just(16000), st.integers(-(2**31), 2**31 - 1)),
    channels=st.one_of(st.sampled_from([0, 1]), st.integers(-(2**31), 2**31 - 1)),
    language=st.one_of(st.sampled_from(["", "en", "xx"]), st.text(max_size=6)),
    interim_results=st.booleans(),
    alignment=alignments,
    policy=st.one_of(
        st.just(pb.LivePolicy()),
        st.builds(
            pb.LivePolicy,
            commit_margin=st.one_of(st.floats(), st.sampled_from([0.3, -1.0, 1e9])),
            agreement=st.booleans(),
            first_context=st.one_of(st.floats(), st.sampled_from([1.5, -1.0, 1e9])),
        ),
    ),
)


@settings(
    max_examples=max(20, REQUESTS // 2), deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    config=st.one_of(
        st.builds(
            pb.StreamingRecognitionConfig,
            encoding=st.just(pb.PCM_ENCODING_INT16),
            sample_rate=st.just(16000),
            interim_results=st.booleans(),
            alignment=valid_alignments,
        ),
        configs,
    ),
    chunks=st.lists(
        st.one_of(st.just(tone(0.3)), st.binary(max_size=999).map(lambda b: b[: len(b) // 2 * 2])),
        max_size=3,
    ),
    config_twice=st.booleans(),
)
def test_live_streams_end_in_a_result_or_a_precise_status(
    stub: transcriber_pb2_grpc.TranscriberStub,
    config: pb.StreamingRecognitionConfig,
    chunks: list[bytes],
    config_twice: bool,
    fuzz_tried: Counter,
) -> None:
    requests = [pb.StreamingRecognizeRequest(config=config)]
    requests += [pb.StreamingRecognizeRequest(audio_content=c) for c in chunks]
    if config_twice:
        requests.append(pb.StreamingRecognizeRequest(config=config))
    try:
        list(stub.StreamingRecognize(iter(requests), timeout=DEADLINE))
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    fuzz_tried[f"live streams: {code.name}"] += 1
    assert code in PRECISE, f"StreamingRecognize ended in {code.name}"
