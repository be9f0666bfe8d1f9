"""The model thread's order (xattn.model.decode.model_thread.TurnThread): first come, first
served; a turn's calls before the work that came after the turn began, the thread holding for
the turn between its calls (for at most its hold); and a live step that takes its audio once
its turn has come. Each test orders events with events, never with sleeps: a piece of work
that must wait is held on the model thread until the work it waits for is queued."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from xattn.model.audio.features import decode_audio
from xattn.model.decode.model_thread import TurnThread
from xattn.model.decode.step_batcher import StepBatcher
from xattn.model.live.transcriber import LiveTranscriber
from xattn.model.live.types import LiveOptions
from xattn.model.pipeline import load_pipeline

WAIT = 60.0  # seconds any one event may take on a busy machine before the test fails


def blocker(thread: TurnThread, log: list[str], queued: int) -> Callable[[], None]:
    """Work that holds the model thread until `queued` pieces of work wait behind it."""

    def hold() -> None:
        with thread._cond:
            assert thread._cond.wait_for(lambda: len(thread._heap) >= queued, WAIT)
        log.append("blocker")

    return hold


def test_work_runs_first_come_first_served() -> None:
    thread, log = TurnThread(), []
    futures = [thread.submit(log.append, name) for name in ("a", "b", "c")]
    for f in futures:
        f.result(WAIT)
    assert log == ["a", "b", "c"]
    thread.shutdown()


def test_a_turn_goes_before_work_that_came_after_it_began_and_the_thread_holds_for_it() -> None:
    """The turn's second call is submitted while newer work already waits: it still runs
    first, because the thread holds for the open turn between its calls."""
    thread, log = TurnThread(hold=WAIT), []
    thread.submit(blocker(thread, log, queued=2))
    began, newer_queued = threading.Event(), threading.Event()

    def live() -> None:
        with thread.turn():
            began.set()
            thread.submit(log.append, "turn 1").result(WAIT)
            assert newer_queued.wait(WAIT)
            thread.submit(log.append, "turn 2").result(WAIT)

    turn = threading.Thread(target=live)
    turn.start()
    assert began.wait(WAIT)
    newer = thread.submit(log.append, "newer")  # after the turn began
    newer_queued.set()
    newer.result(WAIT)
    turn.join(WAIT)
    assert log == ["blocker", "turn 1", "turn 2", "newer"]
    thread.shutdown()


def test_the_hold_is_bounded() -> None:
    """With no hold, work that came after the turn began runs while the turn's thread is
    between calls (here it waits for that work itself: held for, it would not come)."""
    thread, log = TurnThread(hold=0.0), []
    first_done, newer_ran = threading.Event(), threading.Event()

    def live() -> None:
        with thread.turn():
            thread.submit(log.append, "turn 1").result(WAIT)
            first_done.set()
            assert newer_ran.wait(WAIT)
            thread.submit(log.append, "turn 2").result(WAIT)

    turn = threading.Thread(target=live)
    turn.start()
    assert first_done.wait(WAIT)
    thread.submit(lambda: (log.append("newer"), newer_ran.set())).result(WAIT)
    turn.join(WAIT)
    assert log == ["turn 1", "newer", "turn 2"]
    thread.shutdown()


def test_a_failure_reaches_its_caller_and_the_thread_goes_on() -> None:
    thread = TurnThread()
    with pytest.raises(ZeroDivisionError):
        thread.submit(lambda: 1 / 0).result(WAIT)
    assert thread.submit(lambda: 2).result(WAIT) == 2
    thread.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        thread.submit(lambda: 3)


def test_a_live_step_takes_its_audio_once_the_work_before_it_has_run(jfk_path: Path) -> None:
    """A live step queued behind other work (another stream's encoder pass) reads the audio
    when its turn comes, so it decodes what arrived while it waited."""
    pipe = load_pipeline("tiny.en")
    thread, log = TurnThread(hold=WAIT), []
    batcher = StepBatcher(pipe.model, thread=thread)
    ctx = dataclasses.replace(pipe.context, batcher=batcher)
    live = LiveTranscriber(ctx, pipe.alignment_heads, LiveOptions(language="en"))
    audio = decode_audio(jfk_path)[: 16000 * 3]
    thread.submit(blocker(thread, log, queued=1))  # the step's wait for its turn

    def take() -> np.ndarray:
        log.append("take")
        return audio

    results = live.feed_in_turn(take)
    assert log == ["blocker", "take"]
    assert live.stats.steps == 1 and results is not None  # it decoded the 3 s it took
    batcher.close()


def test_a_shared_turn_interleaves_its_threads_and_holds_off_newer_work() -> None:
    """A round: two threads in one turn (`new_key`, `turn(key)`): each one's calls run
    while the other is between its own (no hold between them), work submitted after the
    round began waits for both, and the turn closes when the last one leaves."""
    thread, log = TurnThread(hold=WAIT), []
    thread.submit(blocker(thread, log, queued=2))  # until "a 1" and "newer" wait
    key = thread.new_key()
    inside = threading.Barrier(2)
    a_ran, newer_queued = threading.Event(), threading.Event()

    def member(name: str) -> None:
        with thread.turn(key) as mine:
            assert mine == key
            inside.wait(WAIT)
            if name == "b":
                assert a_ran.wait(WAIT)  # a's call ran while b was in the turn, idle
                assert newer_queued.wait(WAIT)
            thread.submit(log.append, f"{name} 1").result(WAIT)
            if name == "a":
                a_ran.set()
                assert newer_queued.wait(WAIT)
            thread.submit(log.append, f"{name} 2").result(WAIT)

    members = [threading.Thread(target=member, args=(n,)) for n in ("a", "b")]
    for m in members:
        m.start()
    with thread._cond:
        assert thread._cond.wait_for(lambda: thread._members.get(key) == 2, WAIT)
    newer = thread.submit(log.append, "newer")  # after the round began
    newer_queued.set()
    newer.result(WAIT)
    for m in members:
        m.join(WAIT)
    assert log[0] == "blocker" and log[-1] == "newer"
    assert log.index("a 1") < log.index("b 1") and {"a 2", "b 2"} <= set(log)
    assert key not in thread._open and key not in thread._members
    thread.shutdown()


def test_the_batcher_tells_turn_work_apart() -> None:
    """Model time of work in turns (live steps) is counted apart (`turn_busy`), so the
    file path's wait estimate can leave it out."""
    pipe = load_pipeline("tiny.en")
    batcher = StepBatcher(pipe.model)
    try:
        batcher.call(lambda: sum(range(200_000)))
        assert batcher.stats.busy > 0 and batcher.stats.turn_busy == 0
        before = batcher.stats.busy
        with batcher.turn():
            batcher.call(lambda: sum(range(200_000)))
        in_turn = batcher.stats.busy - before
        assert 0 < batcher.stats.turn_busy <= in_turn
    finally:
        batcher.close()
