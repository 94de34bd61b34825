"""The node's decisions, sans-io: events in, commands out.

``NodeCore`` holds the peer table (``peerd.peers``), the push queues (``peerd.outbox``), the
gossip schedule (``peerd.schedule``), the counters and what has been told once. The async shell
(``peerd.node``) feeds it events, each carrying the time from the injected clock:

==========================  ===============================================================
event                       commands it may return
==========================  ===============================================================
``tick(now)``               ``StartRound`` for the peers due, ``Say`` for forgotten peers
``candidate(...)``          ``Wake`` for a peer new to the table, ``Say`` for an incompatible one
``push(raws, exclude)``     ``StartDrain`` for each peer whose queue was idle
``pushed`` / ``push_failed``  ``Say`` (works again / failed, once)
``replied`` / ``round_done``  ``Say``; the table, counters and schedule updated
``round_failed``            ``Say`` (once per peer until a round works again)
``answered(outcome)``       ``Wake``, ``StartDrain`` (what a request we answered asked of us)
==========================  ===============================================================

and carries the commands out: ``StartRound`` runs a round (``peerd.protocol.client_round``,
each request through ``peerd.calling``), ``StartDrain`` sends the peer's batches
(``Outbox.take``) one by one, ``Wake`` ends the gossip wait early, ``Say`` logs.

Invariants: nothing here does I/O, sleeps, reads a clock or draws randomness but from the
``random.Random`` it is given, so a test replays a node's decisions exactly; the table is only
touched through these events (on the shell's event loop); a failure is told once per (peer or
place, kind) until that works again, and a bug of ours (an exception that is not a
``PeerdError``) once per place and type, with its traceback.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from peerd.forks import FIX, OwnAhead, own_ahead
from peerd.outbox import Outbox
from peerd.peers import FAIL_THRESHOLD, Peer, PeerTable
from peerd.protocol import Envelope, Learnt, Outcome, RoundResult, advance_known, versions
from peerd.schedule import Schedule
from replica.errors import PeerdError

OUTBOX_LIMIT = 5000
ROUND_PEERS = 2  # random live peers a tick starts rounds with (besides new and retried ones)
LOG_TEXT_MAX = 300  # characters of a peer's words (an error it sent, a kind it named) that a log line quotes
COUNTERS = ("rounds", "pushed_ops", "pulled_ops", "refused", "barred_ops", "forwarded_ops", "exchange_failures",
            "peer_errors", "internal_errors", "expired_peers")


def clip(text: str, limit: int = LOG_TEXT_MAX) -> str:
    """``text`` on one line and cut to ``limit`` characters, so that no peer can make a log line
    long or make it look like several."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Say:
    level: int
    text: str
    exc: BaseException | None = None  # a bug of ours: logged with its traceback


@dataclass(frozen=True)
class StartRound:
    peer: Peer
    exchange: bool  # exchange peer lists after the round


@dataclass(frozen=True)
class StartDrain:
    peer: Peer


@dataclass(frozen=True)
class Wake:
    pass


Command = Say | StartRound | StartDrain | Wake
Filter = Callable[[Sequence[bytes]], list[bytes]]  # the ops of a batch a first-release peer takes


class NodeCore:
    def __init__(self, me: bytes, *, fanout: int, budget: int, base: float, cap: float,
                 rng: random.Random, first_release_takes: Filter) -> None:
        self.me = me
        self.fanout = fanout
        self.table = PeerTable(me, rng)
        self.outbox = Outbox(OUTBOX_LIMIT, budget)
        self.schedule = Schedule(base, cap, rng)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.removed: frozenset[bytes] = frozenset()  # short ids of nodes removed from the fleet
        self.own_ahead: OwnAhead | None = None
        self.relayed: dict[bytes, str] = {}  # nodes holding a link to us (the return path) -> their address
        self._first_release_takes = first_release_takes
        self._in_round: set[str] = set()
        self._reported: set[tuple[str, str]] = set()

    # -- the schedule -----------------------------------------------------------------------

    def tick(self, now: float) -> list[Command]:
        """Rounds due now: every candidate never tried, a few random live peers, one retry."""
        out = self._expire(now)
        exchange = self.schedule.exchange_due()
        for peer in self.table.pick(ROUND_PEERS, now, busy=frozenset(self._in_round)):
            if self.is_removed(peer):
                continue
            self._in_round.add(peer.addr)
            out.append(StartRound(peer, exchange))
        return out

    def next_wait(self) -> float:
        """Seconds until the next tick, unless woken."""
        failing = any(0 < p.failures < FAIL_THRESHOLD for p in self.table.peers.values() if not p.gone)
        return self.schedule.ticked(failing=failing)

    def woken(self) -> None:
        self.schedule.woken()

    def _expire(self, now: float) -> list[Command]:
        """Forget learnt peers that stopped answering (and what was kept for them)."""
        out: list[Command] = []
        for peer in self.table.expire(now):
            self.counters["expired_peers"] += 1
            self.outbox.forget(peer.addr)
            self._reported = {k for k in self._reported if k[0] != peer.addr}
            out.append(Say(logging.INFO, f"forgot peer {peer.addr} (learnt by {peer.source}, not answering: "
                                         f"{clip(peer.last_error or '')})"))
        return out

    # -- who the peers are ----------------------------------------------------------------------

    def candidate(self, host: str, port: int, source: str, *, node: bytes | None, wire: frozenset[int] | None,
                  now: float) -> list[Command]:
        """A peer found (discovery, an exchange, its own request): remember it, sync soon."""
        out: list[Command] = []
        if node is not None and node in self.removed:
            return out  # a removed node learns so when it calls us, and is answered with the rotation only
        if self.table.add(host, port, source, node, now=now) is not None:
            out.append(Wake())
        peer = self.table.peers.get(Peer(host, port, source).addr)
        if peer is not None and wire is not None:
            out += self.stated(peer, wire)
        return out

    def stated(self, peer: Peer, wire: frozenset[int]) -> list[Command]:
        """A peer stated the wire versions it speaks; one that speaks none of ours is told once."""
        if not peer.set_wire(wire):
            return []
        return [Say(logging.WARNING, f"peer {peer.addr} {versions.negotiate(wire)}; not contacted until it states a "
                                     f"version in common")]

    def inbound(self, host: str, env: Envelope, now: float) -> list[Command]:
        """A request from a peer: learn it as an ``inbound`` peer (unless it is us)."""
        if env.port is None or not host or env.sender == self.me:
            return []
        out = self.candidate(host, env.port, "inbound", node=env.sender, wire=env.wire, now=now)
        peer = self.table.peers.get(Peer(host, env.port, "inbound").addr)
        if peer is not None:
            peer.last_seen = now
        return out

    def learnt(self, learnt: Learnt, now: float) -> list[Command]:
        out: list[Command] = []
        for rec in learnt.peers:
            out += self.candidate(rec.host, rec.port, "exchange", node=rec.node, wire=rec.wire, now=now)
        for node, name in learnt.names:  # liveness gossip: the name a node goes by (never in the op log)
            for p in self.table.peers.values():
                if p.node == node:
                    p.name = name
        return out

    def goodbye(self, node_hex: str) -> list[Command]:
        self.table.mark_gone(node_hex)
        return [Say(logging.INFO, f"peer {node_hex[:16]} said goodbye: not contacted until it announces itself "
                                  "again")]

    def set_removed(self, shorts: frozenset[bytes]) -> None:
        self.removed = shorts
        for p in self.table.peers.values():
            self.is_removed(p)

    def is_removed(self, peer: Peer) -> bool:
        """A removed node is never called again (it learns of its removal when it calls us)."""
        if peer.node is not None and peer.node in self.removed:
            peer.gone = True
        return peer.gone and peer.node in self.removed

    def new_fleet(self) -> None:
        """This node joined another fleet: the peers of the old one are no peers of ours."""
        self.table.peers.clear()
        self.outbox.clear()

    # -- the return path (``peerd.relaying``) ---------------------------------------------------

    def linked(self, host: str, env: Envelope, now: float) -> list[Command]:
        """A member nobody can call opened a link to us: its row is reachable (through the link),
        and every push and forward includes it from now on."""
        if env.sender is None or env.port is None:
            return []
        out = self.candidate(host, env.port, "inbound", node=env.sender, wire=env.wire, now=now)
        peer = self.table.peers.get(Peer(host, env.port, "inbound").addr)
        if peer is None:
            return out
        self.table.succeeded(peer, now, env.sender)
        self.relayed[env.sender] = peer.addr
        return [*out, Say(logging.INFO, f"relaying for {peer.addr} (node {env.sender.hex()}): it cannot be "
                                        "called, it keeps a link to us"), Wake()]

    def unlinked(self, node: bytes, why: str) -> list[Command]:
        addr = self.relayed.pop(node, None)
        if addr is None:
            return []
        return [Say(logging.INFO, f"no longer relaying for {addr} (node {node.hex()}): {clip(why)}")]

    def round_now(self, peer: Peer) -> list[Command]:
        """A round with ``peer`` at once (a link just came up: catch up on what it carried not)."""
        if peer.addr in self._in_round or self.is_removed(peer):
            return []
        self._in_round.add(peer.addr)
        return [StartRound(peer, exchange=False)]

    # -- pushes ------------------------------------------------------------------------------------

    def push(self, raws: list[bytes], exclude: bytes | None) -> list[Command]:
        """Queue ops for a few live peers (push on write, forwards); a peer that has not said it takes
        every op gets only those the first release takes."""
        out: list[Command] = []
        first_release: list[bytes] | None = None
        linked = frozenset(self.relayed) if self.fanout else frozenset()  # push_fanout = 0: no pushes at all
        for peer in self.table.push_targets(self.fanout, exclude=exclude, always=linked):
            if self.is_removed(peer):
                continue
            if not peer.takes_every_op and first_release is None:
                first_release = self._first_release_takes(raws)
            batch = raws if peer.takes_every_op else first_release or []
            if batch and self.outbox.add(peer.addr, batch):
                out.append(StartDrain(peer))
        return out

    def pushed(self, peer: Peer, batch: list[bytes], now: float) -> list[Command]:
        self.table.succeeded(peer, now, None)
        if peer.their_vector is not None:  # keeps its lag current until the next round
            advance_known(peer.their_vector, batch)
        return self.recovered(peer.addr, "push")

    def push_failed(self, peer: Peer, exc: BaseException, now: float) -> list[Command]:
        self.outbox.failed(peer.addr)  # a round repairs what is dropped here
        return self.peer_failed(peer, "push", exc, now)

    # -- rounds ---------------------------------------------------------------------------------------

    def replied(self, peer: Peer, answerer: bytes | None, now: float) -> bool:
        """A reply came in a round; False when it came from this node itself (dropped from the table)."""
        if answerer == self.me:
            self.table.drop_self(peer)
            return False
        self.table.succeeded(peer, now, answerer)
        return True

    def round_failed(self, peer: Peer, exc: BaseException, now: float) -> list[Command]:
        self.table.failed(peer, now, str(exc))
        if peer.incompatible:  # that was told once already (``stated``)
            return []
        return self.report_once(peer.addr, "sync", f"sync with {peer.addr} failed: {exc}")

    def round_done(self, peer: Peer, result: RoundResult, marks: dict[bytes, tuple[int, int]],
                   before: dict[bytes, int], now: float) -> list[Command]:
        """A round ended well: the peer's view of us, the counters, and whether it held more of our
        own ops than we did (``peerd.forks``)."""
        if not peer.takes_every_op:
            peer.pushed = marks
        ours = result.ours or {}  # read by the round's last step, on its worker thread
        peer.last_sync = now
        peer.their_vector = ours if result.same else {**(result.their_vector or {}), **ours}
        self.counters["rounds"] += 1
        self.counters["pulled_ops"] += result.pulled
        self.counters["pushed_ops"] += result.pushed
        out = self.recovered(peer.addr, "sync")
        if self.own_ahead is None and (ahead := own_ahead(self.me, peer.addr, result.their_vector, before, ours)):
            self.own_ahead = ahead
            out.append(Say(logging.ERROR, f"{ahead.message()}; to fix it: {FIX}"))
        return out

    def own_history(self, where: str, theirs: int, ours: int) -> list[Command]:
        """A peer at ``where`` brought an op of ours (seq ``theirs``) that we never held (our newest
        was ``ours``): this home is an older copy of itself. Told once (``peerd.forks``)."""
        if self.own_ahead is not None:
            return []
        self.own_ahead = OwnAhead(where, theirs, ours)
        return [Say(logging.ERROR, f"{self.own_ahead.message()}; to fix it: {FIX}")]

    def round_over(self, peer: Peer, *, found_work: bool) -> None:
        """A round task ended, well or not; ``found_work``: a first contact, or not in sync."""
        self._in_round.discard(peer.addr)
        if found_work:
            self.schedule.busy()

    def exchange_failed(self, peer: Peer, exc: BaseException, now: float) -> list[Command]:
        """A peer exchange after a round failed; the peer stays reachable."""
        self.counters["exchange_failures"] += 1
        if isinstance(exc, PeerdError):
            peer.last_error = f"peer exchange failed: {exc}"
            return self.report_once(peer.addr, "exchange", f"peer exchange with {peer.addr} failed: {exc}")
        return self.peer_failed(peer, "peer exchange", exc, now, unreachable=False)

    def exchanged(self, peer: Peer, learnt: Learnt, now: float) -> list[Command]:
        return self.learnt(learnt, now) + self.recovered(peer.addr, "exchange")

    # -- answering peers -----------------------------------------------------------------------------

    def answered(self, out: Outcome, sender: bytes | None, now: float) -> list[Command]:
        """Do what answering a request asked of this node: learn peers, wake up for new ops, pass a
        fresh push on to everyone but its sender (``protocol.forwarded``)."""
        cmds = self.learnt(out.learnt, now)
        self.counters["barred_ops"] += out.barred  # a removed node's, or one nobody let in (replica.membership)
        if out.new:
            self.schedule.busy()
            cmds.append(Wake())  # others may lack it too: a round soon repairs whatever the flood missed
        if out.forward:
            self.counters["forwarded_ops"] += len(out.forward)
            cmds += self.push(out.forward, exclude=sender)
        return cmds

    # -- what is told, and how often ------------------------------------------------------------------

    def peer_failed(self, peer: Peer, kind: str, exc: BaseException, now: float, *,
                    unreachable: bool = True) -> list[Command]:
        """Something went wrong talking to ``peer``, whatever the exception: counted, kept as its
        last error and, when ``unreachable``, a failure of the peer (backoff, then unreachable)."""
        self.counters["peer_errors"] += 1
        if isinstance(exc, PeerdError):
            why = str(exc)
            out = self.report_once(peer.addr, kind, f"{kind} with {peer.addr} failed: {why}")
        else:
            why = f"internal error: {type(exc).__name__}: {exc}"
            out = self.bug(f"{kind} with a peer", exc)
        if unreachable:
            self.table.failed(peer, now, why)
        else:
            peer.last_error = f"{kind} failed: {why}"
        return out

    def report_once(self, where: str, kind: str, text: str) -> list[Command]:
        """Tell ``text`` the first time ``kind`` goes wrong with ``where`` since it last worked."""
        if (where, kind) in self._reported:
            return []
        self._reported.add((where, kind))
        return [Say(logging.WARNING, clip(text))]

    def recovered(self, where: str, kind: str) -> list[Command]:
        if (where, kind) not in self._reported:
            return []
        self._reported.discard((where, kind))
        return [Say(logging.INFO, f"{kind}: {where} works again")]

    def bug(self, place: str, exc: BaseException) -> list[Command]:
        """An exception that is not ours to expect: counted, and told with its traceback once per
        place and type (a bug to fix, not a peer's fault to shrug off)."""
        self.counters["internal_errors"] += 1
        key = (place, type(exc).__name__)
        if key in self._reported:
            return []
        self._reported.add(key)
        return [Say(logging.ERROR, f"internal error while {place} (logged once): {type(exc).__name__}: {exc}", exc)]
