"""The HTTP face with the official `openai` SDK as the client, against a real server on a
loopback port (tiny.en, and base where installed): every response_format, granularities,
translations, stream=True, models, and each error status as the SDK raises it."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf
import srt
import webvtt
from http_client import http

from xattn.model.audio import decode_audio
from xattn.model.decode.results import Segment
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.engine.engine import Run
from xattn.service.http.languages import LANGUAGES
from xattn.service.server import Server, ServerConfig

JFK_TEXT = (
    "And so, my fellow Americans ask not what your country can do for you ask what you can "
    "do for your country."
)
GREEDY_TEXT = JFK_TEXT.replace(",", "").removesuffix(".")  # beam_size=1 differs in punctuation


@pytest.fixture(scope="module")
def pipelines() -> tuple[Pipeline, ...]:
    pipes = [load_pipeline("tiny.en")]
    try:
        pipes.append(load_pipeline("base"))
    except (ValueError, OSError, ImportError):
        pass  # `pip install 'xattn[base]'`: the tests that need it skip
    return tuple(pipes)


@pytest.fixture(scope="module")
def server(pipelines: tuple[Pipeline, ...]) -> Iterator[BackgroundServer]:
    config = ServerConfig(port=0, http_port=0, workers=2, max_queue=8, max_audio_seconds=120)
    with BackgroundServer(config, pipelines) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{server.http_address}/v1", api_key="unused", max_retries=0, timeout=120
    )


@pytest.fixture(scope="module")
def jfk(jfk_path: Path) -> bytes:
    return jfk_path.read_bytes()


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, 16000, format="WAV", subtype="PCM_16")
    return out.getvalue()


def transcribe(client: openai.OpenAI, data: bytes, **kwargs: object) -> object:
    return client.audio.transcriptions.create(
        file=("audio.flac", data), model=kwargs.pop("model", "whisper-1"), **kwargs
    )


def test_json_and_text(client: openai.OpenAI, jfk: bytes) -> None:
    result = transcribe(client, jfk)
    assert result.text == JFK_TEXT
    assert result.usage.type == "duration" and result.usage.seconds == 11
    text = transcribe(client, jfk, response_format="text")
    assert text == JFK_TEXT + "\n"


def test_srt_and_vtt(client: openai.OpenAI, jfk: bytes) -> None:
    cues = list(srt.parse(transcribe(client, jfk, response_format="srt")))
    assert " ".join(c.content for c in cues) == JFK_TEXT
    assert cues[0].start.total_seconds() == 0 and cues[-1].end.total_seconds() == 11.0
    vtt = webvtt.from_buffer(io.StringIO(transcribe(client, jfk, response_format="vtt")))
    assert [c.text for c in vtt] == [c.content for c in cues]
    assert vtt[0].start == "00:00:00.000" and vtt[-1].end == "00:00:11.000"


def test_verbose_json_granularities(client: openai.OpenAI, jfk: bytes) -> None:
    default = transcribe(client, jfk, response_format="verbose_json")
    assert default.language == "english" and default.duration == 11.0
    assert default.text == JFK_TEXT and default.words is None
    assert "".join(s.text for s in default.segments).strip() == JFK_TEXT
    first = default.segments[0]
    assert (first.id, first.seek, first.start) == (0, 0, 0.0) and first.tokens
    assert first.avg_logprob < 0 and 0 < first.compression_ratio and 0 <= first.no_speech_prob
    words = transcribe(
        client, jfk, response_format="verbose_json", timestamp_granularities=["word"]
    )
    assert words.segments is None
    assert " ".join(w.word for w in words.words) == JFK_TEXT
    assert all(0 <= w.start <= w.end <= 11.0 for w in words.words)
    both = transcribe(
        client, jfk, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert both.words == words.words  # segments with words end at their last word's end
    assert [(s.text, s.tokens) for s in both.segments] == [
        (s.text, s.tokens) for s in default.segments
    ]


def test_explicit_temperature_is_the_first_rung(client: openai.OpenAI, jfk: bytes) -> None:
    # 0: openai-whisper's default ladder
    greedy = transcribe(client, jfk, temperature=0, extra_body={"beam_size": "1"})
    assert greedy.text == GREEDY_TEXT


def test_translation(
    client: openai.OpenAI, pipelines: tuple[Pipeline, ...], multilingual_path: Path
) -> None:
    if len(pipelines) < 2:
        pytest.skip("base is not installed (pip install 'xattn[base]')")
    german = decode_audio(multilingual_path.read_bytes())[30 * 16000 : 50 * 16000]
    result = client.audio.translations.create(
        file=("de.wav", wav(german)), model="base", response_format="verbose_json"
    )
    assert result.task == "translate" and result.language == "german"
    words = result.text.lower().split()
    assert len(words) > 10 and {"the", "and"} & set(words)  # English, not German
    with pytest.raises(openai.BadRequestError) as e:  # tiny.en cannot translate
        client.audio.translations.create(file=("de.wav", wav(german)), model="tiny.en")
    assert e.value.body["param"] == "model"


def test_models(client: openai.OpenAI, pipelines: tuple[Pipeline, ...]) -> None:
    listed = client.models.list()
    assert [m.id for m in listed.data] == [p.name for p in pipelines]
    assert client.models.retrieve("tiny.en").id == "tiny.en"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("large-v9")


def test_stream_deltas_arrive_while_decoding(
    client: openai.OpenAI, server: BackgroundServer, jfk: bytes
) -> None:
    """The first Segment is yielded only after the window's beam search ends; it waits here
    until the client has a delta, so the deltas that reach it first are early beam tokens."""
    pipe = server.engine.pipeline_for("tiny.en")
    original = pipe.transcribe
    got_delta, waited = threading.Event(), []

    def gated(audio: np.ndarray, options: object = None) -> Iterator[object]:
        for event in original(audio, options):
            if isinstance(event, Segment) and not waited:
                waited.append(got_delta.wait(60))
            yield event

    object.__setattr__(pipe, "transcribe", gated)  # the engine's pipeline, for this test
    try:
        deltas, done = [], None
        for event in transcribe(client, jfk, model="tiny.en", stream=True):
            if event.type == "transcript.text.delta":
                deltas.append(event.delta)
                got_delta.set()
            elif event.type == "transcript.text.done":
                done = event.text
    finally:
        object.__delattr__(pipe, "transcribe")
    assert waited == [True]  # a delta came before the search's end
    assert done == JFK_TEXT and "".join(deltas) == done


def test_stream_rows(client: openai.OpenAI, jfk: bytes) -> None:
    events = list(
        transcribe(client, jfk, stream=True, include=["attention"], extra_body={"beam_size": "1"})
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "xattn.window" and kinds[-1] == "transcript.text.done"
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) == 27  # every token, timestamps and end-of-text included
    for e in deltas:
        row = e.model_extra["xattn"]["attention"] if e.model_extra else e.xattn["attention"]
        assert row["shape"] == [1, 1, 1500] and row["dtype"] == "float16"
    assert "".join(e.delta for e in deltas) == events[-1].text == GREEDY_TEXT


def test_verbose_json_rows(client: openai.OpenAI, jfk: bytes) -> None:
    import base64

    body = transcribe(
        client, jfk, response_format="verbose_json", include=["attention"],
        extra_body={"attention_heads": "1:0,2:3", "attention_dtype": "float32"},
    ).model_dump()  # fmt: skip
    (window,) = body["attention"]
    matrix = window["matrix"]
    assert window["heads"] == [[1, 0], [2, 3]] and matrix["dtype"] == "float32"
    n = len(window["token_ids"])
    values = np.frombuffer(base64.b64decode(matrix["data"]), "<f4").reshape(matrix["shape"])
    assert values.shape == (n, 2, 1500)
    assert np.allclose(values.sum(axis=-1), 1.0, atol=1e-3)  # softmax rows


def test_languages_are_whispers() -> None:
    whisper_tokenizer = pytest.importorskip("whisper.tokenizer")
    assert LANGUAGES == whisper_tokenizer.LANGUAGES


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"response_format": "xml"}, "response_format"),
        ({"language": "klingon"}, "language"),
        ({"language": "de"}, "language"),  # tiny.en knows English only
        ({"temperature": "1.5"}, "temperature"),
        ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),  # needs verbose_json
        ({"timestamp_granularities[]": "phoneme", "response_format": "verbose_json"},
         "timestamp_granularities"),
        ({"include[]": "everything"}, "include"),
        ({"beam_size": "0"}, "beam_size"),
        ({"beam_size": "five"}, "beam_size"),
    ],
)  # fmt: skip
def test_bad_parameters_are_400_naming_them(
    client: openai.OpenAI, jfk: bytes, fields: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, jfk, model="tiny.en", extra_body=fields)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert e.value.body["message"] and e.value.body["type"] == "invalid_request_error"


def test_unknown_model_is_404(client: openai.OpenAI, jfk: bytes) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        transcribe(client, jfk, model="whisper-large-v9")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_undecodable_file_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, b"this is not audio" * 100)
    assert e.value.body["param"] == "file" and "cannot decode audio" in e.value.body["message"]


def test_model_aliases(client: openai.OpenAI, jfk: bytes) -> None:
    for name in ("Systran/faster-whisper-tiny.en", "openai/whisper-tiny.en", "tiny.en"):
        assert transcribe(client, jfk, model=name, extra_body={"beam_size": "1"}).text


def test_health(server: BackgroundServer) -> None:
    status, _, body = http("GET", f"http://{server.http_address}/health")
    assert status == 200 and json.loads(body) == {"status": "SERVING"}


def test_too_large_is_413(pipelines: tuple[Pipeline, ...], jfk: bytes) -> None:
    config = ServerConfig(port=0, http_port=0, max_message_mb=0.25)
    with BackgroundServer(config, pipelines[0]) as small:
        c = openai.OpenAI(base_url=f"http://{small.http_address}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            transcribe(c, jfk)  # 0.6 MB
        assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"
        config_long = ServerConfig(port=0, http_port=0, max_audio_seconds=5)
    with BackgroundServer(config_long, pipelines[0]) as short:
        c = openai.OpenAI(base_url=f"http://{short.http_address}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            transcribe(c, jfk)  # 11 s of audio
        assert e.value.status_code == 413 and e.value.body["code"] == "audio_too_long"


def test_bearer_tokens(pipelines: tuple[Pipeline, ...], jfk: bytes) -> None:
    config = ServerConfig(port=0, http_port=0, auth_tokens=("s3cret",))
    with BackgroundServer(config, pipelines[0]) as secured:
        base = f"http://{secured.http_address}/v1"
        for key in ("wrong", ""):
            c = openai.OpenAI(base_url=base, api_key=key or "-", max_retries=0)
            with pytest.raises(openai.AuthenticationError) as e:
                c.models.list()
            assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0)
        assert good.models.list().data[0].id == "tiny.en"
        assert transcribe(good, jfk, extra_body={"beam_size": "1"}).text == GREEDY_TEXT


def test_full_is_429_with_retry_after(pipelines: tuple[Pipeline, ...], jfk: bytes) -> None:
    """One worker, no queue: while a transcription is held in the model, the next is 429."""
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=0)
    with BackgroundServer(config, pipelines[0]) as full:
        pipe = full.engine.pipeline_for("")
        original, started, release = pipe.transcribe, threading.Event(), threading.Event()

        def held(audio: np.ndarray, options: object = None) -> Iterator[object]:
            started.set()
            assert release.wait(60)
            yield from original(audio, options)

        object.__setattr__(pipe, "transcribe", held)
        c = openai.OpenAI(base_url=f"http://{full.http_address}/v1", api_key="x", max_retries=0)
        first: list[object] = []
        worker = threading.Thread(target=lambda: first.append(transcribe(c, jfk)))
        worker.start()
        try:
            assert started.wait(60)
            with pytest.raises(openai.RateLimitError) as e:
                transcribe(c, jfk)
            assert e.value.status_code == 429 and int(e.value.response.headers["retry-after"]) >= 1
        finally:
            release.set()
            worker.join(120)
        assert first[0].text == JFK_TEXT  # the held one was served in the end


def test_cors_is_off_unless_allowed(server: BackgroundServer, pipelines: tuple) -> None:
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    url = f"http://{server.http_address}/v1/audio/transcriptions"
    _, headers, _ = http("OPTIONS", url, preflight)
    assert "access-control-allow-origin" not in headers
    config = ServerConfig(port=0, http_port=0, cors_origins=("http://app.example",))
    with BackgroundServer(config, pipelines[0]) as allowing:
        url = f"http://{allowing.http_address}/v1/audio/transcriptions"
        _, ok, _ = http("OPTIONS", url, {**preflight, "Origin": "http://app.example"})
        assert ok["access-control-allow-origin"] == "http://app.example"
        _, refused, _ = http("OPTIONS", url, preflight)
        assert "access-control-allow-origin" not in refused


def test_error_body_shape(server: BackgroundServer) -> None:
    url = f"http://{server.http_address}/v1/audio/transcriptions"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = http("POST", url, form, b"a=b")
    assert status == 400
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == "file"


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_client_that_goes_away_stops_the_work(server: BackgroundServer, jfk: bytes) -> None:
    """The stream's client reads one delta and closes: the run is cancelled (the worker,
    held before its first segment until then, stops instead of finishing)."""
    engine = server.engine
    pipe = engine.pipeline_for("tiny.en")
    original_transcribe, original_submit = pipe.transcribe, engine.submit
    runs: list[Run] = []
    release = threading.Event()

    def submit(*args: object, **kwargs: object) -> Run:
        runs.append(original_submit(*args, **kwargs))
        return runs[-1]

    def held(audio: np.ndarray, options: object = None) -> Iterator[object]:
        for event in original_transcribe(audio, options):
            if isinstance(event, Segment):
                assert release.wait(60)
            yield event

    before = engine.counters()
    object.__setattr__(pipe, "transcribe", held)
    engine.submit = submit  # type: ignore[method-assign]
    try:
        stream = transcribe(client_for(server), jfk, model="tiny.en", stream=True)
        for event in stream:
            assert event.type == "transcript.text.delta"
            break
        stream.close()  # the connection goes away mid-stream
        assert wait_for(lambda: runs[0].cancelled.is_set())  # the server saw it
    finally:
        release.set()
        object.__delattr__(pipe, "transcribe")
        del engine.submit
    assert wait_for(lambda: engine.counters().in_flight == before.in_flight)
    after = engine.counters()
    assert after.cancelled == before.cancelled + 1 and after.finished == before.finished


def client_for(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_address}/v1", api_key="x", max_retries=0)


def test_loading_is_503_with_retry_after(pipelines: tuple[Pipeline, ...], jfk: bytes) -> None:
    """Until the model is loaded, /health and the API answer 503 (the port is bound first)."""
    loaded = threading.Event()

    def slow_loader() -> Pipeline:
        assert loaded.wait(120)
        return pipelines[0]

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> Server:  # the grpc.aio server belongs to the loop it is made on
        made = Server(ServerConfig(port=0, http_port=0))
        made._loaders = lambda: [slow_loader]  # type: ignore[method-assign]
        await made.start()
        return made

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        base = f"http://127.0.0.1:{server.http_port}"
        status, _, body = http("GET", f"{base}/health")
        assert status == 503 and json.loads(body) == {"status": "NOT_SERVING"}
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            transcribe(c, jfk)
        assert e.value.status_code == 503 and e.value.body["code"] == "not_ready"
        assert int(e.value.response.headers["retry-after"]) >= 1
        loaded.set()
        asyncio.run_coroutine_threadsafe(server.wait_ready(), loop).result(120)
        assert http("GET", f"{base}/health")[0] == 200
        assert transcribe(c, jfk, extra_body={"beam_size": "1"}).text == GREEDY_TEXT
    finally:
        loaded.set()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
