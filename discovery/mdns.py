"""mDNS discovery on the local network with python-zeroconf's asyncio API.

Invariants:
- Advertises ``peerd-<node id>._peerd._tcp.local.`` with the TXT fields of
  ``discovery.advert``; browses the same type and hands what it resolves to
  ``discovery.lanview.LanView``, which decides what each advert means (a peer
  of our fleet for ``found``, another fleet for ``other``, no version in
  common for ``other_version``) and whom to tell.
- Browsing starts before our own registration (which probes the network for
  about 1.2 s), so peers already on the LAN are found in a fraction of that.
- Never raises for network conditions: a port-5353 conflict, no usable
  interface or no multicast route makes the source *inactive* with exactly
  one warning on logger ``discovery.mdns``; it keeps checking (cheaply,
  every ``poll_interval`` seconds) and becomes active once the cause is gone.
- The interface addresses are polled every ``poll_interval`` seconds; a
  change re-announces the advert with the new addresses. Known peers are
  re-read from the mDNS cache at the same pace, so a peer's changed address
  set is handed over again (``found``) within about one poll.
- ``set_fleet`` changes the advertised fleet id (a key rotation) and
  re-judges every advert in view, those of other fleets included.
- ``stop`` sends goodbye packets (TTL 0) so peers drop this node within
  about a second. A node that vanished without goodbye is reported ``gone``
  only when its PTR record expires (about 20 minutes); liveness is the
  daemon's business (failed connections), not discovery's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from zeroconf import (
    InterfaceChoice as ZcInterfaceChoice,
)
from zeroconf import (
    IPVersion,
    NonUniqueNameException,
    NotRunningException,
    ServiceStateChange,
    Zeroconf,
)
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from discovery.advert import SERVICE_TYPE, Advert, encode_txt, instance_label
from discovery.lanview import LanView
from discovery.netif import (
    InterfaceChoice,
    LocalAddress,
    check_interfaces,
    default_multicast_source,
    one_per_device,
    probe_mdns_port,
    read_local_addresses,
    select_addresses,
)
from discovery.source import FoundCallback, GoneCallback, SightingCallback

__all__ = ["MdnsSource"]

log = logging.getLogger("discovery.mdns")

_SEEDS_ONLY = "peers are found through seeds only"
# Address and SRV records: the RFC 6762 default. PTR/TXT: python-zeroconf raises any
# received PTR TTL below 1125 s to 1125 s, so that is the shortest lifetime that counts.
_HOST_TTL = 120
_SERVICE_TTL = 1125
_ACTIVATION_RETRY = 60.0  # seconds between retries after zeroconf failed to open its sockets


@dataclass(frozen=True)
class _Plan:
    """Addresses to advertise, and the one-per-link addresses to open sockets on."""

    advertised: tuple[str, ...]
    sockets: tuple[str, ...]


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())


class MdnsSource:
    """A ``DiscoverySource`` that advertises this node and finds fleet peers by mDNS.

    ``interfaces``: ``"all"`` (every up, multicast-capable IPv4 interface),
    ``"default"`` (the interface the multicast route points at) or a list of
    interface names / IPv4 addresses.
    """

    def __init__(
        self,
        node_id: str,
        fleet_id: str,
        port: int,
        protocol_versions: Sequence[int],
        interfaces: InterfaceChoice = "all",
        *,
        poll_interval: float = 5.0,
        resolve_timeout: float = 3.0,
        name: str | None = None,
        also: Sequence[str] = (),
        other: SightingCallback | None = None,
        other_gone: GoneCallback | None = None,
        other_version: FoundCallback | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        if not protocol_versions:
            raise ValueError("protocol_versions must name at least one version")
        self._advert = Advert(node_id, fleet_id, min(protocol_versions), port, name,
                              tuple(sorted(set(protocol_versions))))
        self._view = LanView(self._advert, also, other=other, other_gone=other_gone, other_version=other_version)
        self._txt = encode_txt(self._advert)  # AdvertError (a ValueError) on bad values
        label = instance_label(node_id)
        self._name = f"{label}.{SERVICE_TYPE}"
        self._server = f"{label}.local."
        self._interfaces = check_interfaces(interfaces)
        self._poll_interval = poll_interval
        self._resolve_timeout_ms = int(resolve_timeout * 1000)

        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._announced = asyncio.Event()  # set once our advert is registered and announced
        self._plan = _Plan((), ())
        self._local_networks: tuple[str, ...] = ()
        self._problem: str | None = "not started"
        self._logged_problem: str | None = None
        self._logged_unmatched: tuple[str, ...] = ()
        self._failed_activation: tuple[_Plan, float] | None = None
        self._register_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._resolve_tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False

    # -- public state -------------------------------------------------------

    @property
    def active(self) -> bool:
        """True while mDNS sockets are open and browsing (independent of our own advert)."""
        return self._zc is not None

    @property
    def announced(self) -> bool:
        """True once our own advert passed probing and is registered."""
        return self._info is not None

    async def wait_announced(self) -> None:
        """Return once our advert is registered and its announcements are on the wire."""
        await self._announced.wait()

    @property
    def problem(self) -> str | None:
        """Why the source is inactive, or ``None`` while it is active."""
        return self._problem

    @property
    def instance_name(self) -> str:
        """Our service instance name, e.g. ``peerd-ab12._peerd._tcp.local.``."""
        return self._name

    @property
    def addresses(self) -> tuple[str, ...]:
        """The IPv4 addresses currently advertised."""
        return self._plan.advertised

    @property
    def fleet_id(self) -> str:
        return self._advert.fleet_id

    async def set_fleet(self, fleet_id: str, also: Sequence[str] = ()) -> None:
        """Advertise ``fleet_id`` from now on, accept adverts of it and of ``also``, and judge
        every advert in view again (a key rotation changes the fleet id)."""
        advert = Advert(self._advert.node_id, fleet_id, self._advert.protocol_version, self._advert.port,
                        self._advert.name, self._advert.protocols)
        self._txt = encode_txt(advert)
        self._advert = self._view.advert = advert
        self._view.also = tuple(also)
        if self._zc is not None and self._info is not None:
            info = self._service_info(self._info.parsed_addresses())
            await self._zc.async_update_service(info)
            self._info = info
        self._refresh_peers(everyone=True)

    # -- DiscoverySource ----------------------------------------------------

    async def start(self, found: FoundCallback, gone: GoneCallback) -> None:
        """Open mDNS (or log why not), start browsing and announcing; returns at once."""
        if self._started:
            raise RuntimeError("MdnsSource already started")
        self._started = True
        self._view.found, self._view.gone = found, gone
        try:
            await self._reconcile()
        except Exception:  # the daemon must keep running on seeds whatever mDNS does
            log.exception("mDNS start failed; will retry")
        self._watch_task = asyncio.get_running_loop().create_task(
            self._watch(), name="mdns watch"
        )

    async def stop(self) -> None:
        """Say goodbye on the network and close the sockets; idempotent."""
        self._view.found = self._view.gone = None
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
            self._watch_task = None
        await self._deactivate()
        self._view.clear()
        self._problem = "stopped"

    # -- lifecycle ----------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                await self._reconcile()
            except Exception:  # keep watching: one bad poll must not end discovery
                log.exception("mDNS interface check failed")

    async def _reconcile(self) -> None:
        plan, problem = self._survey()
        if plan is None:
            assert problem is not None
            if self._zc is not None:
                await self._deactivate()
                self._view.forget()
            self._set_problem(problem)
        elif self._zc is None:
            if not self._holding_off(plan):
                await self._activate(plan)
        elif plan != self._plan:
            await self._readdress(plan)
        self._refresh_peers()

    def _survey(self) -> tuple[_Plan | None, str | None]:
        """Where to run mDNS now, or why it cannot run."""
        local = read_local_addresses()
        self._local_networks = tuple(a.network for a in local if not a.loopback)
        if self._interfaces == "default":
            try:
                source = default_multicast_source()
            except OSError as exc:
                return None, f"no route for multicast to 224.0.0.251 ({exc.strerror or exc})"
            device = next((a.device for a in local if a.address == source), None)
            selected = tuple(a for a in local if a.device == device) or (
                LocalAddress("?", source, 32),
            )
        else:
            selected, unmatched = select_addresses(self._interfaces, local)
            if unmatched and unmatched != self._logged_unmatched:
                log.warning("mDNS interfaces not found on this machine: %s", ", ".join(unmatched))
            self._logged_unmatched = unmatched
            if not selected:
                return None, (
                    "no network interface that is up and multicast-capable has an IPv4 address"
                    if self._interfaces == "all"
                    else "none of the configured mDNS interfaces is up with an IPv4 address"
                )
        if self._zc is None:
            port_problem = probe_mdns_port()
            if port_problem is not None:
                return None, port_problem
        plan = _Plan(
            advertised=tuple(dict.fromkeys(a.address for a in selected)),
            sockets=one_per_device(selected),
        )
        return plan, None

    def _holding_off(self, plan: _Plan) -> bool:
        """After zeroconf itself failed to open sockets, retry slowly (it logs each failure)."""
        failed = self._failed_activation
        return (
            failed is not None
            and failed[0] == plan
            and asyncio.get_running_loop().time() < failed[1]
        )

    def _set_problem(self, problem: str) -> None:
        self._problem = problem
        if problem != self._logged_problem:
            log.warning("mDNS inactive: %s; %s", problem, _SEEDS_ONLY)
            self._logged_problem = problem

    async def _activate(self, plan: _Plan) -> None:
        default = self._interfaces == "default"
        choice = ZcInterfaceChoice.Default if default else list(plan.sockets)
        try:
            zc = AsyncZeroconf(interfaces=choice, ip_version=IPVersion.V4Only)
        except (OSError, RuntimeError) as exc:
            retry_at = asyncio.get_running_loop().time() + _ACTIVATION_RETRY
            self._failed_activation = (plan, retry_at)
            self._set_problem(f"cannot open mDNS sockets ({exc})")
            return
        self._failed_activation = None
        self._zc = zc
        self._plan = plan
        self._problem = self._logged_problem = None
        # Browse first: peers already announced are found while we still probe.
        self._browser = AsyncServiceBrowser(
            zc.zeroconf, SERVICE_TYPE, handlers=[self._on_service_state_change]
        )
        self._start_registration()
        log.info("mDNS active on %s as %s", ", ".join(plan.advertised), self._name)

    async def _deactivate(self) -> None:
        zc, self._zc = self._zc, None
        tasks = list(self._resolve_tasks.values())
        self._resolve_tasks.clear()
        if self._register_task is not None:
            tasks.append(self._register_task)
            self._register_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._browser is not None:
            await self._browser.async_cancel()
            self._browser = None
        self._info = None
        self._announced.clear()
        if zc is not None:
            # async_close sends the goodbyes (TTL 0) for our registered advert.
            with contextlib.suppress(OSError, NotRunningException):
                await zc.async_close()

    async def _readdress(self, plan: _Plan) -> None:
        assert self._zc is not None
        old, self._plan = self._plan, plan
        task = self._register_task
        if self._info is None and task is not None and not task.done():
            # Still probing with the old addresses: start over with the new ones.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._info is not None:
            self._info.addresses = list(plan.advertised)
        if self._interfaces != "default" and plan.sockets != old.sockets:
            await self._zc.async_update_interfaces(list(plan.sockets))
        if self._info is not None:
            await self._zc.async_update_service(self._info)
        else:
            self._start_registration()
        log.info("mDNS addresses changed; re-announcing on %s", ", ".join(plan.advertised))

    def _start_registration(self) -> None:
        self._register_task = asyncio.get_running_loop().create_task(
            self._register(self._plan.advertised), name="mdns register"
        )
        self._register_task.add_done_callback(_log_failure)

    async def _register(self, addresses: tuple[str, ...]) -> None:
        zc = self._zc
        assert zc is not None
        info = self._service_info(addresses)
        try:
            announcing = await zc.async_register_service(info)
        except NonUniqueNameException:
            log.error(
                "another host already advertises %s on this network (same node id: was the "
                "peerd home copied to a second machine?); not advertising this node",
                self._name,
            )
            return
        except NotRunningException:
            return
        self._info = info
        await announcing
        self._announced.set()

    def _service_info(self, addresses: Sequence[str]) -> AsyncServiceInfo:
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self._name,
            port=self._advert.port,
            properties=dict(self._txt),
            server=self._server,
            host_ttl=_HOST_TTL,
            other_ttl=_SERVICE_TTL,
            parsed_addresses=list(addresses),
        )

    # -- browsing -----------------------------------------------------------

    def _on_service_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        del zeroconf, service_type
        if name.lower() == self._name.lower():
            return
        pending = self._resolve_tasks.pop(name, None)
        if pending is not None:
            pending.cancel()
        if state_change is ServiceStateChange.Removed:
            self._view.removed(name)
            return
        task = asyncio.get_running_loop().create_task(self._resolve(name), name=f"resolve {name}")
        self._resolve_tasks[name] = task
        task.add_done_callback(lambda t: self._resolve_done(name, t))

    def _resolve_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._resolve_tasks.get(name) is task:
            del self._resolve_tasks[name]
        _log_failure(task)

    async def _resolve(self, name: str) -> None:
        zc = self._zc
        if zc is None:
            return
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if not await info.async_request(zc.zeroconf, self._resolve_timeout_ms):
            log.debug("no answer resolving %s", name)
            return
        self._saw(name, info)

    def _saw(self, name: str, info: AsyncServiceInfo) -> None:
        self._view.saw(name, info.properties, info.parsed_addresses(IPVersion.V4Only), self._local_networks)

    def _refresh_peers(self, *, everyone: bool = False) -> None:
        """Re-read known peers from the mDNS cache: catches flushed (removed) addresses,
        which python-zeroconf applies silently, without a browser event. ``everyone``: the
        adverts of other fleets too (after our fleet id changed)."""
        zc = self._zc
        if zc is None:
            return
        for name in self._view.names(everyone=everyone):
            if name in self._resolve_tasks:
                continue
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if info.load_from_cache(zc.zeroconf):
                self._saw(name, info)
