"""A one-off look at the LAN: which peerd nodes advertise, of any fleet (``peerd join --lan``).

Invariants:
- Browses ``_peerd._tcp.local.`` without advertising anything, and returns
  every advert that decodes and resolves to an IPv4 address, whatever its fleet.
- Asks for multicast answers only (QM): a daemon on this machine shares UDP
  5353 with the scan, and a unicast answer would reach only one of the two.
- Ends after ``window`` seconds, or earlier: ``settle`` seconds after the last
  new advert once ``enough`` of them are in. Always closes its sockets.
- Never raises for network conditions: no usable mDNS means an empty result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from ipaddress import ip_address

from zeroconf import DNSQuestionType, IPVersion, ServiceStateChange, Zeroconf
from zeroconf import InterfaceChoice as ZcInterfaceChoice
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from discovery.advert import SERVICE_TYPE, decode_txt, pick_host
from discovery.netif import read_local_addresses
from discovery.source import AdvertError, PeerCandidate, Sighting

__all__ = ["scan"]

log = logging.getLogger("discovery.scan")


async def scan(*, window: float, settle: float = 0.5, enough: int = 1, resolve_timeout: float = 2.0) -> list[Sighting]:
    """Every peerd advert seen within ``window`` s (see the module docstring), by node id."""
    try:
        zc = AsyncZeroconf(interfaces=ZcInterfaceChoice.All, ip_version=IPVersion.V4Only)
    except (OSError, RuntimeError) as exc:
        log.warning("cannot browse mDNS: %s", exc)
        return []
    networks = [a.network for a in read_local_addresses() if not a.loopback]
    seen: dict[str, Sighting] = {}
    news = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def resolve(name: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if not await info.async_request(zc.zeroconf, int(resolve_timeout * 1000), question_type=DNSQuestionType.QM):
            return
        try:
            advert = decode_txt(info.properties)
        except AdvertError:
            return
        addresses = tuple(sorted(info.parsed_addresses(IPVersion.V4Only), key=ip_address))
        if addresses:
            cand = PeerCandidate(pick_host(addresses, networks), advert.port, "mdns", advert.node_id, addresses)
            seen[advert.node_id] = Sighting(cand, advert.fleet_id, advert.name)
            news.set()

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        del zeroconf, service_type
        if state_change is not ServiceStateChange.Removed:
            task = asyncio.get_running_loop().create_task(resolve(name))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    browser = AsyncServiceBrowser(zc.zeroconf, SERVICE_TYPE, handlers=[on_change], question_type=DNSQuestionType.QM)
    try:
        await _collect(news, seen, window, settle, enough)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await browser.async_cancel()
        with contextlib.suppress(OSError):
            await zc.async_close()
    return list(seen.values())


async def _collect(news: asyncio.Event, seen: dict[str, Sighting], window: float, settle: float, enough: int) -> None:
    """Wait for adverts: until the window closes, or ``settle`` quiet seconds once ``enough`` are in."""
    loop = asyncio.get_running_loop()
    end = loop.time() + window
    while (left := end - loop.time()) > 0:
        quiet = len(seen) >= enough
        news.clear()
        try:
            async with asyncio.timeout(min(left, settle) if quiet else left):
                await news.wait()
        except TimeoutError:
            if quiet:
                return
