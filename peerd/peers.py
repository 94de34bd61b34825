"""The peer table: who we know, how we found them, and whether they answer.

Pure data and rules, no I/O. Invariants: a peer is keyed by its address
(host, port); a node never lists itself; a peer that fails is retried after
an exponential backoff and is marked unreachable after ``FAIL_THRESHOLD``
consecutive failures; any success resets both.

A peer that states wire versions none of which this release speaks
(``protocol.versions``) is *incompatible*: it is never picked for a round or
a push (so never retried in a loop) until it states versions again, and the
table says so once (``set_wire`` returns the change).

The table stays bounded and current: peers learnt second hand (``exchange``)
or from a caller's envelope (``inbound``) are only added while the table
holds fewer than ``MAX_PEERS`` rows, and ``expire`` drops such a peer once
it has failed ``FAIL_THRESHOLD`` times without ever answering, or has not
answered for ``STALE_AFTER`` seconds while failing. Peers from seeds and mDNS
are never expired (their sources re-announce or say goodbye themselves).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from discovery.seeds import format_seed
from peerd.protocol import versions
from peerd.protocol.exchange import PeerRecord
from replica import vector as vec

FAIL_THRESHOLD = 3
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0
SOURCE_RANK = {"seed": 0, "mdns": 1, "exchange": 2, "inbound": 3}
LEARNT = ("exchange", "inbound")  # sources whose rows expire
MAX_PEERS = 1000  # rows the table holds before it stops taking learnt ones
STALE_AFTER = 600.0  # seconds a learnt peer may go unanswered (and failing) before its row is dropped


def backoff(failures: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait before trying a peer again after ``failures`` failures in a row."""
    return 0.0 if failures <= 0 else min(cap, base * 2 ** (failures - 1))


@dataclass
class Peer:
    host: str
    port: int
    source: str
    node: bytes | None = None  # short node id, once learned
    addresses: list[str] = field(default_factory=list)
    last_seen: float | None = None
    last_sync: float | None = None
    failures: int = 0
    next_try: float = 0.0
    their_vector: dict[bytes, int] | None = None
    last_error: str | None = None
    gone: bool = False  # said goodbye (mDNS) or removed
    name: str | None = None  # the name the node goes by (config `name`), learnt by peer exchange
    added: float = 0.0  # when it entered the table (monotonic seconds)
    wire: frozenset[int] | None = None  # the wire versions it speaks, once stated (None: not known yet)
    pushed: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # rounds.Pushed, for a wire-2 peer

    @property
    def incompatible(self) -> bool:
        """It speaks no wire version this release speaks."""
        return self.wire is not None and isinstance(versions.negotiate(self.wire), versions.NoCommon)

    @property
    def takes_every_op(self) -> bool:
        """It stores ops it does not know (wire 3 or later); until it has said so, it is sent only
        what the first release takes."""
        return versions.takes_every_op(self.wire)

    def set_wire(self, wire: frozenset[int] | None) -> bool:
        """Record what the peer stated; True when that made it incompatible (tell people once)."""
        if wire is None or wire == self.wire:
            return False
        was = self.incompatible
        self.wire = wire
        if self.takes_every_op:
            self.pushed.clear()
        return self.incompatible and not was

    def wire_text(self) -> str | None:
        """The version in use, or why there is none; None while not known."""
        if self.wire is None:
            return None
        return str(versions.negotiate(self.wire))

    @property
    def addr(self) -> str:
        return format_seed(self.host, self.port)

    @property
    def reachable(self) -> bool:
        return (not self.gone and self.failures < FAIL_THRESHOLD and self.last_seen is not None
                and not self.incompatible)

    def lag(self, ours_short: dict[bytes, int]) -> int | None:
        """Ops we hold that this peer lacks, as far as we know."""
        return None if self.their_vector is None else vec.lag(self.their_vector, ours_short)

    def to_dict(self, ours_short: dict[bytes, int], now: float) -> dict[str, Any]:
        return {
            "address": self.addr, "node_id": self.node.hex() if self.node else None, "name": self.name,
            "found_by": self.source,
            "addresses": self.addresses or [self.host], "reachable": self.reachable,
            "last_seen_ago": None if self.last_seen is None else round(now - self.last_seen, 3),
            "last_sync_ago": None if self.last_sync is None else round(now - self.last_sync, 3),
            "failures": self.failures, "lag": self.lag(ours_short), "last_error": self.last_error,
            "wire": self.wire_text(),
        }


def _stale(p: Peer, now: float, stale_after: float) -> bool:
    if p.last_seen is None and p.failures >= FAIL_THRESHOLD:
        return True
    return p.failures > 0 and now - (p.added if p.last_seen is None else p.last_seen) >= stale_after


class PeerTable:
    def __init__(self, me: bytes, rng: random.Random | None = None) -> None:
        self.me = me
        self.peers: dict[str, Peer] = {}
        self.rng = rng or random.Random()  # jitter and choices; a test passes a seeded one

    def add(self, host: str, port: int, source: str, node: bytes | None = None, now: float = 0.0) -> Peer | None:
        """Record a candidate; returns the peer if it is new. Never adds ourselves, nor a
        learnt peer once the table holds ``MAX_PEERS``."""
        if node is not None and node == self.me:
            return None
        key = Peer(host, port, source).addr
        peer = self.peers.get(key)
        if peer is None:
            if node is not None and any(p.node == node and p.reachable for p in self.peers.values()):
                return None  # same node already reachable at another address
            if source in LEARNT and len(self.peers) >= MAX_PEERS:
                return None
            peer = self.peers[key] = Peer(host, port, source, node, added=now)
            return peer
        if node is not None:
            peer.node = node
        if SOURCE_RANK[source] < SOURCE_RANK.get(peer.source, len(SOURCE_RANK)):
            peer.source = source  # report the most direct way we know the peer by
        if peer.gone and source != "exchange":  # it announced itself or contacted us: back
            peer.gone = False
        return None

    def drop_self(self, peer: Peer) -> None:
        self.peers.pop(peer.addr, None)

    def expire(self, now: float, stale_after: float = STALE_AFTER) -> list[Peer]:
        """Drop learnt peers that never answered and failed ``FAIL_THRESHOLD`` times, or that
        have not answered for ``stale_after`` seconds and are failing; returns them."""
        gone = [p for p in self.peers.values() if p.source in LEARNT and _stale(p, now, stale_after)]
        for p in gone:
            del self.peers[p.addr]
        return gone

    def succeeded(self, peer: Peer, now: float, node: bytes | None) -> None:
        if node is not None:
            peer.node = node
        peer.last_seen = now
        peer.failures = 0
        peer.next_try = 0.0
        peer.last_error = None
        peer.gone = False

    def failed(self, peer: Peer, now: float, error: str) -> None:
        peer.failures += 1
        peer.next_try = now + backoff(peer.failures) * self.rng.uniform(0.8, 1.2)
        peer.last_error = error

    def mark_gone(self, node_hex: str) -> None:
        for p in self.peers.values():
            if p.node is not None and node_hex.startswith(p.node.hex()):
                p.gone = True

    def due(self, now: float) -> list[Peer]:
        return [p for p in self.peers.values() if not p.gone and not p.incompatible and p.next_try <= now]

    def live(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.reachable]

    def pick(self, k: int, now: float, exclude: bytes | None = None, busy: frozenset[str] = frozenset()) -> list[Peer]:
        """Peers to sync with now: every candidate never tried yet, then up to ``k`` random
        live ones, plus one failing peer whose backoff has passed (so it is retried)."""
        due = [p for p in self.due(now) if (exclude is None or p.node != exclude) and p.addr not in busy]
        fresh = [p for p in due if p.last_sync is None and p.failures == 0]
        live = [p for p in due if p.reachable and p not in fresh]
        retry = [p for p in due if not p.reachable and p not in fresh]
        self.rng.shuffle(live)
        self.rng.shuffle(retry)
        return fresh + live[: max(0, k - len(fresh))] + retry[:1]

    def push_targets(self, k: int, exclude: bytes | None = None, always: frozenset[bytes] = frozenset()) -> list[Peer]:
        """Up to ``k`` random live peers for push on write, plus one row of each live node in
        ``always`` (the members we relay for: nobody else can reach them)."""
        live = [p for p in self.live() if exclude is None or p.node != exclude]
        self.rng.shuffle(live)
        linked: dict[bytes, Peer] = {}
        for p in live:
            if p.node is not None and p.node in always:
                linked.setdefault(p.node, p)
        return list(linked.values()) + [p for p in live if p.node not in always][:k]

    def exchange_records(self, now: float) -> list[PeerRecord]:
        """The peers we would tell another node about: the reachable ones."""
        return [PeerRecord(p.host, p.port, p.node, p.name, now - p.last_seen, p.wire)
                for p in self.live() if p.last_seen is not None]
