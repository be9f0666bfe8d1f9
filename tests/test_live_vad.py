"""Live VAD: speech, 30 s of silence, speech. No decode in the silence, speech events where
the offline detector puts speech, finals equal to the offline text (within one word, case and
punctuation aside, as tests/test_streaming_model.py); then the same through the service with
single_utterance.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from conftest import SHARED_AUDIO
from openai_ref import pipeline
from wording import word_distance, words_of

from xattn.model.audio.features import decode_audio
from xattn.model.audio.vad import SAMPLE_RATE, VadOptions, speech_probs, speech_spans
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions, LiveResult
from xattn.model.live.vad_stream import BEGIN, END, LIVE_VAD, SpeechEvent, StreamingVad
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

SECOND = SHARED_AUDIO.parent / "eval/audio/psphinx_sense_and_sensibility_01_austen_64kb-0880.wav"
SILENCE = 30.0
FEED = 1600  # 100 ms


@pytest.fixture(scope="module")
def stream_audio(jfk_path) -> tuple[np.ndarray, float]:
    """jfk (11 s), 30 s of near silence, a 3 s sentence, 3 s of silence (speech ends after
    2 s of it); and where the silence is."""
    if not SECOND.is_file():
        pytest.skip(f"shared test audio missing: {SECOND}")
    jfk = decode_audio(jfk_path)
    rng = np.random.default_rng(0)
    quiet = (rng.standard_normal(int(SILENCE * SAMPLE_RATE)) * 1e-3).astype(np.float32)
    audio = np.concatenate(
        [jfk, quiet, decode_audio(SECOND), np.zeros(3 * SAMPLE_RATE, np.float32)]
    )
    return audio, len(jfk) / SAMPLE_RATE


@pytest.fixture(scope="module")
def live_run(stream_audio) -> list[tuple[float, int, object]]:
    """(stream seconds fed, decodes run so far, event) for every result and speech event."""
    audio, _ = stream_audio
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(
        pipe.context, pipe.alignment_heads, LiveOptions(vad=LIVE_VAD, min_step=1.0)
    )
    out = []
    for i in range(0, len(audio), FEED):
        for r in live.feed(audio[i : i + FEED]):
            out.append((min(i + FEED, len(audio)) / SAMPLE_RATE, live.stats.steps, r))
    out.extend((len(audio) / SAMPLE_RATE, live.stats.steps, r) for r in live.finish())
    out.append((len(audio) / SAMPLE_RATE, live.stats.steps, live.stats))
    return out


def test_streaming_probabilities_equal_the_whole_file(stream_audio) -> None:
    audio, _ = stream_audio
    vad = StreamingVad()
    probs = []
    vad.net = _Recorder(vad.net, probs)
    cuts = [0, 100, 700, 5000, 5001, 48000, len(audio)]  # pieces shorter than a chunk too
    for a, b in zip(cuts, cuts[1:], strict=False):
        vad.feed(audio[a:b])
    whole = speech_probs(audio)[: len(audio) // 512]
    assert np.abs(np.concatenate(probs) - whole).max() < 1e-4


class _Recorder:
    """The real network, its outputs kept."""

    def __init__(self, net, kept: list) -> None:
        self.net, self.kept = net, kept

    def __call__(self, chunks, state):
        probs, state = self.net(chunks, state)
        self.kept.append(probs.numpy().copy())
        return probs, state


def test_no_decodes_in_the_silence(live_run, stream_audio) -> None:
    _, speech_end = stream_audio
    events = [(at, steps, e) for at, steps, e in live_run if isinstance(e, SpeechEvent)]
    ends = [(at, steps) for at, steps, e in events if e.kind == END]
    begins = [(at, steps) for at, steps, e in events if e.kind == BEGIN]
    assert len(ends) == 2 and len(begins) == 2
    # from the end of the first speech (its flush counted) to the second speech: no decode
    (_, steps_at_end), (_, steps_at_begin) = ends[0], begins[1]
    assert steps_at_begin - steps_at_end == 0
    stats = live_run[-1][2]
    assert stats.skipped_steps >= SILENCE - 2  # one step a second would have run


def test_events_where_offline_vad_puts_speech(live_run, stream_audio) -> None:
    audio, _ = stream_audio
    offline = speech_spans(speech_probs(audio), len(audio), VadOptions(speech_pad_ms=0))
    events = [e for _, _, e in live_run if isinstance(e, SpeechEvent)]
    times = [(e.kind, e.time) for e in events]
    expected = [(k, t) for s in offline for k, t in ((BEGIN, s.start_s), (END, s.end_s))]
    assert [k for k, _ in times] == [k for k, _ in expected]
    for (_, t), (_, want) in zip(times, expected, strict=True):
        assert abs(t - want) <= 0.3, (times, expected)
    assert 41.0 <= events[2].time <= 42.0  # the second sentence starts after 30 s of silence


def test_finals_equal_the_offline_text(live_run, stream_audio) -> None:
    audio, _ = stream_audio
    finals = "".join(e.text for _, _, e in live_run if isinstance(e, LiveResult) and e.is_final)
    offline = list(pipeline("tiny.en").transcribe(audio))[-1].text
    assert word_distance(finals, offline) <= 1, (finals, offline)


@pytest.fixture(scope="module")
def stub() -> Iterator[transcriber_pb2_grpc.TranscriberStub]:
    with BackgroundServer(ServerConfig(port=0, workers=1), pipeline("tiny.en")) as server:
        with grpc.insecure_channel(server.address) as channel:
            yield transcriber_pb2_grpc.TranscriberStub(channel)


def test_a_word_cut_by_a_step_is_read_whole_and_once(jfk_path) -> None:
    """Realtime's server_vad (speech ends after 500 ms of silence), steps where a loaded
    server put them: the step at 2.2 s cuts "Americans" (read "American."), speech ends at
    2.24 s. The utterance's end decodes again instead of keeping that reading (speech went on
    after it), and the next utterance starts where the speech ended, not PRE_ROLL s before
    the feed (which held the word's end, read again after the prompt: "fellow American
    Americans")."""
    audio = decode_audio(jfk_path)
    vad = dataclasses.replace(LIVE_VAD, min_silence_duration_ms=500)
    pipe = pipeline("tiny.en")
    live = LiveTranscriber(pipe.context, pipe.alignment_heads, LiveOptions(vad=vad, min_step=1.0))
    cuts = [16000, 35200, 46400, *range(59200, len(audio), 12800), len(audio)]
    finals, at = [], 0
    for cut in cuts:
        results = live.feed(audio[at:cut])
        finals += [r.text for r in results if isinstance(r, LiveResult) and r.is_final]
        at = cut
    finals += [r.text for r in live.finish()]
    words = words_of("".join(finals))
    assert "fellow americans" in " ".join(words), finals
    assert all(a != b and not b.startswith(a) for a, b in itertools.pairwise(words)), finals


def test_single_utterance_over_the_service(stub, stream_audio) -> None:
    audio, speech_end = stream_audio
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    config = pb.StreamingRecognitionConfig(
        encoding=pb.PCM_ENCODING_INT16, sample_rate=SAMPLE_RATE, vad=True, single_utterance=True
    )
    config.vad_options.min_silence_duration_ms = 1500
    config.alignment.mode = pb.ALIGNMENT_MODE_NONE

    def requests():
        yield pb.StreamingRecognizeRequest(config=config)
        for i in range(0, len(pcm), 2 * SAMPLE_RATE):  # 1 s pieces, as fast as they go
            yield pb.StreamingRecognizeRequest(audio_content=pcm[i : i + 2 * SAMPLE_RATE])

    responses = list(stub.StreamingRecognize(requests(), timeout=300))
    kinds = [r.WhichOneof("event") for r in responses]
    speech = [r.speech_event for r in responses if r.HasField("speech_event")]
    T = pb.SpeechEventType
    assert [T.Name(e.type) for e in speech] == [
        "SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN",
        "SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END",
        "SPEECH_EVENT_TYPE_END_OF_SINGLE_UTTERANCE",
    ]
    assert speech[0].time < 1.0 and abs(speech[1].time - speech_end) < 1.0
    assert kinds[-1] == "done" and kinds.index("done") > kinds.index("speech_event")
    done = responses[-1].done
    assert "country" in done.text and "young man" not in done.text  # the second never decoded
    assert 8.0 < done.speech_seconds < 12.0


def test_single_utterance_needs_vad(stub) -> None:
    config = pb.StreamingRecognitionConfig(
        encoding=pb.PCM_ENCODING_INT16, sample_rate=SAMPLE_RATE, single_utterance=True
    )
    with pytest.raises(grpc.RpcError) as err:
        list(stub.StreamingRecognize(iter([pb.StreamingRecognizeRequest(config=config)])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "single_utterance" in err.value.details()
