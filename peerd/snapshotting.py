"""Snapshots, the node's side: when to take one, taking it (pipelined), serving them, and checking
afterwards the signatures they let through. The wire is ``peerd.protocol.snapshot``, the replica's
work ``replica.snapshot`` and ``replica.vouching``; ``peerd.node`` calls in at three places
(``before_round``, ``answer``, ``start``).

* **When.** Before a round with a peer, a node that may be behind it (first round with that peer
  since start, none for ``PROBE_EVERY`` seconds, the peer's last vector far ahead, or a snapshot
  from it left unfinished) asks the peer's vector: a ``sync`` carrying only a digest. When the peer
  speaks wire 3 or later and holds at least ``SNAPSHOT_BEHIND`` ops we lack, we take a snapshot from
  it; the ordinary round then follows and repairs the rest (ops written meanwhile). A peer of wire 2
  is never asked; one that refuses to open a snapshot is not asked again for ``DECLINE_FOR`` seconds,
  one whose snapshot failed its checks for ``DECLINE_BAD``.
* **While taking.** One snapshot at a time; our other rounds wait for it, and so does the search
  indexer (``idle``); peers' rounds with us (``sync``, a round's ``push``) and their ``snap``
  requests are answered 503 (busy), so nobody pushes us, op by op, what the snapshot brings.
  Fresh pushes (new writes) are taken as always. The next page is asked for while one is stored.
* **Afterwards.** The signatures the pages vouched for are checked in the background, at most about
  ``CHECK_SHARE`` of one core; a forged op is dropped and fetched again (``replica.vouching``), and
  the signer is named in the log, in ``peerd status`` and by ``peerd doctor``.

Invariants: what goes wrong ends the snapshot, never the daemon: a peer's bad page is a
``PeerError`` of the round (nothing of that page stored, the snapshot given up, that peer not asked
again for ``DECLINE_BAD`` seconds); a lost connection keeps the snapshot, which the next round with
that peer resumes from its cursor (or opens anew if the peer forgot it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from peerd import memory, protocol
from peerd.errors import PeerError, TransportError
from peerd.protocol import Msg, answers, snapshot, versions
from peerd.protocol.snapshot import Opening
from replica import vector
from replica.errors import PeerdError, RemoteError
from replica.membership import cap_vector
from replica.models import ApplyResult
from replica.snapshot import Cursor, Prepared, Taking
from replica.vouching import VouchCheck

if TYPE_CHECKING:
    from peerd.node import Node
    from peerd.peers import Peer

log = logging.getLogger("peerd.snapshot")

SNAPSHOT_BEHIND = 10_000  # ops we lack from one peer from which a snapshot beats a round
PROBE_EVERY = 60.0
DECLINE_FOR = 120.0  # a peer that offers no snapshot now is not asked again for this long
DECLINE_BAD = 600.0  # nor, for longer, one whose snapshot failed its checks
PROGRESS_EVERY = 2.0
CHECK_STEP = 2000  # signatures checked per step in the background
CHECK_SHARE = 0.5  # of one core, at most
BUSY = "busy taking a snapshot (catching up); try again in a minute"


class _Gone(RemoteError):
    """The peer no longer holds the snapshot we were taking."""


class Snapshotting:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.shelf = snapshot.Shelf()
        self.idle = asyncio.Event()  # set while no snapshot is being taken
        self.idle.set()
        self._lock = asyncio.Lock()
        self._check = asyncio.Event()
        self._probed: dict[str, float] = {}
        self._declined: dict[str, float] = {}
        self._told: set[str] = set()
        self.taking: dict[str, Any] | None = None
        self.unchecked = 0
        self.checked = 0
        self.forged: dict[str, int] = {}
        self.served = 0
        self.taken = 0
        self._started = self._logged = 0.0

    @property
    def rep(self) -> Any:
        return self.node.rep

    def start(self) -> None:
        self._check.set()
        self.node.spawn(self._check_loop())

    def status(self) -> dict[str, Any]:
        prog = self.node.catchup_report()
        taking = None if self.taking is None else {**self.taking, **(prog or {})}
        return {"taking": taking, "unchecked": self.unchecked, "checked": self.checked, "forged": dict(self.forged),
                "taken_ops": self.taken, "served_pages": self.served}

    # -- deciding ---------------------------------------------------------------------------

    async def before_round(self, peer: Peer) -> None:
        """Take a snapshot from ``peer`` first if we are far behind it (module docstring); a failure
        is a ``PeerError`` of the round. Asking the peer's vector holds nobody up: only taking a
        snapshot is one at a time, and every round waits while one is taken."""
        await self.idle.wait()
        ours, held = await self.node.offload(self._where_we_stand)
        resume = held if held is not None and held[0].peer == peer.addr else None
        if not self._worth_asking(peer, ours, resume is not None):
            return
        theirs = await self._theirs(peer, ours)
        async with self._lock:
            ours = await self.node.offload(self.rep.vector)  # another snapshot may have ended meanwhile
            far = theirs is not None and protocol.behind(theirs, protocol.shorten(ours)) >= SNAPSHOT_BEHIND
            if not peer.takes_every_op or (resume is None and not far):
                if held is not None and resume is None and not far:  # left by a peer gone since: rounds do the rest
                    await self.node.offload(self.rep.end_snapshot)
                return
            self.idle.clear()
            try:
                await self._take(peer, ours, resume)
            except (RemoteError, PeerError) as exc:
                if not isinstance(exc, TransportError):  # it answered, wrongly: give this snapshot up
                    self._declined[peer.addr] = self.node.clock.now() + DECLINE_BAD
                    await self.node.offload(self.rep.end_snapshot)
                raise PeerError(f"snapshot failed: {exc}", peer=peer.addr) from None
            finally:
                self.taking = None
                self.idle.set()
                self._check.set()

    def _where_we_stand(self) -> tuple[dict[bytes, int], tuple[Taking, Cursor | None] | None]:
        return self.rep.vector(), self.rep.snapshot_taking()

    def _worth_asking(self, peer: Peer, ours: dict[bytes, int], resuming: bool) -> bool:
        now = self.node.clock.now()
        if (peer.wire is not None and not peer.takes_every_op) or now < self._declined.get(peer.addr, 0.0):
            return False
        if resuming or now - self._probed.get(peer.addr, -PROBE_EVERY) >= PROBE_EVERY:
            return True
        theirs = peer.their_vector
        return theirs is not None and protocol.behind(theirs, protocol.shorten(ours)) >= SNAPSHOT_BEHIND

    async def _theirs(self, peer: Peer, ours: dict[bytes, int]) -> dict[bytes, int] | None:
        """The peer's vector (short ids, removed origins capped), asked with a digest-only ``sync``
        (no page comes back); None when it equals ours. Learns the wire the peer speaks too."""
        self._probed[peer.addr] = self.node.clock.now()
        reply = await self._call(peer, versions.state({"t": protocol.SYNC, "d": vector.digest(ours)}))
        theirs = protocol.reply_vector(reply)
        if reply.get("t") == protocol.SAME or theirs is None:
            return None
        # Capped by removals only: a member new to the fleet may not know its members yet (the
        # snapshot opens with every membership op, and refuses what they bar, page by page).
        removed = protocol.shorten(await self.node.offload(self.rep.removed))
        return cap_vector(theirs, removed)

    async def _call(self, peer: Peer, msg: Msg) -> Msg:
        reply = await self.node.call(peer, msg)
        if not self.node.core.replied(peer, protocol.envelope(reply).sender, self.node.clock.now()):
            raise PeerError("is this node itself", peer=peer.addr)
        return reply

    # -- taking -----------------------------------------------------------------------------

    async def _take(self, peer: Peer, ours: dict[bytes, int], resume: tuple[Taking, Cursor | None] | None) -> None:
        if resume is not None:
            taking, cursor = resume
            opening = Opening(taking.id, taking.signer, taking.point, [], cursor)
            try:
                await self._pages(peer, taking, opening, cursor, ours, resumed=True)
                return
            except _Gone:
                log.info("%s no longer holds the snapshot we were taking from it; opening a new one", peer.addr)
                ours = await self.node.offload(self.rep.vector)
        opened = await self._open(peer, ours)
        if opened is not None:
            try:
                await self._pages(peer, *opened, ours)
            except _Gone:
                raise PeerError("forgot the snapshot it had just opened") from None

    async def _open(self, peer: Peer, ours: dict[bytes, int]) -> tuple[Taking, Opening, Cursor | None] | None:
        try:
            reply = await self._call(peer, snapshot.open_request(ours))
        except TransportError:
            raise
        except PeerError as exc:  # it does not offer one now: the round syncs as always
            self._declined[peer.addr] = self.node.clock.now() + DECLINE_FOR
            log.info("%s offers no snapshot now (%s); syncing by rounds", peer.addr, exc)
            return None
        opening = snapshot.check_opening(reply, ours, protocol.envelope(reply).sender)
        why = await self.node.offload(self.rep.signer_standing, opening.signer, opening.fleet_ops)
        if why is not None:
            raise protocol.ProtocolError(f"its signer is not a member of this fleet: {why}")
        taking = Taking(peer.addr, opening.id, opening.signer, opening.point, self.node.clock.wall())
        await self.node.offload(self.rep.begin_snapshot, taking, opening.cursor, opening.fleet_ops)
        return taking, opening, opening.cursor

    async def _pages(self, peer: Peer, taking: Taking, opening: Opening, cursor: Cursor | None,
                     ours: dict[bytes, int], *, resumed: bool = False) -> None:
        """Take the pages from ``cursor`` on, in order, each in its own transaction: while one page is
        stored, the next is asked for, checked and decoded (SQLite's work and ours overlap)."""
        self._began(peer, taking, ours, resumed)
        fetch = None if cursor is None else asyncio.ensure_future(self._page(peer, taking.id, cursor))
        storing: asyncio.Future[ApplyResult] | None = None
        stored = 0
        try:
            while fetch is not None and cursor is not None:
                reply = await fetch
                page, nxt = await self.node.offload(self._prepare, reply, opening, cursor)
                fetch = None if nxt is None else asyncio.ensure_future(self._page(peer, taking.id, nxt))
                if storing is not None:
                    stored += await self._stored(storing)
                storing = asyncio.ensure_future(self.node.offload(self.rep.store_page, taking, page, nxt))
                cursor = nxt
            if storing is not None:
                stored, storing = stored + await self._stored(storing), None
            if opening.cursor is None:
                await self.node.offload(self.rep.end_snapshot)  # nothing to take: the opening said so
        finally:
            if fetch is not None:
                fetch.cancel()
            for task in (fetch, storing):  # a page being stored is let finish: it is whole either way
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            await self.node.offload(memory.trim)  # pages of ops freed (peerd.memory)
        took = self.node.clock.now() - self._started
        log.info("took the snapshot from %s: %d ops stored in %.1f s (%.0f ops/s); their signatures are "
                 "checked in the background", peer.addr, stored, took, stored / max(took, 1e-6))

    def _prepare(self, reply: Msg, opening: Opening, cursor: Cursor) -> tuple[Prepared, Cursor | None]:
        checked = snapshot.check_page(reply, opening, cursor, protocol.envelope(reply).sender)
        return self.rep.prepare_page(checked.ops, checked.covered), checked.next

    async def _stored(self, storing: asyncio.Future[ApplyResult]) -> int:
        result = await storing
        self.taken += result.new
        self.node.counters["pulled_ops"] += result.new
        await self._progress()
        return result.new

    async def _page(self, peer: Peer, sid: bytes, cursor: Cursor) -> Msg:
        reply = await self._call(peer, snapshot.page_request(sid, cursor))
        if snapshot.gone(reply):
            raise _Gone
        return reply

    def _began(self, peer: Peer, taking: Taking, ours: dict[bytes, int], resumed: bool) -> None:
        tops = {protocol.short(k): t for k, t in zip(taking.point.origins, taking.point.tops, strict=True)}
        prog = protocol.Progress(peer.addr, protocol.behind(tops, protocol.shorten(ours)), tops, self.node.clock.now())
        self.node.catchup = prog  # the round that follows reports it done (peerd status, the log)
        self._started = prog.started
        self._logged = prog.started
        self.taking = {"peer": peer.addr, "signer": taking.signer.hex(), "id": taking.id.hex()}
        log.info("%s from %s (signed by %s): %d ops to take", "resuming the snapshot" if resumed else
                 "taking a snapshot", peer.addr, taking.signer.hex()[:16], prog.total)

    async def _progress(self) -> None:
        prog = self.node.catchup
        if prog is None:
            return
        prog.advance(await self.node.our_vector())
        now = self.node.clock.now()
        if now - self._logged >= PROGRESS_EVERY:
            self._logged = now
            d = prog.to_dict(now)
            log.info("taking a snapshot from %s: %s%% (%d/%d ops, %s ops/s, ETA %s s)", d["peer"], d["percent"],
                     d["done"], d["total"], d["rate"], d["eta"])

    # -- serving ----------------------------------------------------------------------------

    async def answer(self, req: protocol.Request, remote: str) -> tuple[Msg, int] | None:
        """The answer to ``req`` when it is ours to give: a ``snap`` request, or a round refused while
        we take a snapshot (503); None for every other request."""
        if not self.idle.is_set() and (req.kind in (protocol.SYNC, protocol.SNAP)
                                       or (req.kind == protocol.PUSH and req.msg.get("r"))):
            return protocol.error_reply(RuntimeError(BUSY)), answers.UNAVAILABLE
        if req.kind != protocol.SNAP:
            return None
        try:
            reply = await self.node.offload(self._serve, req.msg, self.node.clock.now())
        except snapshot.Unavailable as exc:
            return protocol.error_reply(exc), answers.UNAVAILABLE
        except RemoteError as exc:
            self.node.refuse(remote, str(exc))
            return protocol.error_reply(exc), answers.BAD_REQUEST
        self.served += 1
        versions.state(reply)
        return protocol.sign_reply(reply, me=self.node.me, kind=protocol.SHOT, clock_ms=0), answers.OK

    def _serve(self, msg: Msg, now: float) -> Msg:
        return snapshot.serve(self.rep, msg, self.shelf, budget=self.node.cfg.page_bytes, sign=self._sign,
                              signer=self.rep.node_key, now=now, token=os.urandom(snapshot.ID_BYTES))

    def _sign(self, data: bytes) -> bytes:
        return bytes(self.rep.signing_key.sign(data).signature)

    # -- checking afterwards ------------------------------------------------------------------

    async def _check_loop(self) -> None:
        """Check what snapshots vouched for, a step at a time, whenever no snapshot is being taken."""
        while True:
            await self._check.wait()
            self._check.clear()
            try:
                self.unchecked = await self.node.offload(self.rep.vouched_left)
                self.forged = await self.node.offload(self.rep.forged_by)
                while await self._check_step():
                    pass
            except Exception as exc:  # the store failed for now, or a bug: the next snapshot tries again
                kind = type(exc).__name__
                if kind not in self._told:
                    self._told.add(kind)
                    log.error("checking snapshot signatures failed (retried later): %s", exc,
                              exc_info=None if isinstance(exc, PeerdError) else exc)

    async def _check_step(self) -> bool:
        await self.idle.wait()
        step, spent = await self.node.offload(self._check_timed)
        if step is None:
            self.unchecked = 0
            return False
        self.unchecked, self.checked = step.left, self.checked + step.checked
        who = step.signer.hex()
        if step.forged:
            self.forged = await self.node.offload(self.rep.forged_by)
            log.error("%d ops that node %s vouched for in a snapshot do not verify (first: origin %s seq %d): "
                      "dropped, and fetched again from peers; that member sent forged ops: check it, and remove "
                      "it (peerd remove %s) if it is not yours", len(step.forged), who[:16],
                      step.forged[0][0].hex()[:16], step.forged[0][1], who[:16])
        if step.left == 0:
            log.info("checked the signatures of the ops node %s vouched for: %s", who[:16],
                     f"{self.forged[who]} forged, dropped" if self.forged.get(who) else "all genuine")
            await self.node.offload(memory.trim)  # a million ops decoded: their pages go back (peerd.memory)
        await self.node.clock.sleep(spent * (1 / CHECK_SHARE - 1))  # leave the core to others
        return True

    def _check_timed(self) -> tuple[VouchCheck | None, float]:
        """One step of the check, and the CPU time it took (on a busy machine its wall time is mostly
        waiting for a CPU, which would slow the check down for nothing)."""
        began = time.thread_time()
        step = self.rep.check_vouched(CHECK_STEP)
        return step, time.thread_time() - began
