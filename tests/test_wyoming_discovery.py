"""Zeroconf discovery of the Wyoming face (service/wyoming/discovery.py): the server started
with `wyoming_zeroconf` announces `_wyoming._tcp` with its port, and a zeroconf client (as
Home Assistant's) resolves it. Everything stays on loopback: the announcement of a server
bound to 127.0.0.1 goes out on the loopback interface only, and so does the client's query."""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import pytest
from openai_ref import pipeline
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.service.wyoming.discovery import SERVICE_TYPE, announcement, lan_address


async def resolve(name: str) -> AsyncServiceInfo | None:
    """The service `name` as a zeroconf client on loopback finds it (None: not found)."""
    zc = AsyncZeroconf(interfaces=["127.0.0.1"])
    try:
        info = AsyncServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}")
        return info if await info.async_request(zc.zeroconf, 5000) else None
    finally:
        await zc.async_close()


def test_the_server_announces_its_wyoming_port(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="xattn.service.wyoming")
    config = ServerConfig(port=0, wyoming_port=0, wyoming_zeroconf="xattn-test", workers=1)
    with BackgroundServer(config, pipeline("tiny.en")) as bg:
        info = asyncio.run(resolve("xattn-test"))
        assert info is not None, "not announced"
        assert info.port == bg.server.wyoming_port
        assert info.parsed_addresses() == ["127.0.0.1"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("only this machine can reach" in m for m in warned), warned


def test_what_each_host_announces() -> None:
    local = announcement("kitchen", "127.0.0.1", 10300)
    assert (local.address, local.every_interface) == ("127.0.0.1", False)
    assert local.service == "kitchen._wyoming._tcp.local."
    try:
        lan = lan_address()
    except OSError:
        pytest.skip("no route to the mDNS group: no LAN address to announce")
    every = announcement("kitchen", "0.0.0.0", 10300)
    assert (every.address, every.every_interface, every.port) == (lan, True, 10300)
    assert ipaddress.ip_address(every.address).version == 4
