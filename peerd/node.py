"""The peer daemon: a replica turned into a node of a fleet.

The I/O shell around ``protocol`` (sans-io: the wire, rounds, the forwarding
rule) and ``peers`` (pure table); it seals, sends and schedules, through a
``Transport`` (aiohttp in the daemon, in memory in tests):

* a peer server (every interface) answering sealed requests;
* gossip rounds with random live peers, backing off while nothing changes;
* push on write: our new ops go to a few live peers at once; a peer that
  receives a fresh write new to it forwards it, so a write floods the fleet
  (ops pushed as part of a round are not forwarded);
* our new ops reach the pusher through the process's change feed
  (``replica.feed``), which also tells it of ops written by other processes
  on the same replica; no loop polls the database.

Membership (``replica.membership``, ``peerd.keyring``): the node seals with the
current fleet key; a request that opens only with a key the fleet used before a
rotation is answered with the rotation and nothing else; a peer that refuses our
key is first handed the rotation under the old key; the node follows rotations
as their ops land (switching key, fleet id and mDNS advert) and never calls a
removed node. Join requests (``POST /v1/join``, unsealed) go to ``peerd.pairing``.

Invariants: every request and response body is sealed with the fleet key; a
body that does not open is refused (403); ops are verified by the replica
before anything is stored; SQLite work runs off the event loop, and the peer
table is only touched on it; background tasks live in one set and are
cancelled on stop; every background task sleeps on an event (a change, a
wake-up, a timeout), never on a polling timer.

What goes wrong is told once, never in a loop: a refused request is one log
line at most, and each source gets ``ratelog.BURST`` lines a minute and then one
summary (``ratelog.RateLog``); a failure while talking to a peer, whatever its
type, is recorded against that peer (``failures``, ``last_error``, shown by
``peerd peers``), counted, and logged once per peer and kind until it works
again; no exception from a peer's data ends a background loop. Only an
exception that is not a ``PeerdError`` (our bug) is logged with its traceback,
once per place and type. Peers learnt second hand that stop answering are
forgotten (``PeerTable.expire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from discovery import DiscoverySource, PeerCandidate, SeedError, SeedSource, parse_seed
from discovery.source import Sighting
from mcp_server.wiring import Wiring
from peerd import forks, keyring, lan, memory, protocol
from peerd.config import DEFAULT_PORT, Config, fleet_id, new_fleet_key
from peerd.errors import PeerError, SealError
from peerd.indexer import keep_indexed
from peerd.keyring import KeyRing
from peerd.pairing.host import PairingHost
from peerd.peers import FAIL_THRESHOLD, Peer, PeerTable
from peerd.protocol import Msg, Outcome, ProtocolError, RoundResult, versions
from peerd.ratelog import RateLog, summary
from peerd.transport import Answer, HttpTransport, Transport
from replica import Replica, vector
from replica.errors import PeerdError, RemoteError, StoreError
from replica.fleet import FleetView

if TYPE_CHECKING:
    from discovery.mdns import MdnsSource

log = logging.getLogger("peerd.node")

PUSH_BATCH = 500
TRIM_AFTER_PULLED = 5_000  # ops pulled in one round after which freed memory goes back to the system
OUTBOX_LIMIT = 5000
EXCHANGE_EVERY = 5
MIN_ROUND_GAP = 0.1
REQUEST_TIMEOUT = 15.0
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 10.0
PROGRESS_LOG_EVERY = 2.0
WRONG_FLEET = "refused our request: not in the same fleet (different fleet key)"
REMOVED = ("this node was removed from the fleet (its key was rotated without it); it can no longer sync. "
           "To take part again, join with a fresh home: `peerd join --lan` (or an invite) with another --home")


LOG_TEXT_MAX = 300  # characters of a peer's words (an error it sent, a kind it named) that a log line quotes


def clip(text: str, limit: int = LOG_TEXT_MAX) -> str:
    """``text`` on one line and cut to ``limit`` characters, so that no peer can make a log line
    long or make it look like several."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def http_transport(cfg: Config) -> HttpTransport:
    """The daemon's transport: aiohttp, with the peer protocol's time and size limits."""
    return HttpTransport(max_body=cfg.max_body_bytes, total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT,
                         read=READ_TIMEOUT, per_source=cfg.peer_connections_per_address)


class Node:
    def __init__(self, cfg: Config, rep: Replica, *, bind: str = "0.0.0.0", transport: Transport | None = None,
                 wiring: Wiring | None = None, home: Path | None = None) -> None:
        """``wiring`` is the process's change feed over ``rep`` and its waiter (the daemon's feed
        watches other processes' writes); without one the node follows only writes through ``rep``.
        ``home`` holds the invite records this node redeems (None: it redeems none)."""
        self.cfg = cfg
        self.keys = KeyRing(cfg.fleet_key, cfg.previous_fleet_keys)
        self.on_keys: Callable[[KeyRing], None] | None = None  # the daemon saves a rotation to config.toml
        self.pairing = PairingHost(self, home)
        self.others = lan.OtherFleets()
        self._fleet_seen = -1
        self._keys_lock = asyncio.Lock()
        self._removed_short: set[bytes] = set()
        self._told_old_key: set[str] = set()
        self.rep = rep
        self.bind = bind
        self.me = protocol.short(rep.node_key)
        self.table = PeerTable(self.me)
        self._own_feed = wiring is None
        self.wiring = wiring if wiring is not None else Wiring.over(rep)
        self.feed = self.wiring.feed
        self.waiter = self.wiring.waiter  # every wait of this process's event loop
        self._unsubscribe = self.feed.subscribe(self._on_replica_change)
        self.peer_port = 0
        self.started = time.time()
        self.counters = {"rounds": 0, "pushed_ops": 0, "pulled_ops": 0, "refused": 0, "forwarded_ops": 0,
                         "exchange_failures": 0, "peer_errors": 0, "internal_errors": 0, "expired_peers": 0}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._in_round: set[str] = set()
        self._activity = False
        self._outbox: dict[str, list[bytes]] = {}
        self._draining: set[str] = set()
        self._wake = asyncio.Event()
        self._push_evt = asyncio.Event()
        self._pushed = 0
        self.transport: Transport = transport or http_transport(cfg)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reported: set[tuple[str, str]] = set()  # (peer or place, kind) of failures logged once
        self._refusals = RateLog()
        self._flushes: set[asyncio.TimerHandle] = set()
        self.catchup: protocol.Progress | None = None
        self.own_ahead: forks.OwnAhead | None = None  # a peer held more of our own ops than we did (peerd.forks)
        self.seeds: SeedSource | None = None
        self.mdns: MdnsSource | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh_keys()
        await self._register()
        self._fleet_seen = self.rep.fleet_changes  # our own admit changes no key: nothing to follow up
        self._loop = asyncio.get_running_loop()  # from here on, replica changes reach the node
        self.peer_port = await self.transport.listen(self, self.bind, self.cfg.port)
        self._pushed = await asyncio.to_thread(self.rep.max_lseq)
        await self._start_discovery()
        self.spawn(self._gossip())
        self.spawn(self._pusher())
        self.spawn(keep_indexed(self.rep, self.waiter))
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

    def _found(self, cand: PeerCandidate) -> None:
        node = bytes.fromhex(cand.node_id)[: protocol.SHORT] if cand.node_id else None
        if node is not None and node in self._removed_short:
            return  # a removed node: it learns so when it calls us, and is answered with the rotation only
        self.add_candidate(cand.host, cand.port, source=cand.source, node=node,
                           wire=frozenset(cand.wire) if cand.wire else None)
        peer = self.table.peers.get(Peer(cand.host, cand.port, cand.source).addr)
        if peer is not None and cand.addresses:
            peer.addresses = list(cand.addresses)

    async def stop(self) -> None:
        """Stop talking first, then say goodbye on mDNS: a request after the goodbye would
        make peers think we are back."""
        self._unsubscribe()
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

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def add_candidate(self, host: str, port: int, *, source: str, node: bytes | None = None,
                      wire: frozenset[int] | None = None) -> None:
        """A discovery source found a peer: remember it and sync with it soon. ``wire``: the
        versions it states (an advert, an exchange record, its own request)."""
        if self.table.add(host, port, source, node, now=time.monotonic()) is not None:
            self._wake.set()
        peer = self.table.peers.get(Peer(host, port, source).addr)
        if peer is not None and wire is not None:
            self._set_wire(peer, wire)

    def _set_wire(self, peer: Peer, wire: frozenset[int]) -> None:
        """Record the versions a peer states; one that speaks none of ours is told once."""
        if peer.set_wire(wire):
            log.warning("peer %s %s; not contacted until it states a version in common", peer.addr,
                        versions.negotiate(wire))

    def _on_replica_change(self) -> None:  # called by the feed from whichever thread learned of it
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self._loop.call_soon_threadsafe(self._changed)

    def _changed(self) -> None:
        self._push_evt.set()
        if self.rep.fleet_changes != self._fleet_seen:
            self.spawn(self.refresh_keys())

    # -- fleet keys and membership ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self.cfg.name

    def lan_seeds(self) -> list[str]:
        """Where other machines reach this node (mDNS addresses and the peer port), for a joiner."""
        addresses = self.mdns.addresses if self.mdns is not None else ()
        return [f"{a}:{self.peer_port}" for a in addresses][:8]

    async def refresh_keys(self) -> None:
        """Follow the fleet's membership: the key to seal with, removals, mending a rotation. One
        at a time, each on what the one before left, so a rotation is never mended twice."""
        async with self._keys_lock:
            await self._refresh_keys()

    async def _refresh_keys(self) -> None:
        self._fleet_seen = self.rep.fleet_changes
        mine = await asyncio.to_thread(self.rep.fleet_keys)
        assert mine.view is not None
        ring = keyring.derive(self.cfg.fleet_key, self.cfg.previous_fleet_keys, mine.opened, mine.current,
                              epoch=mine.epoch, removed=mine.removed)
        self._removed_short = {protocol.short(k) for k in mine.view.standing.removed}
        for p in self.table.peers.values():
            self._is_removed(p)
        if ring != self.keys:
            await self._switch(ring)
        await self._mend(mine.view)

    async def _register(self) -> None:
        """Make this node known to the fleet by its full key and name (an ``admit`` op of itself,
        written once, and again when its name changes): a rotation seals the new key only to nodes
        known so, so a member that never wrote anything is not left out."""
        view = await asyncio.to_thread(self.rep.fleet_view)
        mine = view.admitted.get(self.rep.node_key)
        if not self.keys.removed and (mine is None or mine.name != self.cfg.name):
            await asyncio.to_thread(self.rep.admit_node, self.rep.node_key, self.cfg.name, self.keys.fleet_id)

    def _is_removed(self, peer: Peer) -> bool:
        """A removed node is never called again (it learns of its removal when it calls us)."""
        if peer.node is not None and peer.node in self._removed_short:
            peer.gone = True
        return peer.gone and peer.node in self._removed_short

    async def _switch(self, ring: KeyRing) -> None:
        old, self.keys = self.keys, ring
        self.cfg = dataclasses.replace(self.cfg, fleet_key=ring.current, previous_fleet_keys=ring.previous)
        if ring.removed and not old.removed:
            log.error(REMOVED)
        elif ring.current != old.current:
            log.warning("the fleet key was rotated (epoch %d): now fleet %s, was %s", ring.epoch, ring.fleet_id,
                        old.fleet_id)
        self.others.forget_fleets({ring.fleet_id, *ring.previous_ids})
        if self.mdns is not None:
            await self.mdns.set_fleet(ring.fleet_id, ring.previous_ids)
        if self.on_keys is not None:
            self.on_keys(ring)
        self._wake.set()  # peers still on the old key hear of it at once

    async def _mend(self, view: FleetView) -> None:
        """The member whose rotation won re-rotates when it left out a member (one let in on an
        older key, or whose ops arrived later) or still gave the key to a node since removed."""
        winner = view.standing.winner
        if winner is None or winner.origin != self.rep.node_key or self.keys.removed:
            return
        missing, stale = view.gaps()
        if missing or stale:
            key = new_fleet_key()
            log.warning("re-rotating the fleet key: the last rotation missed %s and reached removed %s",
                        sorted(k.hex()[:16] for k in missing) or "no member",
                        sorted(k.hex()[:16] for k in stale) or "none")
            await asyncio.to_thread(self.rep.rotate, key, fleet_id(key))
            await self._refresh_keys()  # take our own new key now (inside the refresh already under way)

    async def use_config(self, cfg: Config) -> None:
        """The home's config changed under a running daemon (``peerd join``): take its fleet key and
        seeds. Another fleet's key starts the peer table afresh."""
        other_fleet = cfg.fleet_key not in (self.keys.current, *self.keys.previous)
        self.cfg = dataclasses.replace(self.cfg, fleet_key=cfg.fleet_key, previous_fleet_keys=cfg.previous_fleet_keys,
                                       seeds=(*cfg.seeds, *self.cfg.seeds))
        if other_fleet:
            log.warning("joined fleet %s; leaving fleet %s", cfg.fleet_id, self.keys.fleet_id)
            self.table.peers.clear()
            self._outbox.clear()
            self.others.forget_fleets({cfg.fleet_id})
        if self.seeds is not None:
            await self.seeds.stop()
            self.seeds = SeedSource(list(self.cfg.seeds), default_port=DEFAULT_PORT)
            await self.seeds.start(self._found, self._gone)
        self.keys = KeyRing(self.cfg.fleet_key, self.cfg.previous_fleet_keys)
        await self.refresh_keys()
        if self.mdns is not None:
            await self.mdns.set_fleet(self.keys.fleet_id, self.keys.previous_ids)
        self._wake.set()

    def _gone(self, node_hex: str) -> None:
        log.info("peer %s said goodbye: not contacted until it announces itself again", node_hex[:16])
        self.table.mark_gone(node_hex)

    def _other_fleet(self, seen: Sighting) -> None:
        """An mDNS advert of another fleet id: a member on another key (talk to it: one of us
        catches up), or another fleet (tell people, once)."""
        self.spawn(self._judge_other(seen))

    async def _judge_other(self, seen: Sighting) -> None:
        cand = seen.candidate
        node = bytes.fromhex(cand.node_id) if cand.node_id else b""
        view = await asyncio.to_thread(self.rep.fleet_view)
        if node in view.members:
            self._found(cand)
            return
        addr = f"{cand.host}:{cand.port}"
        if self.others.saw(seen.fleet_id, cand.node_id or "", seen.name, addr, time.time()):
            log.warning(lan.describe(seen.fleet_id, seen.name, cand.node_id or "?", addr))

    # -- serving peers ---------------------------------------------------------------------

    async def answer(self, body: bytes, remote: str) -> Answer:
        """One sealed request from a peer at ``remote`` (the transport's ``Server``); never raises:
        a bad request is a 400 (403 when it does not open), a store failure a 503, a bug of ours a 500."""
        try:
            return await self._answer(body, remote)
        except StoreError as exc:
            self._report_once("our replica", "store", f"cannot answer peers from our replica: {exc}")
            return self._sealed(protocol.error_reply(exc), 503)
        except Exception as exc:
            self._bug("answering a peer", exc)
            return self._sealed(protocol.error_reply(RuntimeError("internal error")), 500)

    async def _answer(self, body: bytes, remote: str) -> Answer:
        try:
            plain, key = self.keys.open(body)
            if key != self.keys.current:
                return await self._answer_old_key(key, remote)
            req = protocol.decode_request(plain)
        except SealError as exc:
            self.refuse(remote, str(exc))
            return Answer(403, str(exc).encode())
        except ProtocolError as exc:
            return self._error(remote, exc, key)
        self._saw_inbound(remote, req.envelope)
        try:
            out = await asyncio.to_thread(protocol.dispatch, self.rep, req, self._here(req))
        except RemoteError as exc:
            return self._error(remote, exc, key)
        self._follow(out, req.envelope.sender)
        if self.rep.fleet_changes != self._fleet_seen:  # the caller's retry must find us on the new key
            await self.refresh_keys()
        self._recovered("our replica", "store")
        return self._sealed(out.reply, key=key)

    async def join(self, body: bytes, remote: str) -> Answer:
        """An unsealed join request (``POST /v1/join``): the pairing host answers it; never raises
        (a store failure is a 503, a bug of ours a 500, both plain text: the caller has no key)."""
        try:
            return await self.pairing.answer(body, remote)
        except StoreError as exc:
            self._report_once("our replica", "store", f"cannot answer peers from our replica: {exc}")
            return Answer(503, protocol.encode_map(protocol.error_reply(exc)))
        except Exception as exc:
            self._bug("answering a join request", exc)
            return Answer(500, protocol.encode_map(protocol.error_reply(RuntimeError("internal error"))))

    async def _answer_old_key(self, key: bytes, remote: str) -> Answer:
        """A request sealed with a key the fleet used before: answer with the rotation, nothing else
        (a member that missed it catches up; a removed node learns it was removed)."""
        ops = await asyncio.to_thread(self.rep.rekey_ops)
        if remote not in self._told_old_key:
            self._told_old_key.add(remote)
            log.info("%s called with the fleet's previous key; answered with the key rotation only", remote)
        reply = protocol.sign_reply({"t": protocol.REKEY, "o": ops}, me=self.me, kind=protocol.REKEY, clock_ms=0)
        return Answer(200, self.keys.seal(protocol.encode(reply), key))

    def refuse(self, remote: str, why: str) -> None:
        """A refused request or connection: counted always, logged at most ``ratelog.BURST``
        times a minute per source, then told as one summary line when the minute ends."""
        self.counters["refused"] += 1
        verdict = self._refusals.note(remote, time.monotonic())
        if verdict.write:
            log.warning("refused request from %s: %s", remote, clip(why))
        if verdict.flush_at is not None and self._loop is not None and not self._loop.is_closed():
            delay = max(0.0, verdict.flush_at - time.monotonic())
            handle = self._loop.call_later(delay, self._flush_refusals)
            self._flushes.add(handle)

    def _flush_refusals(self, *, final: bool = False) -> None:
        self._flushes = {h for h in self._flushes if not h.cancelled() and h.when() > time.monotonic()}
        for source, count in self._refusals.due(float("inf") if final else time.monotonic()):
            log.warning("%s", summary(source, count, self._refusals.window, self._refusals.burst))

    def _here(self, req: protocol.Request) -> protocol.Here:
        """What the protocol needs to know of this node to answer ``req`` (read on the loop)."""
        records = self.table.exchange_records(time.monotonic()) if req.wants_peers else ()
        return protocol.Here(self.me, self.cfg.name, self.cfg.page_bytes, time.time_ns() // 1_000_000, records)

    def _sealed(self, reply: Msg, status: int = 200, key: bytes | None = None) -> Answer:
        return Answer(status, self.keys.seal(protocol.encode(reply), key))

    def _error(self, remote: str, exc: Exception, key: bytes | None = None) -> Answer:
        self.refuse(remote, str(exc))
        return self._sealed(protocol.error_reply(exc), 400, key)

    def _saw_inbound(self, host: str, sender: protocol.Envelope) -> None:
        if sender.port is None or not host or sender.sender == self.me:
            return
        self.add_candidate(host, sender.port, source="inbound", node=sender.sender, wire=sender.wire)
        peer = self.table.peers.get(Peer(host, sender.port, "inbound").addr)
        if peer is not None:
            peer.last_seen = time.monotonic()

    def _follow(self, out: Outcome, sender: bytes | None) -> None:
        """Do what answering a request asked of this node."""
        self._learn_peers(out.learnt)
        if out.new:
            self._activity = True
            self._wake.set()  # others may lack it too: a round soon repairs whatever the flood missed
        if out.forward:
            self.counters["forwarded_ops"] += len(out.forward)
            self._push(out.forward, exclude=sender)

    def _learn_peers(self, learnt: protocol.Learnt) -> None:
        for rec in learnt.peers:
            self.add_candidate(rec.host, rec.port, source="exchange", node=rec.node, wire=rec.wire)
        for node, name in learnt.names:  # liveness gossip: the name a node goes by (never in the op log)
            for p in self.table.peers.values():
                if p.node == node:
                    p.name = name

    # -- calling peers ---------------------------------------------------------------------

    async def call(self, peer: Peer, msg: Msg) -> Msg:
        """Send one sealed request; the reply, or PeerError saying what went wrong. Across a key
        rotation it tries once more: after telling a peer on an older key of the rotation (a 403),
        or after catching up with one the peer told us of (a ``rekey`` reply)."""
        for last in (False, True):
            reply = await self._call_once(peer, msg, last)
            if reply is not None:
                return reply
        raise AssertionError("unreachable: the last try returns or raises")

    async def _call_once(self, peer: Peer, msg: Msg, last: bool) -> Msg | None:
        keys = self.keys
        body = keys.seal(protocol.encode(protocol.stamp(msg, me=self.me, port=self.peer_port)))
        answer = await self.transport.post(peer.addr, body)
        if answer.status == 403:
            if not last and await self._tell_rotation(peer):
                return None
            raise PeerError(REMOVED if keys.removed else WRONG_FLEET, peer=peer.addr)
        try:
            reply = protocol.decode(keys.open(answer.body)[0])
        except (SealError, ProtocolError) as exc:
            raise PeerError(f"sent an unreadable reply (HTTP {answer.status}): {exc}", peer=peer.addr) from None
        self._set_wire(peer, versions.stated(reply))
        if peer.incompatible:
            raise PeerError(str(versions.negotiate(peer.wire or ())), peer=peer.addr)
        if reply.get("t") == protocol.REKEY and answer.status == 200:
            if not last and await self._catch_up(peer, reply):
                return None
            raise PeerError(REMOVED if self.keys.removed else "answered with a key rotation that gives this node "
                            "no key", peer=peer.addr)
        refused = protocol.refusal(reply, answer.status)
        if refused is not None:
            raise PeerError(f"refused our request: {refused}", peer=peer.addr)
        return reply

    async def _tell_rotation(self, peer: Peer) -> bool:
        """A peer refused our key: if it is a member on a key we used before, push it the rotation
        sealed with that key. True when it took it (then our key opens there)."""
        if not self.keys.previous or peer.node in self._removed_short:
            return False
        ops = await asyncio.to_thread(self.rep.rekey_ops)
        if not ops:
            return False
        push = protocol.encode(protocol.stamp({"t": protocol.PUSH, "o": ops}, me=self.me, port=self.peer_port))
        for key in self.keys.previous:
            answer = await self.transport.post(peer.addr, self.keys.seal(push, key))
            if answer.status == 200:
                log.info("told %s of the fleet's key rotation", peer.addr)
                return True
        return False

    async def _catch_up(self, peer: Peer, reply: Msg) -> bool:
        """Apply the rotation a peer answered with; True when it gave us a new key to retry with."""
        ops = reply.get("o")
        if not isinstance(ops, list) or not all(isinstance(o, bytes) for o in ops):
            raise PeerError("answered with a malformed key rotation", peer=peer.addr)
        before = self.keys.current
        try:
            await asyncio.to_thread(self.rep.apply, ops)
        except RemoteError as exc:
            raise PeerError(f"answered with a key rotation that does not verify: {exc}", peer=peer.addr) from None
        await self.refresh_keys()
        if self.keys.current != before:
            log.info("caught up with the fleet's key rotation from %s", peer.addr)
        return self.keys.current != before

    async def sync_with(self, peer: Peer) -> RoundResult:
        """One push-pull round with ``peer``; updates the peer table either way."""
        marks = dict(peer.pushed)  # the round runs on worker threads; the table is the loop's
        gen = protocol.client_round(self.rep, budget=self.cfg.page_bytes, pushed=marks)
        before = await self._our_vector()
        try:
            req, result = await asyncio.to_thread(protocol.step, gen, None)
            while req is not None:
                reply = await self.call(peer, req)
                answerer = protocol.envelope(reply).sender
                if answerer == self.me:
                    self.table.drop_self(peer)
                    raise PeerError("is this node itself", peer=peer.addr)
                self.table.succeeded(peer, time.monotonic(), answerer)
                req, result = await asyncio.to_thread(protocol.step, gen, reply)
                await self._track_progress(peer, reply)
        except (PeerError, RemoteError) as exc:
            self.table.failed(peer, time.monotonic(), str(exc))
            if peer.source == "seed" and self.seeds is not None:
                self.seeds.report_failure(peer.host, peer.port)
            if not peer.incompatible:  # that was told once already (``_set_wire``)
                self._report_once(peer.addr, "sync", f"sync with {peer.addr} failed: {exc}")
            raise PeerError(str(exc), peer=peer.addr) from None
        finally:
            if self.catchup is not None and self.catchup.peer == peer.addr:
                self._log_progress(self.catchup, final=True)
                self.catchup = None
        assert result is not None
        if not peer.takes_every_op:
            peer.pushed = marks
        if peer.source == "seed" and self.seeds is not None:
            self.seeds.report_success(peer.host, peer.port)
        self._recovered(peer.addr, "sync")
        self._after_round(peer, result)
        if self.own_ahead is None and (ahead := forks.own_ahead(self.me, peer.addr, result.their_vector, before)):
            self.own_ahead = ahead
            log.error("%s; to fix it: %s", ahead.message(), forks.FIX)
        if result.pulled >= TRIM_AFTER_PULLED:
            await asyncio.to_thread(memory.trim)  # a big pull leaves freed pages in malloc (peerd.memory)
        return result

    async def _our_vector(self) -> dict[bytes, int]:
        """Our vector by short ids, read off the event loop."""
        return protocol.shorten(await asyncio.to_thread(self.rep.vector))

    async def _track_progress(self, peer: Peer, reply: Msg) -> None:
        """Follow a long catch-up: how much of what the peer had we now hold."""
        theirs = protocol.reply_vector(reply)
        if theirs is not None and self.catchup is None:
            self.catchup = protocol.start_catchup(peer.addr, theirs, await self._our_vector())
        elif self.catchup is not None and self.catchup.peer == peer.addr:
            self.catchup.advance(await self._our_vector())
            if time.monotonic() - self.catchup.logged >= PROGRESS_LOG_EVERY:
                self._log_progress(self.catchup)

    def _log_progress(self, prog: protocol.Progress, *, final: bool = False) -> None:
        prog.logged = time.monotonic()
        d = prog.to_dict()
        if final:
            log.info("caught up from %s: %d of %d ops in %.1f s", d["peer"], d["done"], d["total"],
                     time.monotonic() - prog.started)
        else:
            log.info("catching up from %s: %s%% (%d/%d ops, %s ops/s, ETA %s s)",
                     d["peer"], d["percent"], d["done"], d["total"], d["rate"], d["eta"])

    def _after_round(self, peer: Peer, result: RoundResult) -> None:
        ours = result.ours or {}  # read by the round's last step, on its worker thread
        peer.last_sync = time.monotonic()
        peer.their_vector = ours if result.same else {**(result.their_vector or {}), **ours}
        self.counters["rounds"] += 1
        self.counters["pulled_ops"] += result.pulled
        self.counters["pushed_ops"] += result.pushed

    async def exchange_peers(self, peer: Peer) -> None:
        """Tell ``peer`` whom we reach and learn whom it reaches; PeerError if that fails."""
        records = self.table.exchange_records(time.monotonic())
        reply = await self.call(peer, protocol.peers_message(self.cfg.name, records))
        try:
            learnt = protocol.learn(reply)
        except ProtocolError as exc:
            raise PeerError(f"sent a malformed peer list: {exc}", peer=peer.addr) from None
        self._learn_peers(learnt)

    # -- background work -------------------------------------------------------------------

    async def _gossip(self) -> None:
        """Start rounds on schedule; each runs as its own task so a silent peer never
        holds up the others. Back off while rounds find nothing to do."""
        interval = self.cfg.gossip_interval
        ticks = 0
        while True:
            try:
                self._expire_peers()
                for peer in self.table.pick(2, time.monotonic(), busy=frozenset(self._in_round)):
                    if self._is_removed(peer):
                        continue
                    self._in_round.add(peer.addr)
                    self.spawn(self._round(peer, exchange=ticks % EXCHANGE_EVERY == 0))
            except Exception as exc:  # the schedule must outlive any bug: the next tick tries again
                self._bug("scheduling rounds", exc)
            ticks += 1
            busy, self._activity = self._activity, False
            busy = busy or any(0 < p.failures < FAIL_THRESHOLD for p in self.table.peers.values() if not p.gone)
            interval = self.cfg.gossip_interval if busy else min(interval * 1.5, self.cfg.gossip_max_interval)
            await asyncio.sleep(MIN_ROUND_GAP)  # wake-ups (pushes, new peers) start rounds at most this often
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
                # that meets the event being set, and this loop would then outlive stop()
                async with asyncio.timeout(interval * random.uniform(0.8, 1.2)):
                    await self._wake.wait()
                interval = self.cfg.gossip_interval
            self._wake.clear()

    async def _round(self, peer: Peer, *, exchange: bool) -> None:
        """A round plus, on first contact and now and then, a peer exchange."""
        first_contact = peer.last_sync is None
        try:
            result = await self.sync_with(peer)  # a failure is logged and recorded there
            if first_contact or not result.same:
                self._activity = True
            if first_contact or exchange:
                await self._exchange(peer)
        except PeerError:
            pass  # recorded and reported by sync_with
        except Exception as exc:
            self._peer_failed(peer, "sync", exc)
        finally:
            self._in_round.discard(peer.addr)

    def _expire_peers(self) -> None:
        """Forget learnt peers that stopped answering (and what was kept for them)."""
        for peer in self.table.expire(time.monotonic()):
            self.counters["expired_peers"] += 1
            self._outbox.pop(peer.addr, None)
            self._reported = {k for k in self._reported if k[0] != peer.addr}
            log.info("forgot peer %s (learnt by %s, not answering: %s)", peer.addr, peer.source,
                     clip(peer.last_error or ""))

    async def _exchange(self, peer: Peer) -> None:
        """A peer exchange after a round; a failure is counted, kept as the peer's last error
        and logged once per peer until an exchange with it works again."""
        try:
            await self.exchange_peers(peer)
        except PeerError as exc:
            self.counters["exchange_failures"] += 1
            peer.last_error = f"peer exchange failed: {exc}"
            self._report_once(peer.addr, "exchange", f"peer exchange with {peer.addr} failed: {exc}")
        except Exception as exc:  # like a refused exchange, it leaves the peer reachable
            self.counters["exchange_failures"] += 1
            self._peer_failed(peer, "peer exchange", exc, unreachable=False)
        else:
            self._recovered(peer.addr, "exchange")

    def _report_once(self, where: str, kind: str, text: str) -> None:
        """Log ``text`` the first time ``kind`` goes wrong with ``where`` since it last worked."""
        if (where, kind) not in self._reported:
            self._reported.add((where, kind))
            log.warning("%s", clip(text))

    def _recovered(self, where: str, kind: str) -> None:
        if (where, kind) in self._reported:
            self._reported.discard((where, kind))
            log.info("%s: %s works again", kind, where)

    def _bug(self, place: str, exc: BaseException) -> None:
        """An exception that is not ours to expect: counted, and logged with its traceback
        once per place and type (a bug to fix, not a peer's fault to shrug off)."""
        self.counters["internal_errors"] += 1
        key = (place, type(exc).__name__)
        if key not in self._reported:
            self._reported.add(key)
            log.error("internal error while %s (logged once): %s: %s", place, type(exc).__name__, exc,
                      exc_info=exc)

    def _peer_failed(self, peer: Peer, kind: str, exc: BaseException, *, unreachable: bool = True) -> None:
        """Something went wrong talking to ``peer``, whatever the exception: counted, kept as its
        last error and, when ``unreachable``, a failure of the peer (backoff, then unreachable)."""
        self.counters["peer_errors"] += 1
        if isinstance(exc, PeerdError):
            why = str(exc)
            self._report_once(peer.addr, kind, f"{kind} with {peer.addr} failed: {why}")
        else:
            why = f"internal error: {type(exc).__name__}: {exc}"
            self._bug(f"{kind} with a peer", exc)
        if unreachable:
            self.table.failed(peer, time.monotonic(), why)
        else:
            peer.last_error = f"{kind} failed: {why}"

    async def _pusher(self) -> None:
        while True:
            await self._push_evt.wait()
            self._push_evt.clear()
            if not self.table.live():  # nobody to push to: step past these ops without reading them
                self._pushed = max(self._pushed, self.feed.mark)
                continue
            try:
                ops = await asyncio.to_thread(self.rep.local_ops_after, self._pushed, PUSH_BATCH)
            except Exception as exc:  # the store failed for now: the next change tries again
                if isinstance(exc, PeerdError):
                    self._report_once("our replica", "read", f"push on write cannot read our replica: {exc}")
                else:
                    self._bug("reading ops to push", exc)
                continue
            if not ops:
                continue
            self._pushed = ops[-1][0]
            if len(ops) == PUSH_BATCH:
                self._push_evt.set()
            self._push([raw for _, raw in ops], exclude=None)

    def _push(self, raws: list[bytes], exclude: bytes | None) -> None:
        """Queue ops for a few live peers; each peer's queue drains in its own task, so a
        burst of writes coalesces into few requests and a slow peer delays only itself. A peer
        that has not said it takes every op gets only those the first release takes."""
        first_release: list[bytes] | None = None
        for peer in self.table.push_targets(self.cfg.push_fanout, exclude=exclude):
            if self._is_removed(peer):
                continue
            if not peer.takes_every_op and first_release is None:
                first_release = protocol.first_release_takes(raws)
            batch = raws if peer.takes_every_op else first_release or []
            if not batch:
                continue
            box = self._outbox.setdefault(peer.addr, [])
            box.extend(batch)
            if len(box) > OUTBOX_LIMIT:  # far behind: drop the backlog, rounds repair it
                del box[: len(box) - OUTBOX_LIMIT]
            if peer.addr not in self._draining:
                self._draining.add(peer.addr)
                self.spawn(self._drain(peer))

    async def _drain(self, peer: Peer) -> None:
        box = self._outbox.setdefault(peer.addr, [])
        try:
            while box:
                n = vector.take_within((len(r) for r in box), self.cfg.page_bytes)
                batch = box[:n]
                del box[:n]
                try:
                    await self.call(peer, {"t": "push", "o": batch})
                    self.table.succeeded(peer, time.monotonic(), None)
                    self._recovered(peer.addr, "push")
                    if peer.their_vector is not None:  # keeps its lag current until the next round
                        protocol.advance_known(peer.their_vector, batch)
                except Exception as exc:  # a round repairs what is dropped here
                    self._peer_failed(peer, "push", exc)
                    box.clear()
        finally:
            self._draining.discard(peer.addr)

    # -- reporting -------------------------------------------------------------------------

    async def peers_report(self) -> list[dict[str, Any]]:
        """The peer table for people: our vector is read off the loop, the table on it."""
        ours = await self._our_vector()
        now = time.monotonic()
        return [p.to_dict(ours, now) for p in sorted(self.table.peers.values(), key=lambda p: p.addr)]


