"""The peer daemon: a replica turned into a node of a fleet.

``Node`` is the async shell around the node's decisions (``peerd.core``, sans-io: the peer
table, the push queues, the gossip schedule, backoff and expiry; ``peerd.calling``: a request
across a key rotation) and the wire (``peerd.protocol``). It seals, sends, sleeps and schedules,
through a ``Transport`` (aiohttp in the daemon, in memory in tests) and a ``Clock`` (the system's
in the daemon, one a test moves by hand), and carries out the core's commands:

* a peer server (every interface) answering sealed requests (``peerd.serving``);
* gossip rounds with random live peers, backing off while nothing changes (``peerd.talking``);
* push on write: our new ops go to a few live peers at once; a peer that receives a fresh
  write new to it forwards it, so a write floods the fleet (ops a round pushed are not forwarded);
* our new ops reach the pusher through the process's change feed (``replica.feed``), which also
  tells it of ops written by other processes on the same replica; no loop polls the database;
* the fleet's keys and membership followed as their ops land (``peerd.following``); join
  requests (``POST /v1/join``, unsealed) go to ``peerd.pairing``.

Invariants: every request and response body is sealed with the fleet key; ops are verified by
the replica before anything is stored; SQLite work runs off the event loop, and the core is only
touched on it; background tasks live in one set and are cancelled on stop; every background task
sleeps on an event (a change, a wake-up, a timeout of the clock), never on a polling timer.

What goes wrong is told once, never in a loop (the core's ``report_once``, ``bug``; refusals
through ``ratelog.RateLog``); no exception from a peer's data ends a background loop. Peers
learnt second hand that stop answering are forgotten (``PeerTable.expire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from pathlib import Path
from typing import Any

from discovery import DiscoverySource, SeedError, SeedSource, parse_seed
from mcp_server.wiring import Wiring
from peerd.clock import Clock
from peerd.config import DEFAULT_PORT, Config
from peerd.following import Following
from peerd.indexer import keep_indexed
from peerd.nodebase import Offload
from peerd.protocol import versions
from peerd.relaylink import RelayLinks
from peerd.retaining import keep_retention
from peerd.serving import Serving
from peerd.snapshotting import Snapshotting
from peerd.talking import Talking
from peerd.transport import HttpTransport, Transport
from replica import Replica
from replica.errors import PeerdError

log = logging.getLogger("peerd.node")

PUSH_BATCH = 500
REQUEST_TIMEOUT = 15.0
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 10.0


def http_transport(cfg: Config) -> HttpTransport:
    """The daemon's transport: aiohttp, with the peer protocol's time and size limits."""
    return HttpTransport(max_body=cfg.max_body_bytes, total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT,
                         read=READ_TIMEOUT, per_source=cfg.peer_connections_per_address)


class Node(Serving, Talking, Following):
    def __init__(self, cfg: Config, rep: Replica, *, bind: str = "::", transport: Transport | None = None,
                 wiring: Wiring | None = None, home: Path | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None, offload: Offload | None = None) -> None:
        """``wiring`` is the process's change feed over ``rep`` and its waiter (the daemon's feed
        watches other processes' writes); without one the node follows only writes through ``rep``.
        ``home`` holds the invite records this node redeems (None: it redeems none). ``clock``,
        ``rng`` and ``offload`` (how replica work leaves the loop) default to the real ones."""
        super().__init__(cfg, rep, transport or http_transport(cfg), bind=bind, wiring=wiring, home=home,
                         clock=clock, rng=rng, offload=offload)
        self.snapshots = Snapshotting(self)  # taking, serving and checking snapshots (peerd.snapshotting)
        self.relay = RelayLinks(self)  # the return path: links for members nobody can call (peerd.relaylink)
        self._unsubscribe = self.feed.subscribe(self._on_replica_change)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh_keys()
        await self._register()
        self._fleet_seen = self.rep.fleet_changes  # our own admit changes no key: nothing to follow up
        self._loop = asyncio.get_running_loop()  # from here on, replica changes reach the node
        self.peer_port = await self.transport.listen(self, self.bind, self.cfg.port)
        self._pushed = await self.offload(self.rep.max_lseq)
        await self._start_discovery()
        self.spawn(self._gossip())
        self.spawn(self._pusher())
        self.spawn(self.relay.keep())
        self.spawn(keep_indexed(self.rep, self.waiter, sleep=self.clock.sleep, offload=self.offload,
                                hold=self.snapshots.idle))
        self.snapshots.start()
        self.spawn(keep_retention(self.rep, self.waiter, offload=self.offload))
        log.info("peer server on %s:%d, node %s", self.bind, self.peer_port, self.rep.node_id[:16])

    async def _start_discovery(self) -> None:
        good = []
        for seed in self.cfg.seeds:
            try:
                parse_seed(seed, DEFAULT_PORT)
                good.append(seed)
            except SeedError as exc:
                log.error("ignoring seed %r: %s", seed, exc)
        self.seeds = SeedSource(good, default_port=DEFAULT_PORT)
        sources: list[DiscoverySource] = [self.seeds]
        if self.cfg.mdns:
            interfaces = self.cfg.mdns_interfaces
            from discovery.mdns import MdnsSource  # noqa: PLC0415 - zeroconf only with mDNS on

            self.mdns = MdnsSource(
                self.rep.node_id, self.keys.fleet_id, self.peer_port, versions.SPOKEN,
                interfaces if isinstance(interfaces, str) else list(interfaces),
                name=self.cfg.name, also=self.keys.previous_ids, other=self._other_fleet,
                other_gone=self.others.gone, other_version=self._found,
            )
            sources.append(self.mdns)
        for source in sources:
            await source.start(self._found, self._gone)

    async def stop(self) -> None:
        """Stop talking first, then say goodbye on mDNS: a request after the goodbye would
        make peers think we are back."""
        self._unsubscribe()
        await self.relay.close()  # open links would hold the peer server's shutdown
        self.waiter.close()
        if self._own_feed:
            self.feed.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle in self._flushes:
            handle.cancel()
        self._flush_refusals(final=True)
        await self.transport.close()
        for source in (self.mdns, self.seeds):
            if source is not None:
                with contextlib.suppress(Exception):  # goodbye is best effort on the way out
                    await source.stop()

    def _on_replica_change(self) -> None:  # called by the feed from whichever thread learned of it
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self._loop.call_soon_threadsafe(self._changed)

    def _changed(self) -> None:
        self._push_evt.set()
        if self.rep.fleet_changes != self._fleet_seen:
            self.spawn(self.refresh_keys(), transient=True)

    # -- background work -------------------------------------------------------------------

    async def _gossip(self) -> None:
        """Start rounds on the core's schedule; each runs as its own task so a silent peer never
        holds up the others. Wake-ups (pushes, new peers) start rounds at most every gap."""
        while True:
            try:
                self.run(self.core.tick(self.clock.now()))
            except Exception as exc:  # the schedule must outlive any bug: the next tick tries again
                self.run(self.core.bug("scheduling rounds", exc))
            wait = self.core.next_wait()
            await self.clock.sleep(self.core.schedule.gap)
            self._waking = True
            try:
                if await self.clock.wait(self._wake, wait):
                    self.core.woken()
            finally:
                self._waking = False
            self._wake.clear()

    async def _pusher(self) -> None:
        while True:
            await self.clock.wait(self._push_evt, None)
            self._push_evt.clear()
            if not self.core.table.live():  # nobody to push to: step past these ops without reading them
                self._pushed = max(self._pushed, self.feed.mark)
                continue
            try:
                ops = await self.offload(self.rep.local_ops_after, self._pushed, PUSH_BATCH)
            except Exception as exc:  # the store failed for now: the next change tries again
                if isinstance(exc, PeerdError):
                    self.run(self.core.report_once("our replica", "read",
                                                   f"push on write cannot read our replica: {exc}"))
                else:
                    self.run(self.core.bug("reading ops to push", exc))
                continue
            if not ops:
                continue
            self._pushed = ops[-1][0]
            if len(ops) == PUSH_BATCH:
                self._push_evt.set()
            self.run(self.core.push([raw for _, raw in ops], exclude=None))

    # -- reporting -------------------------------------------------------------------------

    async def peers_report(self) -> list[dict[str, Any]]:
        """The peer table for people: our vector is read off the loop, the table on it."""
        ours = await self.our_vector()
        now = self.clock.now()
        via = {t.addr for t in self.relay.relays.via()}
        rows = []
        for p in sorted(self.core.table.peers.values(), key=lambda p: p.addr):
            row = p.to_dict(ours, now)
            row["relay"] = ("relays for us" if p.addr in via else
                            "we relay for it" if p.node in self.core.relayed else None)
            rows.append(row)
        return rows

    def catchup_report(self) -> dict[str, Any] | None:
        """The catch-up in flight, for people (None when there is none)."""
        return None if self.catchup is None else self.catchup.to_dict(self.clock.now())
