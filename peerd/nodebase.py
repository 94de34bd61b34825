"""What every part of the node's shell shares: its state, its injected clock, random source and
worker, and the one place commands of the core are carried out.

``Node`` (``peerd.node``) is composed of areas, each a module of its own built on ``NodeBase``:
``peerd.serving`` (answering peers), ``peerd.talking`` (calling them: rounds, pushes, exchanges),
``peerd.following`` (the fleet's keys and membership). The decisions are ``peerd.core``'s.

Invariants:
* The core is touched only on the event loop, and the replica only through ``offload`` (a worker
  thread in the daemon), so SQLite never blocks the loop.
* Every background task lives in ``_tasks`` and is cancelled on stop; rounds and drains are also
  in ``_transient`` while they run (``idle`` is true when none runs and no wake-up is pending).
* Time comes from ``clock`` and chance from ``rng`` only: with a test's clock and a seeded
  random source a node's schedule is the test's to drive.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from discovery import PeerCandidate
from mcp_server.wiring import Wiring
from peerd import lan, protocol
from peerd.clock import Cancellable, Clock, SystemClock
from peerd.config import Config
from peerd.core import Command, NodeCore, Say, StartDrain, StartRound, Wake
from peerd.keyring import KeyRing
from peerd.pairing.host import PairingHost
from peerd.peers import Peer, PeerTable
from peerd.ratelog import RateLog
from peerd.transport import Transport
from replica import Replica

if TYPE_CHECKING:
    from discovery import SeedSource
    from discovery.mdns import MdnsSource
    from peerd.relaylink import RelayLinks
    from peerd.snapshotting import Snapshotting

log = logging.getLogger("peerd.node")

T = TypeVar("T")
Offload = Callable[..., Awaitable[Any]]  # runs a blocking call off the loop: asyncio.to_thread


class NodeBase:
    snapshots: Snapshotting  # made by ``Node`` (it needs the whole node)
    relay: RelayLinks  # the return path (``peerd.relaylink``), made by ``Node`` too

    def __init__(self, cfg: Config, rep: Replica, transport: Transport, *, bind: str, wiring: Wiring | None,
                 home: Path | None, clock: Clock | None, rng: random.Random | None,
                 offload: Offload | None) -> None:
        self.cfg = cfg
        self.rep = rep
        self.bind = bind
        self.transport = transport
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self._offload: Offload = offload or asyncio.to_thread
        self.keys = KeyRing(cfg.fleet_key, cfg.previous_fleet_keys)
        self.on_keys: Callable[[KeyRing], None] | None = None  # the daemon saves a rotation to config.toml
        self.me = protocol.short(rep.node_key)
        self.core = NodeCore(self.me, fanout=cfg.push_fanout, budget=cfg.page_bytes, base=cfg.gossip_interval,
                             cap=cfg.gossip_max_interval, rng=self.rng,
                             first_release_takes=protocol.first_release_takes)
        self.pairing = PairingHost(self, home)
        self.others = lan.OtherFleets()
        self._own_feed = wiring is None
        self.wiring = wiring if wiring is not None else Wiring.over(rep)
        self.feed = self.wiring.feed
        self.waiter = self.wiring.waiter  # every wait of this process's event loop
        self.peer_port = 0
        self.started = self.clock.wall()
        self.catchup: protocol.Progress | None = None
        self.seeds: SeedSource | None = None
        self.mdns: MdnsSource | None = None
        self._fleet_seen = -1
        self._own_seen = 0
        self._keys_lock = asyncio.Lock()
        self._told_old_key: set[str] = set()
        self._mend_due: float | None = None  # when this member's turn to mend the fleet key comes
        self.admitted_here = True  # a member let this node in (or its replica is open): its ops count
        self.conflicts: list[str] = []  # nodes removed by conflicting removals (hex ids)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._transient: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._waking = False  # the gossip loop waits on ``_wake`` (not in the gap between ticks)
        self._push_evt = asyncio.Event()
        self._pushed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refusals = RateLog()
        self._flushes: set[Cancellable] = set()

    # -- what the rest of the daemon reads ----------------------------------------------------

    @property
    def table(self) -> PeerTable:
        return self.core.table

    @property
    def counters(self) -> dict[str, int]:
        return self.core.counters

    @property
    def own_ahead(self) -> Any:
        return self.core.own_ahead

    @property
    def name(self) -> str:
        return self.cfg.name

    def lan_seeds(self) -> list[str]:
        """Where other machines reach this node (mDNS addresses and the peer port), for a joiner."""
        addresses = self.mdns.addresses if self.mdns is not None else ()
        return [f"{a}:{self.peer_port}" for a in addresses][:8]

    @property
    def idle(self) -> bool:
        """No round or push runs and no wake-up is pending that the node would act on before its
        clock moves (a wake-up during the gap between ticks waits for the gap): a test's clock
        moves on from here."""
        return not self._transient and not self._push_evt.is_set() and not (self._wake.is_set() and self._waking)

    # -- carrying out the core's commands -------------------------------------------------------

    def run(self, commands: list[Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, Say):
                log.log(cmd.level, "%s", cmd.text, exc_info=cmd.exc)
            elif isinstance(cmd, StartRound):
                self.spawn(self._round(cmd.peer, exchange=cmd.exchange), transient=True)
            elif isinstance(cmd, StartDrain):
                self.spawn(self._drain(cmd.peer), transient=True)
            elif isinstance(cmd, Wake):
                self._wake.set()

    async def _round(self, peer: Peer, *, exchange: bool) -> None:
        raise NotImplementedError  # peerd.talking

    async def _drain(self, peer: Peer) -> None:
        raise NotImplementedError  # peerd.talking

    async def refresh_keys(self) -> None:
        raise NotImplementedError  # peerd.following

    def spawn(self, coro: Coroutine[Any, Any, Any], *, transient: bool = False) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        if transient:
            self._transient.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._transient.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def add_candidate(self, host: str, port: int, *, source: str, node: bytes | None = None,
                      wire: frozenset[int] | None = None) -> None:
        """A peer found (discovery, an exchange, an invite): remember it and sync with it soon.
        ``wire``: the versions it states (an advert, an exchange record, its own request)."""
        self.run(self.core.candidate(host, port, source, node=node, wire=wire, now=self.clock.now()))

    def _found(self, cand: PeerCandidate) -> None:
        """A discovery source's candidate (also mDNS adverts with no wire version in common)."""
        node = bytes.fromhex(cand.node_id)[: protocol.SHORT] if cand.node_id else None
        self.add_candidate(cand.host, cand.port, source=cand.source, node=node,
                           wire=frozenset(cand.wire) if cand.wire else None)
        peer = self.core.table.peers.get(Peer(cand.host, cand.port, cand.source).addr)
        if peer is not None and cand.addresses:
            peer.addresses = list(cand.addresses)

    def _gone(self, node_hex: str) -> None:
        self.run(self.core.goodbye(node_hex))

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` off the event loop (replica work)."""
        result: T = await self._offload(fn, *args)
        return result

    async def note_own_history(self, where: str) -> None:
        """After ops landed from ``where``: if one of ours we never held was among them (the replica
        remembers the first), tell the core (once)."""
        if self.rep.own_arrivals == self._own_seen:
            return
        self._own_seen = self.rep.own_arrivals
        ahead = await self.offload(self.rep.own_history_ahead)
        if ahead is not None:
            self.run(self.core.own_history(where, *ahead))

    async def our_vector(self) -> dict[bytes, int]:
        """Our vector by short ids, read off the event loop."""
        return protocol.shorten(await self.offload(self.rep.vector))
