"""The peer daemon: a replica turned into a node of a fleet.

The I/O shell around ``protocol`` (sans-io) and ``peers`` (pure table):

* a peer server (aiohttp, every interface) answering sealed requests at ``/v1``;
* gossip rounds with random live peers, backing off while nothing changes;
* push on write: our new ops go to a few live peers at once; a peer that
  receives a fresh write new to it forwards it, so a write floods the fleet
  (ops pushed as part of a round are not forwarded);
* our new ops reach the pusher through the process's change feed
  (``replica.feed``), which also tells it of ops written by other processes
  on the same replica; no loop polls the database.

Invariants: every request and response body is sealed with the fleet key; a
body that does not open is refused (403) and logged; ops are verified by the
replica before anything is stored; SQLite work runs off the event loop;
background tasks live in one set and are cancelled on stop; every background
task sleeps on an event (a change, a wake-up, a timeout), never on a polling timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from discovery import DiscoverySource, MdnsSource, PeerCandidate, SeedError, SeedSource, parse_seed
from mcp_server.waiter import FeedWaiter
from peerd import protocol
from peerd.config import DEFAULT_PORT, Config
from peerd.errors import DaemonError, PeerError, SealError
from peerd.indexer import keep_indexed
from peerd.peers import FAIL_THRESHOLD, Peer, PeerTable
from peerd.protocol import Msg, ProtocolError, RoundResult
from peerd.seal import open_sealed, seal
from replica import Replica, vector
from replica.errors import RemoteError
from replica.feed import ChangeFeed
from replica.ops import peek

log = logging.getLogger("peerd.node")

PUSH_BATCH = 500
OUTBOX_LIMIT = 5000
EXCHANGE_EVERY = 5
MIN_ROUND_GAP = 0.1
REQUEST_TIMEOUT = 15.0
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 10.0
CATCHUP_REPORT = 1000  # a round that must pull at least this many ops reports progress
PROGRESS_LOG_EVERY = 2.0


@dataclass
class Progress:
    """A catch-up in flight: ops pulled of the ops the peer had that we lacked."""

    peer: str
    total: int
    theirs: dict[bytes, int]  # the peer's vector when the catch-up began
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    logged: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        left = max(self.total - self.done, 0)
        return {"peer": self.peer, "done": self.done, "total": self.total, "rate": round(rate, 1),
                "eta": round(left / rate, 1) if rate > 0 else None,
                "percent": round(100 * self.done / self.total, 1) if self.total else 100.0}


def _pack(msg: Msg) -> bytes:
    out: bytes = msgpack.packb(msg, use_bin_type=True)
    return out


def _unpack(data: bytes) -> Msg:
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise ProtocolError(f"undecodable message ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
    return msg


def _step(gen: Generator[Msg, Msg, RoundResult], reply: Msg | None) -> tuple[Msg | None, RoundResult | None]:
    """Advance a client round by one reply (runs in a worker thread)."""
    try:
        return (next(gen) if reply is None else gen.send(reply)), None
    except StopIteration as stop:
        return None, stop.value


def _advance_known(peer: Peer, raws: list[bytes]) -> None:
    """After a push the peer acknowledged, count those ops as held there (keeps its lag current)."""
    if peer.their_vector is None:
        return
    for raw in raws:
        ident = peek(raw)
        if ident is not None:
            origin = protocol.short(ident[0])
            if peer.their_vector.get(origin, 0) == ident[1] - 1:
                peer.their_vector[origin] = ident[1]


class Node:
    def __init__(self, cfg: Config, rep: Replica, *, bind: str = "0.0.0.0", feed: ChangeFeed | None = None) -> None:
        """``feed`` is the process's change feed over ``rep`` (the daemon's watches other
        processes' writes); without one the node follows only writes through ``rep``."""
        self.cfg = cfg
        self.rep = rep
        self.bind = bind
        self.me = protocol.short(rep.node_key)
        self.table = PeerTable(self.me)
        self._own_feed = feed is None
        self.feed = feed if feed is not None else ChangeFeed(rep)
        self.waiter = FeedWaiter(self.feed)  # every wait of this process's event loop
        self._unsubscribe = self.feed.subscribe(self._on_replica_change)
        self.peer_port = 0
        self.started = time.time()
        self.counters = {"rounds": 0, "pushed_ops": 0, "pulled_ops": 0, "refused": 0, "forwarded_ops": 0}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._in_round: set[str] = set()
        self._activity = False
        self._outbox: dict[str, list[bytes]] = {}
        self._draining: set[str] = set()
        self._wake = asyncio.Event()
        self._push_evt = asyncio.Event()
        self._pushed = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.catchup: Progress | None = None
        self.seeds: SeedSource | None = None
        self.mdns: MdnsSource | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT),
            connector=aiohttp.TCPConnector(limit=128, force_close=False),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        app.router.add_post("/v1", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.bind, self.cfg.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            await self._session.close()
            raise DaemonError(
                f"cannot listen for peers on {self.bind}:{self.cfg.port}: {exc.strerror or exc}"
                " (is another peerd running? pick another port with --port, or 0 for any free one)"
            ) from None
        self.peer_port = int(self._runner.addresses[0][1])
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
            self.mdns = MdnsSource(
                self.rep.node_id, self.cfg.fleet_id, self.peer_port, protocol.PROTOCOL_VERSION,
                interfaces if isinstance(interfaces, str) else list(interfaces),
            )
            sources.append(self.mdns)
        for source in sources:
            await source.start(self._found, self.table.mark_gone)

    def _found(self, cand: PeerCandidate) -> None:
        node = bytes.fromhex(cand.node_id)[: protocol.SHORT] if cand.node_id else None
        self.add_candidate(cand.host, cand.port, source=cand.source, node=node)
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
        if self._runner is not None:
            await self._runner.cleanup()
        for source in (self.mdns, self.seeds):
            if source is not None:
                with contextlib.suppress(Exception):  # goodbye is best effort on the way out
                    await source.stop()
        if self._session is not None:
            await self._session.close()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    def add_candidate(self, host: str, port: int, *, source: str, node: bytes | None = None) -> None:
        """A discovery source found a peer: remember it and sync with it soon."""
        if self.table.add(host, port, source, node) is not None:
            self._wake.set()

    def _on_replica_change(self) -> None:  # called by the feed from whichever thread learned of it
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                self._loop.call_soon_threadsafe(self._push_evt.set)

    # -- serving peers ---------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.counters["refused"] += 1
            log.warning("refused request from %s: body over the %d-byte limit", request.remote,
                        self.cfg.max_body_bytes)
            raise
        try:
            msg = _unpack(open_sealed(self.cfg.fleet_key, body))
        except SealError as exc:
            self.counters["refused"] += 1
            log.warning("refused request from %s: %s", request.remote, exc)
            return web.Response(status=403, text=str(exc))
        except ProtocolError as exc:
            return self._error(400, request, exc)
        try:
            reply = await self._dispatch(msg, request.remote or "")
        except RemoteError as exc:
            return self._error(400, request, exc)
        reply["n"] = self.me
        if msg.get("t") == "peers":
            reply["c"] = time.time_ns() // 1_000_000  # our wall clock, for clock-skew checks (peerd doctor)
        return self._sealed(reply)

    def _sealed(self, reply: Msg, status: int = 200) -> web.Response:
        return web.Response(
            status=status, body=seal(self.cfg.fleet_key, _pack(reply)), content_type="application/octet-stream"
        )

    def _error(self, status: int, request: web.Request, exc: Exception) -> web.Response:
        self.counters["refused"] += 1
        log.warning("refused request from %s: %s", request.remote, exc)
        return self._sealed({"t": "error", "e": str(exc)}, status)

    async def _dispatch(self, msg: Msg, remote: str) -> Msg:
        kind = msg.get("t")
        sender = msg.get("n") if isinstance(msg.get("n"), bytes) else None
        if isinstance(msg.get("p"), int) and remote:
            self._saw_inbound(remote, msg["p"], sender)
        if kind == "push":
            return await self._on_push(msg, sender)
        if kind == "peers":
            self._merge_peers(msg)
            self._name_peer(sender, msg.get("nm"))
            return {"t": "peers", "nm": self.cfg.name, "k": self.table.exchange_records(time.monotonic())}
        budget = self.cfg.page_bytes
        return await asyncio.to_thread(protocol.serve, self.rep, msg, budget)

    def _saw_inbound(self, host: str, port: int, node: bytes | None) -> None:
        if node == self.me:
            return
        self.add_candidate(host, port, source="inbound", node=node)
        peer = self.table.peers.get(Peer(host, port, "inbound").addr)
        if peer is not None:
            peer.last_seen = time.monotonic()

    async def _on_push(self, msg: Msg, sender: bytes | None) -> Msg:
        reply, result = await asyncio.to_thread(protocol.handle_push, self.rep, msg)
        if result.new:
            self._activity = True
            self._wake.set()  # others may lack it too: a round soon repairs whatever the flood missed
            if not msg.get("r"):  # a fresh write floods on; ops a round pushed do not
                fresh = [msg["o"][i] for i in result.new_index]
                self.counters["forwarded_ops"] += len(fresh)
                self._push(fresh, exclude=sender)
        return reply

    def _merge_peers(self, msg: Msg) -> None:
        for rec in protocol.peers_from(msg):
            node = rec.get("n") if isinstance(rec.get("n"), bytes) else None
            self.add_candidate(rec["a"], rec["p"], source="exchange", node=node)
            self._name_peer(node, rec.get("nm"))

    def _name_peer(self, node: object, name: object) -> None:
        """Liveness gossip: remember the name a node goes by (never stored in the op log)."""
        if isinstance(node, bytes) and isinstance(name, str) and 0 < len(name) <= 64:
            for p in self.table.peers.values():
                if p.node == node:
                    p.name = name

    # -- calling peers ---------------------------------------------------------------------

    async def call(self, peer: Peer, msg: Msg) -> Msg:
        """Send one sealed request; the reply, or PeerError saying what went wrong."""
        assert self._session is not None
        msg.setdefault("n", self.me)
        msg.setdefault("p", self.peer_port)
        try:
            async with self._session.post(f"http://{peer.addr}/v1", data=seal(self.cfg.fleet_key, _pack(msg))) as resp:
                data = await self._read_capped(resp, peer)
                status = resp.status
        except TimeoutError:
            raise PeerError("no answer in time (timed out)", peer=peer.addr) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise PeerError(f"cannot reach: {str(exc) or type(exc).__name__}", peer=peer.addr) from None
        if status == 403:
            raise PeerError("refused our request: not in the same fleet (different fleet key)", peer=peer.addr)
        try:
            reply = _unpack(open_sealed(self.cfg.fleet_key, data))
        except (SealError, ProtocolError) as exc:
            raise PeerError(f"sent an unreadable reply (HTTP {status}): {exc}", peer=peer.addr) from None
        if reply.get("t") == "error" or status != 200:
            raise PeerError(f"refused our request: {reply.get('e', status)}", peer=peer.addr)
        return reply

    async def _read_capped(self, resp: aiohttp.ClientResponse, peer: Peer) -> bytes:
        """A reply body, refusing one larger than our body limit."""
        limit = self.cfg.max_body_bytes
        if resp.content_length is not None and resp.content_length > limit:
            raise PeerError(f"reply of {resp.content_length} bytes is over the {limit}-byte limit", peer=peer.addr)
        data = bytearray()
        async for chunk in resp.content.iter_chunked(65536):
            data += chunk
            if len(data) > limit:
                raise PeerError(f"reply is over the {limit}-byte limit", peer=peer.addr)
        return bytes(data)

    async def sync_with(self, peer: Peer) -> RoundResult:
        """One push-pull round with ``peer``; updates the peer table either way."""
        gen = protocol.client_round(self.rep, me=self.rep.node_key, port=self.peer_port, budget=self.cfg.page_bytes)
        try:
            req, result = await asyncio.to_thread(_step, gen, None)
            while req is not None:
                reply = await self.call(peer, req)
                if reply.get("n") == self.me:
                    self.table.drop_self(peer)
                    raise PeerError("is this node itself", peer=peer.addr)
                self._learn(peer, reply)
                req, result = await asyncio.to_thread(_step, gen, reply)
                await self._track_progress(peer, reply)
        except (PeerError, RemoteError) as exc:
            self.table.failed(peer, time.monotonic(), str(exc))
            if peer.source == "seed" and self.seeds is not None:
                self.seeds.report_failure(peer.host, peer.port)
            log.info("sync with %s failed: %s", peer.addr, exc)
            raise PeerError(str(exc), peer=peer.addr) from None
        finally:
            if self.catchup is not None and self.catchup.peer == peer.addr:
                self._log_progress(self.catchup, final=True)
                self.catchup = None
        assert result is not None
        if peer.source == "seed" and self.seeds is not None:
            self.seeds.report_success(peer.host, peer.port)
        self._after_round(peer, result)
        return result

    async def _track_progress(self, peer: Peer, reply: Msg) -> None:
        """Follow a long catch-up: how much of what the peer had we now hold."""
        theirs = reply.get("v")
        if isinstance(theirs, dict) and self.catchup is None:
            ours = protocol.shorten(await asyncio.to_thread(self.rep.vector))
            total = sum(max(0, n - ours.get(k, 0)) for k, n in theirs.items() if isinstance(n, int))
            if total >= CATCHUP_REPORT:
                self.catchup = Progress(peer.addr, total, {k: n for k, n in theirs.items() if isinstance(n, int)})
        elif self.catchup is not None and self.catchup.peer == peer.addr:
            ours = protocol.shorten(await asyncio.to_thread(self.rep.vector))
            left = sum(max(0, n - ours.get(k, 0)) for k, n in self.catchup.theirs.items())
            self.catchup.done = self.catchup.total - left
            if time.monotonic() - self.catchup.logged >= PROGRESS_LOG_EVERY:
                self._log_progress(self.catchup)

    def _log_progress(self, prog: Progress, *, final: bool = False) -> None:
        prog.logged = time.monotonic()
        d = prog.to_dict()
        if final:
            log.info("caught up from %s: %d of %d ops in %.1f s", d["peer"], d["done"], d["total"],
                     time.monotonic() - prog.started)
        else:
            log.info("catching up from %s: %s%% (%d/%d ops, %s ops/s, ETA %s s)",
                     d["peer"], d["percent"], d["done"], d["total"], d["rate"], d["eta"])

    def _learn(self, peer: Peer, reply: Msg) -> None:
        node = reply.get("n")
        self.table.succeeded(peer, time.monotonic(), node if isinstance(node, bytes) else None)

    def _after_round(self, peer: Peer, result: RoundResult) -> None:
        now = time.monotonic()
        ours = protocol.shorten(self.rep.vector())
        peer.last_sync = now
        peer.their_vector = ours if result.same else {**(result.their_vector or {}), **ours}
        self.counters["rounds"] += 1
        self.counters["pulled_ops"] += result.pulled
        self.counters["pushed_ops"] += result.pushed

    async def exchange_peers(self, peer: Peer) -> None:
        reply = await self.call(
            peer, {"t": "peers", "nm": self.cfg.name, "k": self.table.exchange_records(time.monotonic())}
        )
        self._merge_peers(reply)
        self._name_peer(reply.get("n"), reply.get("nm"))

    # -- background work -------------------------------------------------------------------

    async def _gossip(self) -> None:
        """Start rounds on schedule; each runs as its own task so a silent peer never
        holds up the others. Back off while rounds find nothing to do."""
        interval = self.cfg.gossip_interval
        ticks = 0
        while True:
            for peer in self.table.pick(2, time.monotonic(), busy=frozenset(self._in_round)):
                self._in_round.add(peer.addr)
                self.spawn(self._round(peer, exchange=ticks % EXCHANGE_EVERY == 0))
            ticks += 1
            busy, self._activity = self._activity, False
            busy = busy or any(0 < p.failures < FAIL_THRESHOLD for p in self.table.peers.values() if not p.gone)
            interval = self.cfg.gossip_interval if busy else min(interval * 1.5, self.cfg.gossip_max_interval)
            await asyncio.sleep(MIN_ROUND_GAP)  # wake-ups (pushes, new peers) start rounds at most this often
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval * random.uniform(0.8, 1.2))
                interval = self.cfg.gossip_interval
            self._wake.clear()

    async def _round(self, peer: Peer, *, exchange: bool) -> None:
        """A round plus, on first contact and now and then, a peer exchange."""
        first_contact = peer.last_sync is None
        try:
            result = await self.sync_with(peer)
            if first_contact or exchange:
                await self.exchange_peers(peer)
            if first_contact or not result.same:
                self._activity = True
        except PeerError:
            pass
        finally:
            self._in_round.discard(peer.addr)

    async def _pusher(self) -> None:
        while True:
            await self._push_evt.wait()
            self._push_evt.clear()
            ops = await asyncio.to_thread(self.rep.local_ops_after, self._pushed, PUSH_BATCH)
            if not ops:
                continue
            self._pushed = ops[-1][0]
            if len(ops) == PUSH_BATCH:
                self._push_evt.set()
            self._push([raw for _, raw in ops], exclude=None)

    def _push(self, raws: list[bytes], exclude: bytes | None) -> None:
        """Queue ops for a few live peers; each peer's queue drains in its own task, so a
        burst of writes coalesces into few requests and a slow peer delays only itself."""
        for peer in self.table.push_targets(self.cfg.push_fanout, exclude=exclude):
            box = self._outbox.setdefault(peer.addr, [])
            box.extend(raws)
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
                    _advance_known(peer, batch)
                except PeerError as exc:
                    self.table.failed(peer, time.monotonic(), str(exc))
                    box.clear()
        finally:
            self._draining.discard(peer.addr)

    # -- reporting -------------------------------------------------------------------------

    def peers_report(self) -> list[dict[str, Any]]:
        ours = protocol.shorten(self.rep.vector())
        now = time.monotonic()
        return [p.to_dict(ours, now) for p in sorted(self.table.peers.values(), key=lambda p: p.addr)]


