"""Peer exchange (``peers``): the peers a node can reach, and the names nodes go by.

Request and reply are alike: ``{t: peers, nm: <own name>, k: [record, ...]}``, a
record being ``{a: host, p: port, n: short id | nil, nm: name | nil, s: seconds
since heard from, V?: the wire versions it speaks (``versions``), when known}``.
``peerd doctor`` probes with ``{t: peers, k: []}``: no envelope, so the answerer records nothing about the prober.

Invariants: at most ``RECORDS_MAX`` records are taken from one message; each
record is judged on its own: one whose host and port a ``--seed`` entry could
not hold (``discovery.seeds.parse_address``: a host name with labels of at most
63 ASCII characters or an IP literal, a port int in 1..65535, never a bool) or
whose node id is not ``SHORT`` bytes is skipped, never the whole message; a name
is kept only when it is a string of 1 to ``NAME_MAX`` characters and names a
known node id. What is learnt is a candidate, never a working peer: that takes
a sealed request the candidate answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from discovery.seeds import parse_address
from discovery.source import SeedError
from peerd.protocol import versions
from peerd.protocol.wire import PEERS, SHORT, Msg, envelope, need, node_name

RECORDS_MAX = 1000


@dataclass(frozen=True)
class PeerRecord:
    """One peer as an exchange names it."""

    host: str
    port: int
    node: bytes | None = None
    name: str | None = None
    seen_ago: float = 0.0  # seconds since the sender last heard from it (not used by a receiver)
    wire: frozenset[int] | None = None  # the wire versions it speaks, as far as the sender knows

    def to_wire(self) -> Msg:
        out = {"a": self.host, "p": self.port, "n": self.node, "nm": self.name, "s": round(self.seen_ago, 1)}
        if self.wire:
            out[versions.KEY] = versions.mask(self.wire)
        return out


@dataclass(frozen=True)
class Learnt:
    """What an exchange message taught: peer candidates, and (node, name) pairs."""

    peers: tuple[PeerRecord, ...] = ()
    names: tuple[tuple[bytes, str], ...] = ()


def peers_message(name: str, records: Sequence[PeerRecord]) -> Msg:
    return {"t": PEERS, "nm": name, "k": [r.to_wire() for r in records]}


def probe() -> Msg:
    """A ``peers`` request that names nothing of ours (``peerd doctor``)."""
    return {"t": PEERS, "k": []}


def _record(raw: object) -> PeerRecord | None:
    """One record as a candidate, or None when it is not one a seed entry could be."""
    if not isinstance(raw, dict):
        return None
    try:
        where = parse_address(raw.get("a"), raw.get("p"))
    except SeedError:
        return None
    node = raw.get("n")
    if node is not None and not (isinstance(node, bytes) and len(node) == SHORT):
        return None
    return PeerRecord(where.host, where.port, node, node_name(raw.get("nm")),
                      wire=versions.from_mask(raw.get(versions.KEY)))


def learn(msg: Msg) -> Learnt:
    """Candidates and names from a ``peers`` request or reply (its sender's own name included)."""
    records = [r for r in map(_record, need(msg, "k", list)[:RECORDS_MAX]) if r is not None]
    names = [(r.node, r.name) for r in records if r.node is not None and r.name is not None]
    sender = envelope(msg)
    if sender.sender is not None and sender.name is not None:
        names.append((sender.sender, sender.name))
    return Learnt(tuple(records), tuple(names))
