"""Batched long-form (transcribe/batched.py): chunks decoded N at once give the tokens of the same
chunks decoded one by one; rows sum to 1; words and segments are in order on the file's clock.

The audio (~60 s) is built from the shared clips with pauses, so that vad_filter groups it
into several chunks (tests/test_longform.py: their edges).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from conftest import SHARED_AUDIO, long_form_file, tokens_per_window
from openai_ref import pipeline

from xattn.model.audio import vad
from xattn.model.audio.features import decode_audio
from xattn.model.audio.vad import SAMPLE_RATE
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import Segment, TokenEvent, Transcript, WindowStart
from xattn.model.transcribe.batched import chunk_spans, quiet_cuts, windows_of
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

CLIPS = ("eval/audio/cuttledoc_fleurs-en-005.ogg", "eval/audio/coqui_LJ001-0007.wav")


@pytest.fixture(scope="module")
def long_audio(jfk_path) -> np.ndarray:
    paths = [SHARED_AUDIO.parent / c for c in CLIPS]
    if not all(p.is_file() for p in paths):
        pytest.skip("shared eval audio missing")
    jfk, b, c = decode_audio(jfk_path), *(decode_audio(p) for p in paths)
    pause = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    return np.concatenate([jfk, pause, b, pause, c, jfk, b])


def _run(audio: np.ndarray, batch_size: int, vad: bool) -> list:
    options = DecodeOptions(
        batch_size=batch_size,
        vad_filter=vad,
        word_timestamps=True,
        return_attention=True,
        temperatures=(0.0,),
        language="en",
    )
    return list(pipeline("tiny.en").transcribe(audio, options))


@pytest.fixture(scope="module")
def batched(long_audio) -> list:
    return _run(long_audio, 4, vad=True)


def _chunks(audio: np.ndarray) -> int:
    return len(windows_of(audio, chunk_spans(audio, None)))


def test_batched_equals_one_by_one(long_audio, batched) -> None:
    one_by_one = _run(long_audio, 1, vad=True)
    n = _chunks(long_audio)
    assert n >= 2 and sorted(tokens_per_window(batched))[:n] == list(range(n))
    assert tokens_per_window(batched) == tokens_per_window(one_by_one)
    assert batched[-1].text == one_by_one[-1].text


def test_rows_words_and_segments_in_order(long_audio, batched) -> None:
    tokens = [e for e in batched if isinstance(e, TokenEvent)]
    assert [e.index for e in tokens] == list(range(len(tokens)))
    for e in tokens:
        assert np.allclose(e.attention.sum(-1), 1.0, atol=1e-3)  # [L, H]
    transcript = batched[-1]
    assert isinstance(transcript, Transcript)
    segments = [e for e in batched if isinstance(e, Segment)]
    assert segments == list(transcript.segments)
    starts = [s.start for s in segments]
    assert starts == sorted(starts) and starts[-1] < len(long_audio) / SAMPLE_RATE
    words = [w for s in segments for w in s.words]
    assert [w.start for w in words] == sorted(w.start for w in words)
    assert all(w.start <= w.end for w in words)
    assert transcript.text.count("ask not what your country") == 2
    windows = [e for e in batched if isinstance(e, WindowStart)]
    n = _chunks(long_audio)
    assert sorted(w.window for w in windows)[:n] == list(range(n))
    assert all(sum(p.count for p in w.clock) == w.num_frames for w in windows)


@pytest.mark.slow
def test_long_file_batched_equals_one_by_one() -> None:
    """The long-form set's `pauses` file (benchmarks.longform_set: the shared English clips and
    jfk with 0.5-30 s pauses, noise in some): batch 8 gives each window the tokens that window
    gets decoded alone; every row sums to 1; words and segments are in order."""
    audio = long_form_file("pauses").audio
    batched = _run(audio, 8, vad=True)
    tokens = tokens_per_window(batched)
    assert len(tokens) >= 8 and tokens == tokens_per_window(_run(audio, 1, vad=True))
    rows = np.stack([e.attention for e in batched if isinstance(e, TokenEvent)])  # [n, L, H, F]
    assert np.allclose(rows.sum(-1), 1.0, atol=1e-3)
    words = [w for e in batched if isinstance(e, Segment) for w in e.words]
    assert [w.start for w in words] == sorted(w.start for w in words)
    segments = [e.start for e in batched if isinstance(e, Segment)]
    assert segments == sorted(segments) and segments[-1] < len(audio) / SAMPLE_RATE


def test_its_torch_work_runs_on_the_calling_thread(long_audio) -> None:
    """A library call with batch_size runs every forward (log-mel, encoder, decoder steps) on
    the thread that called it, as the sequential path does: a model thread of its own would
    hold a second OpenMP team (xattn.model.decode.step_batcher.CallerThread)."""
    model = pipeline("tiny.en").model
    threads: set[str] = set()
    hooks = [
        m.register_forward_hook(lambda *_: threads.add(threading.current_thread().name))
        for m in (model.encoder, model.decoder)
    ]
    try:
        events = _run(long_audio, 4, vad=True)
    finally:
        for h in hooks:
            h.remove()
    assert threads == {threading.current_thread().name}
    assert len(tokens_per_window(events)) >= _chunks(long_audio)


def test_closing_early_stops_the_windows(long_audio) -> None:
    """The consumer leaves after the first tokens: the windows stop after their current step
    (no window thread left waiting on the caller's thread), and the pipeline still works."""
    pipe = pipeline("tiny.en")
    steps = []
    hook = pipe.model.decoder.register_forward_hook(lambda *_: steps.append(1))
    options = DecodeOptions(batch_size=4, vad_filter=True, temperatures=(0.0,), language="en")
    try:
        events = pipe.transcribe(long_audio, options)
        first = [e for _, e in zip(range(12), events, strict=False)]
        n = len(steps)
        events.close()
        after = len(steps) - n
    finally:
        hook.remove()
    assert sum(isinstance(e, TokenEvent) for e in first) >= 5
    assert after <= 2  # the step in flight, at most
    assert not [t for t in threading.enumerate() if t.name.startswith("xattn-window")]
    assert "ask not what your country" in list(pipe.transcribe(long_audio, options))[-1].text


def test_without_vad_cuts_at_a_quiet_point(long_audio) -> None:
    """40 s without VAD: two chunks, cut at the quietest 20 ms of 25-30 s (quiet_cuts)."""
    audio = long_audio[: 40 * SAMPLE_RATE]
    events = _run(audio, 2, vad=False)
    cut = quiet_cuts(audio)[0]
    assert 25 * SAMPLE_RATE <= cut <= 30 * SAMPLE_RATE
    windows = {e.window: e for e in events if isinstance(e, WindowStart)}
    assert (windows[0].offset, windows[0].num_frames) == (0.0, cut // 320)
    assert windows[1].offset == pytest.approx(cut / SAMPLE_RATE, abs=0.01)
    assert events[-1].speech is None
    assert "ask not what your country" in events[-1].text


def test_batch_size_range() -> None:
    with pytest.raises(OptionsError, match="batch_size 0 is outside 1..64"):
        pipeline("tiny.en").validate(DecodeOptions(batch_size=0))


@pytest.fixture(scope="module")
def stub() -> Iterator[transcriber_pb2_grpc.TranscriberStub]:
    with BackgroundServer(ServerConfig(port=0, workers=1), pipeline("tiny.en")) as server:
        with grpc.insecure_channel(server.address) as channel:
            yield transcriber_pb2_grpc.TranscriberStub(channel)


def test_batch_size_over_the_service(stub, long_audio, batched) -> None:
    """Transcribe with vad_filter and batch_size 4 (greedy, as the in-process run): the same
    windows and tokens, each window's row matrix as tall as its tokens."""
    options = pb.TranscriptionOptions(
        vad_filter=True, batch_size=4, beam_size=1, language="en", word_timestamps=True
    )
    options.temperatures.append(0.0)
    pcm = pb.Pcm(
        data=long_audio.astype("<f4").tobytes(),
        sample_rate=SAMPLE_RATE,
        encoding=pb.PCM_ENCODING_FLOAT32,
    )
    alignment = pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS)
    request = pb.TranscribeRequest(audio=pb.Audio(pcm=pcm), options=options, alignment=alignment)
    response = stub.Transcribe(request, timeout=300)
    assert {w.window: list(w.token_ids) for w in response.windows} == tokens_per_window(batched)
    assert [list(w.matrix.shape) for w in response.windows] == [
        [len(w.token_ids), 1, 1500] for w in response.windows
    ]
    assert response.transcript.vad_filtered and response.transcript.text == batched[-1].text


def test_vad_on_a_server_without_silero(stub, monkeypatch) -> None:
    """No silero-vad where the model runs: vad_filter and live vad are UNIMPLEMENTED, with what
    to install; the server keeps serving."""
    monkeypatch.setattr(vad, "silero_package", lambda: None)
    audio = pb.Audio(pcm=pb.Pcm(data=bytes(32000), sample_rate=SAMPLE_RATE, encoding=1))
    options = pb.TranscriptionOptions(vad_filter=True)
    live = pb.StreamingRecognitionConfig(encoding=1, sample_rate=SAMPLE_RATE, vad=True)
    streamed = pb.StreamTranscribeRequest(audio=audio, options=options)
    calls = [
        lambda: stub.Transcribe(pb.TranscribeRequest(audio=audio, options=options)),
        lambda: list(stub.StreamTranscribe(streamed)),
        lambda: list(stub.StreamingRecognize(iter([pb.StreamingRecognizeRequest(config=live)]))),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "install xattn[vad]" in err.value.details()
    plain = stub.Transcribe(pb.TranscribeRequest(audio=audio), timeout=60)
    assert plain.transcript.text.strip() == ""
