"""Continuous batching in the engine (xattn.service.engine.engine): requests join the running batch
of decoder steps when their window is encoded and leave it when it ends, with exactly the
tokens (and, up to float rounding, the rows) they get alone; a cancelled request leaves at the
next step; a long file's windows interleave with a short request's; admission refuses when
the queue would keep a request waiting too long."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from contextlib import aclosing
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from conftest import native_threads

from xattn.model.audio.features import decode_audio
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent, Transcript, WindowStart
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.model.transcribe.sequential import Event
from xattn.service.engine import capacity
from xattn.service.engine.engine import Engine, Limits, Overloaded

GREEDY = DecodeOptions(return_attention=True)
BEAM = DecodeOptions(return_attention=True, beam_size=5, best_of=5)  # the server's default


@cache
def pipe() -> Pipeline:
    return load_pipeline("tiny.en")


@cache
def clips(jfk: Path) -> dict[str, np.ndarray]:
    audio = decode_audio(jfk)
    return {
        "long": np.concatenate([audio, np.zeros(8000, np.float32)] * 4),  # 46 s: 2 windows
        "jfk": audio,
        "head": audio[: 16000 * 6],
        "tail": audio[16000 * 3 :],
    }


def alone(name: str, audio: np.ndarray, options: DecodeOptions) -> list[TokenEvent]:
    return [e for e in pipe().transcribe(audio, options) if isinstance(e, TokenEvent)]


def engine(**limits: object) -> Engine:
    return Engine(Limits(decode_processes=0, **limits), pipe())  # type: ignore[arg-type]


async def consume(
    run_events: object, on_event: Callable[[Event], None] | None = None
) -> list[TokenEvent]:
    out = []
    async for e in run_events.events():  # type: ignore[attr-defined]
        if on_event is not None:
            on_event(e)
        if isinstance(e, TokenEvent):
            out.append(e)
    return out


def same(got: list[TokenEvent], want: list[TokenEvent]) -> None:
    assert [e.id for e in got] == [e.id for e in want]
    for g, w in zip(got, want, strict=True):
        assert g.window == w.window and g.temperature == w.temperature
        np.testing.assert_allclose(g.attention, w.attention, atol=1e-3, rtol=1e-4)


@pytest.mark.asyncio
@pytest.mark.parametrize("options", [GREEDY, BEAM], ids=["greedy", "beam5"])
async def test_requests_joining_and_leaving_a_running_batch_decode_as_alone(
    jfk_path: Path, options: DecodeOptions
) -> None:
    """`long` runs; `head` joins once long has tokens, `tail` once head has (head leaves
    before long ends): each gets the tokens it gets alone, and steps did run together."""
    audio = clips(jfk_path)
    want = {n: alone(n, audio[n], options) for n in ("long", "head", "tail")}
    eng = engine(workers=3)
    batcher = eng.pipeline.context.batcher
    assert batcher is not None
    started = {n: asyncio.Event() for n in ("long", "head")}

    def on(name: str) -> Callable[[Event], None]:
        return lambda e: started[name].set() if isinstance(e, TokenEvent) else None

    async def later(name: str, after: str) -> list[TokenEvent]:
        await started[after].wait()
        run = eng.submit(lambda: audio[name], options, lambda e: e)
        return await consume(run, on(name) if name in started else None)

    first = eng.submit(lambda: audio["long"], options, lambda e: e)
    got = await asyncio.gather(
        consume(first, on("long")), later("head", "long"), later("tail", "head")
    )
    await eng.close()
    for name, events in zip(("long", "head", "tail"), got, strict=True):
        same(events, want[name])
    assert batcher.stats.steps > batcher.stats.batches  # some batches held several decodes


@pytest.mark.asyncio
async def test_a_cancelled_request_leaves_the_batch_at_the_next_step(jfk_path: Path) -> None:
    """A greedy request (one row a step) is cancelled after its first token while a beam
    search (five rows a step) runs beside it: at most the step in flight follows, and the beam
    search still gets its own tokens."""
    audio = clips(jfk_path)
    want = alone("jfk", audio["jfk"], BEAM)
    eng = engine(workers=2)
    batcher = eng.pipeline.context.batcher
    assert batcher is not None
    single_row_steps = [0]
    run_batch = batcher._run

    def counting(batch: list) -> None:
        single_row_steps[0] += sum(not isinstance(s.token, list) for s in batch)
        run_batch(batch)

    batcher._run = counting  # type: ignore[method-assign]
    beam_started = asyncio.Event()
    seen_at_cancel = []

    async def greedy() -> None:
        await beam_started.wait()
        run = eng.submit(lambda: audio["long"], GREEDY, lambda e: e)
        async with aclosing(run.events()) as events:
            async for e in events:
                if isinstance(e, TokenEvent):
                    break
        seen_at_cancel.append(single_row_steps[0])  # closed: the run is cancelled

    def on(e: Event) -> None:
        if isinstance(e, TokenEvent):
            beam_started.set()

    beam = eng.submit(lambda: audio["jfk"], BEAM, lambda e: e)
    got, _ = await asyncio.gather(consume(beam, on), greedy())
    await eng.close()
    same(got, want)
    assert single_row_steps[0] - seen_at_cancel[0] <= 1
    assert len(alone("long", audio["long"], GREEDY)) > seen_at_cancel[0] + 10
    assert eng.counters().cancelled == 1 and eng.counters().finished == 1


@pytest.mark.asyncio
async def test_a_request_whose_transcript_was_handed_over_counts_as_finished(
    jfk_path: Path,
) -> None:
    """The client hangs up as soon as it has the transcript (the last event), before the
    worker comes back for the generator's end: the request was served, so it counts as
    finished, not cancelled (the worker is held right after handing the transcript over
    until the consumer has gone)."""
    audio = clips(jfk_path)
    eng = engine(workers=1)
    run = eng.submit(lambda: audio["head"], GREEDY, lambda e: e)
    hand_over = run.put

    def put(item: object) -> None:
        hand_over(item)
        if isinstance(item, Transcript):
            assert run.cancelled.wait(60)  # the consumer below has closed its events

    run.put = put  # type: ignore[method-assign]
    async with aclosing(run.events()) as events:
        async for e in events:
            if isinstance(e, Transcript):
                break
    await eng.close()
    assert (eng.counters().finished, eng.counters().cancelled) == (1, 0)


@pytest.mark.asyncio
async def test_a_long_files_windows_interleave_with_a_short_request(jfk_path: Path) -> None:
    """A short request sent once a 4-window file has begun is done before the file's last
    window starts: their windows take turns on the model thread."""
    audio = clips(jfk_path)
    long = np.concatenate([audio["long"], audio["long"]])  # 92 s: 4 windows
    eng = engine(workers=2)
    order: list[tuple[str, str]] = []
    lock = threading.Lock()
    began = asyncio.Event()
    loop = asyncio.get_running_loop()

    def shape(name: str) -> Callable[[Event], Event]:
        def record(e: Event) -> Event:
            with lock:
                order.append((name, type(e).__name__))
            if name == "long" and isinstance(e, WindowStart):
                loop.call_soon_threadsafe(began.set)
            return e

        return record

    async def short() -> None:
        await began.wait()
        run = eng.submit(lambda: audio["head"], GREEDY, shape("short"))
        await consume(run)
        with lock:
            order.append(("short", "done"))

    file = eng.submit(lambda: long, GREEDY, shape("long"))
    await asyncio.gather(consume(file), short())
    await eng.close()
    windows = [i for i, (n, kind) in enumerate(order) if (n, kind) == ("long", "WindowStart")]
    assert len(windows) == 4
    assert order.index(("short", "done")) < windows[-1]
    assert eng.counters().windows == sum(kind == "WindowStart" for _, kind in order)


@pytest.mark.asyncio
async def test_admission_refuses_when_the_queue_would_wait_too_long(jfk_path: Path) -> None:
    """One worker, held busy; a 3-window file queued behind it; the next request would wait
    three windows' model time, over the bound: refused with a retry hint, and the server
    goes on (both queued and running finish)."""
    audio = clips(jfk_path)
    eng = engine(workers=1, max_queue=8, max_queue_wait=0.5)
    eng._models[eng.pipeline.name].estimate.seconds_per_window = 0.3  # 3 windows: 0.9 s
    gate = threading.Event()
    first_token = asyncio.Event()
    loop = asyncio.get_running_loop()

    def held(e: Event) -> Event:
        if isinstance(e, TokenEvent):
            loop.call_soon_threadsafe(first_token.set)
            gate.wait()
        return e

    running = eng.submit(lambda: audio["head"], GREEDY, held)
    running_task = asyncio.create_task(consume(running))
    await first_token.wait()
    three = np.concatenate([audio["long"], audio["jfk"], audio["jfk"]])  # 68 s: 3 windows
    queued = eng.submit(lambda: three, GREEDY, lambda e: e)
    queued_task = asyncio.create_task(consume(queued))
    while eng.counters().queued == 0:  # its audio decoded and in the queue
        await asyncio.sleep(0.01)
    with pytest.raises(Overloaded) as refused:
        eng.submit(lambda: audio["head"], GREEDY, lambda e: e)
    assert "would keep this one waiting about 1 s" in str(refused.value)
    assert refused.value.retry_after_ms >= 100
    gate.set()
    await asyncio.gather(running_task, queued_task)
    c = eng.counters()
    await eng.close()
    assert (c.rejected, c.finished, c.in_flight) == (1, 2, 0)


@pytest.mark.asyncio
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc (Linux)")
async def test_decode_and_live_threads_bring_no_openmp_team_of_their_own(jfk_path: Path) -> None:
    """Torch ops that run in parallel on a worker thread start an OpenMP team for that thread;
    with more teams than cores, libgomp stops spinning and every op of the model thread pays
    for waking its threads. Requests (greedy; beam 5 with word timestamps) and a live stream
    decoded at once leave the process with the native threads it had after one request."""
    audio = clips(jfk_path)
    eng = engine(workers=3)
    await consume(eng.submit(lambda: audio["head"], GREEDY, lambda e: e))  # the model's team
    before = native_threads()
    words = DecodeOptions(beam_size=5, best_of=5, word_timestamps=True)
    loop = asyncio.get_running_loop()
    live = loop.run_in_executor(eng.live_pool, live_words, eng.pipeline, audio["jfk"])
    runs = [eng.submit(lambda n=n: audio[n], o, lambda e: e) for n, o in
            (("jfk", GREEDY), ("tail", words), ("long", GREEDY))]  # fmt: skip
    await asyncio.gather(*(consume(r) for r in runs))
    assert await live > 5
    after = native_threads()
    await eng.close()
    assert after == before


def live_words(pipeline: Pipeline, audio: np.ndarray) -> int:
    """Words of the finals of `audio` fed live in 0.5 s pieces (on the calling thread)."""
    live = LiveTranscriber(pipeline.context, pipeline.alignment_heads, LiveOptions())
    results = [r for i in range(0, len(audio), 8000) for r in live.feed(audio[i : i + 8000])]
    return sum(len(r.words) for r in [*results, *live.finish()] if r.is_final)


def test_workers_fit_the_memory_budget() -> None:
    dims = pipe().dims
    clip = capacity.request_bytes(dims, 30.0)
    assert 45 * capacity.MB < clip.total < 60 * capacity.MB  # tiny.en, beam 5, 30 s
    long = capacity.request_bytes(dims, 1800.0).total
    assert capacity.auto_workers(dims, 1800.0, budget=4 * long) == 4
    assert capacity.auto_workers(dims, 1800.0, budget=long // 2) == 1
    assert capacity.auto_workers(dims, 30.0, budget=1 << 40) == capacity.MAX_WORKERS
    assert capacity.auto_workers(dims, 30.0, budget=1 << 40, cap=3) == 3
    assert capacity.windows_of(0) == 1 and capacity.windows_of(16000 * 61) == 3


def test_the_wait_estimate_follows_the_model_time_per_window() -> None:
    w = capacity.WaitEstimate(1.0)
    w.update(busy=2.0, windows=10)  # 0.2 s a window since the start
    assert w.seconds_per_window == pytest.approx(0.7 + 0.3 * 0.2)
    w.update(busy=2.0, windows=10)  # nothing new: unchanged
    assert w.seconds_per_window == pytest.approx(0.76)
    assert w.wait(5) == pytest.approx(3.8)


@pytest.mark.asyncio
async def test_the_memory_budget_holds_back_a_request_that_does_not_fit(jfk_path: Path) -> None:
    """Two workers, and a budget that holds one 46 s greedy transcription (~32 MB) but not
    two: the second starts once the first has left its worker."""
    audio = clips(jfk_path)["long"]
    each = capacity.request_bytes(pipe().dims, len(audio) / 16000, rows=1).total
    eng = engine(workers=2, memory_budget_mb=1.5 * each / capacity.MB)
    order: list[tuple[str, str]] = []
    lock = threading.Lock()

    def shape(name: str) -> Callable[[Event], Event]:
        def record(e: Event) -> Event:
            with lock:
                order.append((name, type(e).__name__))
            return e

        return record

    runs = [eng.submit(lambda: audio, GREEDY, shape(n)) for n in ("a", "b")]
    await asyncio.gather(*(consume(r) for r in runs))
    await eng.close()
    first = order[0][0]
    last_of_first = max(i for i, (n, _) in enumerate(order) if n == first)
    assert min(i for i, (n, _) in enumerate(order) if n != first) > last_of_first
