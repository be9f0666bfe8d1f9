"""Every face against hostile clients (tests/hostile.py), on a real server on loopback with
short deadlines: each connection is closed within its deadline (plus a wide slack: a busy
2-core machine), gets the error its protocol has (a 408, an `error` event, a close frame),
leaves no ERROR, WARNING or traceback in the log (a hang-up is INFO or DEBUG), and a valid
request on the same face is answered while it misbehaves. Synchronised on the server's
answers and on the sockets' closes, never on sleeps."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest
from hostile import HOST, RECIPES, VALID, Seen, ws_close_code, ws_events, wyoming_events
from openai_ref import pipeline

from xattn.service.background import BackgroundServer
from xattn.service.engine.live import live_settings
from xattn.service.server import ServerConfig
from xattn.service.wyoming.handler import WyomingSettings
from xattn.service.wyoming.server import WyomingServer, bind

HEADER, IDLE, BODY, LIVE_IDLE = 1.0, 1.5, 1.0, 1.0  # the server's deadlines here (s)
SLACK = 15.0  # seconds past a deadline a close may take on a loaded machine


@pytest.fixture(scope="module")
def bg() -> Iterator[BackgroundServer]:
    config = ServerConfig(
        port=0,
        http_port=0,
        wyoming_port=0,
        header_timeout=HEADER,
        idle_timeout=IDLE,
        http_body_timeout=BODY,
        live_idle_timeout=LIVE_IDLE,
    )
    with BackgroundServer(config, pipeline("tiny.en")) as server:
        yield server


def ports(bg: BackgroundServer) -> dict[str, int]:
    s = bg.server
    return {"http": s.http_port, "realtime": s.http_port, "grpc": s.port, "wyoming": s.wyoming_port}


# --- what each recipe must see ---
def _json_body(seen: Seen) -> dict:
    return dict(json.loads(seen.data.split(b"\r\n\r\n", 1)[1]))


def _error_codes(seen: Seen) -> list[str]:
    return [e["error"]["code"] for e in ws_events(seen) if e["type"] == "error"]


def _wyoming_codes(seen: Seen) -> list[str]:
    return [e["data"].get("code") for e in wyoming_events(seen) if e["type"] == "error"]


def _nothing(seen: Seen) -> None:
    assert seen.data == b"", seen.data[:200]


def _http_408(code: str) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert seen.status == 408, seen.data[:200]
        assert b"connection: close" in seen.data.lower()
        assert _json_body(seen)["error"]["code"] == code

    return check


def _http_400(seen: Seen) -> None:
    assert seen.status == 400, seen.data[:200]


def _ws(code: str, close: int) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert _error_codes(seen) == [code], ws_events(seen)
        assert ws_close_code(seen) == close

    return check


def _wyoming(*codes: str) -> Callable[[Seen], None]:
    def check(seen: Seen) -> None:
        assert _wyoming_codes(seen) == list(codes), wyoming_events(seen)

    return check


def _any(seen: Seen) -> None:
    pass  # gRPC: the core's own GOAWAY / close; what matters is that it closes


# recipe -> (the deadline that closes it: None for the client's own hang-up, its check, the
# log line the server writes for it (INFO or DEBUG), if any)
EXPECT: dict[tuple[str, str], tuple[float | None, Callable[[Seen], None], str | None]] = {
    ("http", "nothing"): (HEADER, _nothing, None),
    ("http", "partial_request_line"): (HEADER, _http_408("deadline_exceeded"), "half a request"),
    ("http", "half_headers"): (HEADER, _http_408("deadline_exceeded"), "half a request"),
    ("http", "stalled_body"): (BODY, _http_408("upload_timeout"), None),
    ("http", "broken_body"): (0.0, _http_400, "broken request"),
    ("http", "hang_up_mid_body"): (None, _nothing, "hung up"),
    ("http", "idle_keep_alive"): (IDLE, _nothing, None),
    ("realtime", "binary_frame"): (0.0, _ws("invalid_argument", 1003), "binary frame"),
    ("realtime", "idle"): (IDLE, _ws("deadline_exceeded", 1008), "no event for"),
    ("realtime", "hang_up"): (None, _nothing, "closed by the client"),
    ("grpc", "no_preface"): (HEADER, _any, None),
    ("grpc", "half_preface"): (HEADER, _any, None),
    ("grpc", "garbage"): (0.0, _any, None),
    ("grpc", "idle"): (HEADER, _any, None),  # SETTINGS never acknowledged (or idle)
    ("grpc", "half_message"): (HEADER, _any, None),
    ("grpc", "hang_up"): (None, _nothing, None),
    ("wyoming", "nothing"): (LIVE_IDLE, _wyoming("deadline_exceeded"), None),
    ("wyoming", "half_line"): (LIVE_IDLE, _wyoming("deadline_exceeded"), None),
    ("wyoming", "not_json"): (0.0, _wyoming("invalid_argument"), None),
    ("wyoming", "bad_event"): (0.0, _wyoming("invalid_argument"), None),
    ("wyoming", "audio_before_start"): (
        LIVE_IDLE, _wyoming("invalid_argument", "deadline_exceeded"), None,
    ),
    ("wyoming", "drop_after_start"): (None, _nothing, "hung up"),
}  # fmt: skip


def test_every_recipe_has_an_expectation() -> None:
    assert set(EXPECT) == {(f, r) for f, recipes in RECIPES.items() for r in recipes}


def _wait_for_record(caplog: pytest.LogCaptureFixture, text: str, timeout: float) -> None:
    """Until the server (another thread) has logged `text` (the hang-up is seen there)."""
    deadline = time.monotonic() + timeout
    while not any(text in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.02)


@pytest.mark.parametrize("face,recipe", sorted(EXPECT))
def test_hostile_client(
    bg: BackgroundServer, caplog: pytest.LogCaptureFixture, face: str, recipe: str
) -> None:
    caplog.set_level(logging.DEBUG)
    deadline, check, logged = EXPECT[face, recipe]
    port = ports(bg)[face]
    wait = (deadline or 0.0) + SLACK

    async def run() -> tuple[Seen, bool, bool]:
        misbehave = asyncio.ensure_future(RECIPES[face][recipe](HOST, port, wait))
        during = await VALID[face](port)  # while the hostile connection is open
        seen = await misbehave
        after = await VALID[face](port)
        return seen, during, after

    seen, during, after = asyncio.run(run())
    assert seen.closed, f"{face}/{recipe}: still open after {seen.seconds:.1f} s"
    check(seen)
    assert during and after
    if logged is not None:
        _wait_for_record(caplog, logged, SLACK)
    # nothing it started stays admitted (a dropped stream once held its live slot for good)
    asyncio.run(_until(lambda: bg.engine.counters().in_flight == 0))
    bad = [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING or r.exc_info
    ]
    assert not bad, bad
    for r in caplog.records:
        if logged is not None and logged in r.getMessage():
            assert r.levelno <= logging.INFO


def test_the_deadlines_are_flags_and_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from xattn.service.__main__ import config_from_args, parse_args

    monkeypatch.setenv("XATTN_IDLE_TIMEOUT", "12.5")
    config = config_from_args(parse_args(["--header-timeout", "3", "--http-body-timeout", "4"]))
    assert (config.header_timeout, config.idle_timeout, config.http_body_timeout) == (3, 12.5, 4)
    defaults = config_from_args(parse_args([]))
    assert (defaults.header_timeout, defaults.http_body_timeout) == (20.0, 30.0)
    with pytest.raises(SystemExit):
        parse_args(["--header-timeout", "0"])


def test_silent_wyoming_connections_make_room_for_one_that_speaks(bg: BackgroundServer) -> None:
    """A face of 3 connections held by 3 that send nothing: a client that connects and
    speaks is served, the oldest silent one gets server_busy and is closed; one that has
    spoken is never closed for another."""

    async def start() -> WyomingServer:
        live = live_settings(bg.engine.limits)  # idle far off: only eviction closes them
        settings = WyomingSettings(idle_timeout=600.0, max_connections=3, live=live)
        server = WyomingServer(bg.engine, settings, bind(HOST, 0))
        await server.start()
        return server

    server = bg.call(start())

    async def run() -> tuple[list[Seen], bool, bool]:
        silent: list[asyncio.Future[Seen]] = []
        wait = 8 * SLACK  # a bound: each returns at its eviction (the idle close is far later)

        async def fill() -> None:  # silent connections until the face is full
            while server.connections < 3:
                recipe = RECIPES["wyoming"]["nothing"](HOST, server.port, wait)
                silent.append(asyncio.ensure_future(recipe))
                await _until(partial(_counted, server, server.connections + 1))

        await fill()
        valid = await VALID["wyoming"](server.port)  # takes the oldest silent one's place
        first = await silent[0]
        await _until(lambda: server.connections == 2)  # the valid one's handler is gone
        await fill()  # full again, of silent ones only
        again = await VALID["wyoming"](server.port)  # takes the next oldest one's place
        second = await silent[1]
        for rest in silent[2:]:
            rest.cancel()
        return [first, second], valid, again

    try:
        (first, second), valid, again = asyncio.run(run())
    finally:
        bg.call(server.stop())
    assert valid and again
    assert first.closed and second.closed
    assert _wyoming_codes(first) == ["server_busy"] == _wyoming_codes(second)


def _counted(server: WyomingServer, count: int) -> bool:
    """The face counts `count` connections (each counted before the next opens)."""
    return server.connections == count


async def _until(condition: Callable[[], bool], timeout: float = SLACK) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def test_many_dropped_wyoming_streams_release_their_slots(bg: BackgroundServer) -> None:
    """Ten clients send audio-start and drop at once: none of their live streams stays
    admitted (a server process with the default deadlines once kept 19 of 20 for good)."""
    port = ports(bg)["wyoming"]

    async def run() -> None:
        drops = [RECIPES["wyoming"]["drop_after_start"](HOST, port, SLACK) for _ in range(10)]
        await asyncio.gather(*drops)
        await _until(lambda: bg.engine.counters().in_flight == 0)

    asyncio.run(run())
