"""Zeroconf (mDNS) discovery: the Wyoming port announced as `_wyoming._tcp`, the way Home
Assistant finds Wyoming servers (its Wyoming integration then offers to add the server).

The announced address is the one the face listens on; a server bound to every address
(0.0.0.0) announces this machine's LAN address (the interface that routes to the mDNS group)
on every interface. A loopback address is announced on loopback only: nothing else could
reach it (a warning says so).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass

from zeroconf import InterfaceChoice
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"
ANY = ("", "0.0.0.0", "::")


def lan_address() -> str:
    """This machine's address on the interface that routes to the mDNS group (a UDP socket's
    connect chooses it; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((MDNS_GROUP, 5353))
        return str(s.getsockname()[0])


@dataclass(frozen=True)
class Announcement:
    name: str  # the instance name Home Assistant shows
    address: str
    port: int
    every_interface: bool  # False: only the interface of `address`

    @property
    def service(self) -> str:
        return f"{self.name}.{SERVICE_TYPE}"

    def info(self) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self.service,
            addresses=[ipaddress.ip_address(self.address).packed],
            port=self.port,
            server=f"{self.name}.local.",
        )


def announcement(name: str, host: str, port: int) -> Announcement:
    """What a face listening on host:port announces (`host` as --host gives it)."""
    if host in ANY:
        return Announcement(name, lan_address(), port, every_interface=True)
    address = socket.gethostbyname(host) if not _is_ip(host) else host
    if ipaddress.ip_address(address).is_loopback:
        log.warning(
            "zeroconf announces %s:%d, which only this machine can reach: serve on the LAN "
            "(--host 0.0.0.0 or this machine's LAN address) for a Home Assistant elsewhere",
            address,
            port,
        )
    return Announcement(name, address, port, every_interface=False)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Discovery:
    """`start()` registers the service; `stop()` says goodbye and closes the sockets."""

    def __init__(self, announcement: Announcement) -> None:
        self.announcement = announcement
        interfaces = InterfaceChoice.All if announcement.every_interface else [announcement.address]
        self._zc = AsyncZeroconf(interfaces=interfaces)
        self._info = announcement.info()

    async def start(self) -> None:
        await self._zc.async_register_service(self._info)
        a = self.announcement
        log.info("zeroconf: %s at %s:%d", a.service, a.address, a.port)

    async def stop(self) -> None:
        try:
            await self._zc.async_unregister_service(self._info)
        finally:
            await self._zc.async_close()
