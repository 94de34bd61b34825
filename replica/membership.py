"""Fleet membership as ops: letting a node in, removing one, rotating the fleet key (pure rules).

Two op kinds, signed and replicated like every other op:

* ``admit``  ``{k: node key, nm: name, f: fleet id}``: a member let the node ``k`` in and gave it
  the key of fleet ``f``. Names nodes for people, and makes a node that has not written yet a member.
* ``rekey``  ``{e: epoch, f: new fleet id, ks: [[member key, sealed key], ...], rm: [[node key,
  upto], ...]}``: a member made a new fleet key and sealed it to each remaining member's node key
  (``seal_key``); every node in ``rm`` is removed, and its ops above ``upto`` are never applied.

The rules (``standing``) are a function of the *set* of membership ops every replica holds (both
kinds, from every node, removed or not: they are always stored), never of their arrival order:

* **A voice only by admission.** An op counts only if its origin was let in: a *root* of this
  replica (the founder; the members of a fleet that predates admission; for a home given only the
  fleet key, whoever let it in), or a node named by an ``admit`` that counts. A self-admit gives
  nothing. An open replica (no roots recorded: a library replica outside any fleet) lets every
  node count.
* **Removal by cutoff.** A ``rekey`` that counts removes each node it names: that node's ops
  above its cutoff (the highest seq of it the remover held) count for nothing, whatever clock they
  claim, including its own admits and rekeys. A node's cutoff is the lowest that counts.
* **Conflicts remove both sides.** Removals that cut each other off (A removes E while E removes
  A, or a longer cycle, also through the admit that let a remover in) stand for every node inside
  the conflict, at the cutoffs they gave each other; nothing else of those rekeys counts. So a
  removed node is never left in, and it cannot take others out with it beyond those who removed it.
* The *winner* is the rekey that counts with the highest (epoch, hlc, origin, seq); its key is the
  fleet key, for every member holding an entry in it. A key reached by a removed node, or one that
  leaves a member out, is mended by a new rotation (``gaps``, ``menders``).

Invariants:
* ``standing`` depends on the set of membership ops (and the replica's roots) only: any arrival
  order, with any repeats, gives the same members, removals, void ops and winner.
* A removed node's ops above its cutoff, and every op of a node never let in, are never applied
  by another replica (``barred``), whatever their kind but membership; its own replica keeps what
  it wrote.
* A body is checked in full before it counts: exactly its keys, node keys of 32 bytes, sealed keys
  of their one size, at most ``MAX_MEMBERS`` entries and ``MAX_REMOVED_PER_OP`` removals, and no
  removed node among the key holders; anything else is ``InvalidOp``.
* Sealing and opening never raise: a key that does not seal, or a sealed key that does not open
  (not ours, damaged, not 32 bytes), is None.
* Nothing here touches SQLite; ``replica.fleetstore`` stores the ops and keeps the projections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import nacl.exceptions
import nacl.public
import nacl.signing

from replica.errors import InvalidOp
from replica.graph import source_components

KIND_ADMIT = "admit"
KIND_REKEY = "rekey"
KINDS = (KIND_ADMIT, KIND_REKEY)

KEY_BYTES = 32
FLEET_KEY_BYTES = 32
SEALED_KEY_BYTES = FLEET_KEY_BYTES + nacl.public.PublicKey.SIZE + 16  # ephemeral key, MAC: 80
MAX_MEMBERS = 1000
MAX_REMOVED_PER_OP = 16
MAX_NODE_NAME = 64
FLEET_ID_CHARS = 16


# -- op bodies --------------------------------------------------------------------------------


def admit_body(node: bytes, name: str, fleet_id: str) -> dict[str, Any]:
    return {"k": node, "nm": name, "f": fleet_id}


def rekey_body(epoch: int, fleet_id: str, entries: Mapping[bytes, bytes],
               removes: Mapping[bytes, int]) -> dict[str, Any]:
    return {"e": epoch, "f": fleet_id, "ks": [[k, v] for k, v in sorted(entries.items())],
            "rm": [[k, u] for k, u in sorted(removes.items())]}


def _key(v: object, what: str) -> bytes:
    if not isinstance(v, bytes) or len(v) != KEY_BYTES:
        raise InvalidOp(f"{what} must be a {KEY_BYTES}-byte node key")
    return v


def _uint(v: object, what: str, low: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v < 2**63:
        raise InvalidOp(f"{what} must be an integer from {low} to 2^63-1")
    return v


def _fleet_id(v: object) -> None:
    if not isinstance(v, str) or len(v) != FLEET_ID_CHARS or not all(c in "0123456789abcdef" for c in v):
        raise InvalidOp(f"fleet id must be {FLEET_ID_CHARS} lower-case hex digits")


def _pairs(v: object, what: str, limit: int) -> list[list[Any]]:
    if not isinstance(v, list) or len(v) > limit or not all(isinstance(p, list) and len(p) == 2 for p in v):
        raise InvalidOp(f"{what} must be a list of at most {limit} pairs")
    return v


def check_admit(body: Mapping[str, Any]) -> None:
    if set(body) != {"k", "nm", "f"}:
        raise InvalidOp("admit body must have exactly the keys k, nm, f")
    _key(body["k"], "admitted node")
    name = body["nm"]
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NODE_NAME or not name.isprintable():
        raise InvalidOp(f"admitted node name must be printable text of 1 to {MAX_NODE_NAME} characters")
    _fleet_id(body["f"])


def check_rekey(body: Mapping[str, Any]) -> None:
    if set(body) != {"e", "f", "ks", "rm"}:
        raise InvalidOp("rekey body must have exactly the keys e, f, ks, rm")
    _uint(body["e"], "epoch", low=1)
    _fleet_id(body["f"])
    entries = _pairs(body["ks"], "key entries", MAX_MEMBERS)
    keys = [_key(k, "member") for k, _ in entries]
    if len(set(keys)) != len(keys):
        raise InvalidOp("a member has two key entries")
    for _, sealed in entries:
        if not isinstance(sealed, bytes) or len(sealed) != SEALED_KEY_BYTES:
            raise InvalidOp(f"a sealed key entry must be {SEALED_KEY_BYTES} bytes")
    removes = _pairs(body["rm"], "removals", MAX_REMOVED_PER_OP)
    gone = {_key(k, "removed node") for k, _ in removes}
    for _, upto in removes:
        _uint(upto, "removal cutoff")
    if gone & set(keys):
        raise InvalidOp("a removed node cannot hold a key entry")


CHECKS = {KIND_ADMIT: check_admit, KIND_REKEY: check_rekey}
BODY_KEYS = {KIND_ADMIT: frozenset({"k", "nm", "f"}), KIND_REKEY: frozenset({"e", "f", "ks", "rm"})}


# -- the rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    """One admit op as the rules see it: ``origin`` let ``node`` in."""

    origin: bytes
    seq: int
    hlc: int
    node: bytes
    name: str = field(default="", compare=False)
    fleet_id: str = field(default="", compare=False)

    @property
    def ident(self) -> tuple[bytes, int]:
        return (self.origin, self.seq)

    @classmethod
    def from_body(cls, origin: bytes, seq: int, hlc: int, body: Mapping[str, Any]) -> Admit:
        return cls(origin, seq, hlc, bytes(body["k"]), str(body["nm"]), str(body["f"]))


@dataclass(frozen=True)
class Rekey:
    """One rekey op as the rules see it."""

    origin: bytes
    seq: int
    hlc: int
    epoch: int
    fleet_id: str
    entries: Mapping[bytes, bytes] = field(default_factory=dict, hash=False)
    removes: Mapping[bytes, int] = field(default_factory=dict, hash=False)

    @property
    def ident(self) -> tuple[bytes, int]:
        return (self.origin, self.seq)

    @property
    def order(self) -> tuple[int, bytes, int]:
        return (self.hlc, self.origin, self.seq)

    @property
    def rank(self) -> tuple[int, int, bytes, int]:
        return (self.epoch, self.hlc, self.origin, self.seq)

    @classmethod
    def from_body(cls, origin: bytes, seq: int, hlc: int, body: Mapping[str, Any]) -> Rekey:
        return cls(origin, seq, hlc, body["e"], body["f"], {bytes(k): bytes(v) for k, v in body["ks"]},
                   {bytes(k): int(u) for k, u in body["rm"]})


FleetOp = Admit | Rekey
Ident = tuple[bytes, int]


@dataclass(frozen=True)
class Standing:
    """The fleet as a set of membership ops makes it (``standing``)."""

    removed: dict[bytes, int] = field(default_factory=dict)  # node -> cutoff (highest seq that counts)
    void: frozenset[Ident] = frozenset()  # (origin, seq) of membership ops that count for nothing
    winner: Rekey | None = None
    valid: tuple[Rekey, ...] = ()  # rekeys that count, by rank
    admitted: frozenset[bytes] | None = None  # nodes a member let in (None: an open replica, every node counts)
    conflicts: frozenset[bytes] = frozenset()  # nodes removed by a conflict of removals (``standing``)

    @property
    def epoch(self) -> int:
        return 0 if self.winner is None else self.winner.epoch

    @property
    def closed(self) -> bool:
        return self.admitted is not None

    def counts(self, origin: bytes) -> bool:
        """Whether ``origin``'s ops can count at all (it was let in, or the replica is open)."""
        return self.admitted is None or origin in self.admitted


IN, OUT, UNDEC = "in", "out", "undecided"


class _Labels:
    """The labelling of one set of membership ops (``standing``): which count (IN), which count for
    nothing (OUT), and which wait on each other (UNDEC) until a conflict is broken."""

    def __init__(self, ops: Mapping[Ident, FleetOp], roots: frozenset[bytes] | None) -> None:
        self.ops, self.roots = ops, roots
        self.by_origin: dict[bytes, list[Ident]] = {}
        self.admits_by: dict[bytes, list[Admit]] = {}
        for i in sorted(ops):
            self.by_origin.setdefault(i[0], []).append(i)
            op = ops[i]
            if isinstance(op, Admit):
                self.admits_by.setdefault(op.origin, []).append(op)
        self.attackers: dict[Ident, list[Ident]] = {i: [] for i in ops}
        for r in (op for op in ops.values() if isinstance(op, Rekey)):
            for node, upto in r.removes.items():
                for i in self.by_origin.get(node, ()):
                    if i[1] > upto:
                        self.attackers[i].append(r.ident)
        self.forced: dict[bytes, int] = {}  # removals a broken conflict made
        self.forced_out: set[Ident] = set()
        self.label: dict[Ident, str] = {}
        self.members: set[bytes] = set()

    def cut(self, i: Ident) -> bool:
        return i in self.forced_out or (i[0] in self.forced and i[1] > self.forced[i[0]])

    def ground(self) -> None:
        """The least fixpoint: an op counts when its origin was let in by ops that count and no op
        that counts removed it below it; it counts for nothing when its origin cannot be let in, or
        an op that counts removed it."""
        self.label = {i: UNDEC for i in self.ops}
        while True:
            self.members = self._reach(lambda a: self.label[a.ident] == IN)
            possible = self._reach(lambda a: self.label[a.ident] != OUT)
            changed = False
            for i in sorted(self.ops):
                if self.label[i] != UNDEC:
                    continue
                new = self._judge(i, possible)
                if new != UNDEC:
                    self.label[i] = new
                    changed = True
            if not changed:
                return

    def _judge(self, i: Ident, possible: set[bytes]) -> str:
        attackers = [self.label[a] for a in self.attackers[i]]
        if self.cut(i) or (self.roots is not None and i[0] not in possible) or IN in attackers:
            return OUT
        if (self.roots is None or i[0] in self.members) and all(a == OUT for a in attackers):
            return IN
        return UNDEC

    def _reach(self, usable: Callable[[Admit], bool]) -> set[bytes]:
        """The nodes let in from the roots through admits that are ``usable`` (and not cut)."""
        if self.roots is None:
            return set()
        seen = set(self.roots)
        todo = sorted(seen)
        while todo:
            for a in self.admits_by.get(todo.pop(), ()):
                if a.node not in seen and not self.cut(a.ident) and usable(a):
                    seen.add(a.node)
                    todo.append(a.node)
        return seen

    def break_conflicts(self) -> None:
        """Ops left undecided wait on each other in cycles (A removed E while E removed A, or longer).
        Each cycle nothing outside feeds: every removal inside it of a node inside it stands, and
        nothing else of its ops counts (a cycle of admits alone counts for nothing)."""
        undec = sorted(i for i, lab in self.label.items() if lab == UNDEC)
        edges = {i: self._edges(i, set(undec)) for i in undec}
        for comp in source_components(undec, {i: [v for v, _ in e] for i, e in edges.items()}):
            inside = set(comp)
            attacks = [(u, v) for u in comp for v, how in edges[u] if v in inside and how == "removes"]
            if not attacks:
                self.forced_out |= inside
            for u, v in attacks:
                rk = self.ops[u]
                assert isinstance(rk, Rekey)
                upto = rk.removes[v[0]]
                self.forced[v[0]] = min(self.forced.get(v[0], upto), upto)

    def _edges(self, i: Ident, among: set[Ident]) -> list[tuple[Ident, str]]:
        """What ``i`` decides among ``among``: the ops it removes, or those of the node it lets in."""
        op = self.ops[i]
        if isinstance(op, Rekey):
            return [(v, "removes") for v in among if i in self.attackers[v]]
        return [(v, "lets in") for v in self.by_origin.get(op.node, ()) if v in among]


def trusted_roots(admits: Iterable[Admit], me: bytes) -> frozenset[bytes]:
    """A home given only the fleet key (``peerd init --fleet-key``) trusts whoever let it in, and
    whoever let them in, back to nodes nobody let in: the roots of its own admission."""
    admits = list(admits)
    found: set[bytes] = set()
    todo = [me]
    while todo:
        node = todo.pop()
        for a in admits:
            if a.node == node and a.origin != me and a.origin not in found:
                found.add(a.origin)
                todo.append(a.origin)
    return frozenset(found)


def standing(rekeys: Iterable[Rekey], admits: Iterable[Admit] = (), roots: Iterable[bytes] | None = None,
             me: bytes = b"") -> Standing:
    """Who is in, who is removed from which seq on, and which rotation holds the fleet key, as one
    function of the *set* of membership ops (any arrival order, any repeats).

    ``roots``: the nodes this replica trusts without an admit (the founder; members of a fleet
    that predates admission; None: an open replica, where every node counts and only removals
    decide). Empty roots: those of this node's own admission (``trusted_roots``).

    * An op counts only if its origin was let in: a root, or named by an ``admit`` that counts.
    * A ``rekey`` that counts removes each node it names from the seq after its cutoff: every op
      of that node above it counts for nothing (a removed node cannot remove, admit or rotate
      after its cutoff). A node's cutoff is the lowest that counts.
    * Removals that conflict (each cuts off the other's op, directly or through the admit that
      let its origin in) remove every node of the conflict, at the cutoffs they gave each other,
      and nothing else of their ops counts: a removed node is never left in, and its removal of
      others outside the conflict counts for nothing (docs/security.md says why).
    * The winner is the rekey that counts with the highest (epoch, hlc, origin, seq)."""
    ops: dict[Ident, FleetOp] = {r.ident: r for r in rekeys}
    ops.update((a.ident, a) for a in admits)
    trust = None if roots is None else frozenset(roots)
    if trust is not None and not trust:
        trust = trusted_roots((op for op in ops.values() if isinstance(op, Admit)), me)
    lab = _Labels(ops, trust)
    while True:
        lab.ground()
        if UNDEC not in lab.label.values():
            break
        lab.break_conflicts()
    valid = sorted((op for i, op in ops.items() if isinstance(op, Rekey) and lab.label[i] == IN),
                   key=lambda r: r.rank)
    removed = dict(lab.forced)
    for r in valid:
        for node, upto in r.removes.items():
            removed[node] = min(removed.get(node, upto), upto)
    void = frozenset(i for i, x in lab.label.items() if x == OUT)
    admitted = None if trust is None else frozenset(lab.members)
    return Standing(removed, void, valid[-1] if valid else None, tuple(valid), admitted, frozenset(lab.forced))


def barred(st: Standing | Mapping[bytes, int], origin: bytes, seq: int, me: bytes) -> bool:
    """An op (of a kind other than membership) this replica must not apply: its origin was never
    let in, or is removed and it lies above the cutoff. A node's own ops are never barred for
    itself (it keeps what it wrote)."""
    if origin == me:
        return False
    if isinstance(st, Standing):
        if not st.counts(origin):
            return True
        removed: Mapping[bytes, int] = st.removed
    else:
        removed = st
    return origin in removed and seq > removed[origin]


def cap_vector(vector: Mapping[bytes, int], removed: Mapping[bytes, int]) -> dict[bytes, int]:
    """A vector with every removed origin held to its cutoff: what a round may ask or offer."""
    return {o: min(n, removed[o]) if o in removed else n for o, n in vector.items()}


def members(origins: Iterable[bytes], admitted: Iterable[bytes], removed: Mapping[bytes, int]) -> set[bytes]:
    """Who a rotation seals the new key to on an open replica: every node that wrote or was let in,
    less the removed."""
    return {k for k in (*origins, *admitted) if k not in removed}


def gaps(winner: Rekey | None, current: Iterable[bytes], given: Mapping[bytes, str],
         removed: Mapping[bytes, int]) -> tuple[set[bytes], set[bytes]]:
    """(members the key in force leaves out, removed nodes that hold it).

    The key in force is the winner's; with no winner it is the fleet's first key, which every node
    ever let in holds (so any removal leaves it known to a removed node: ``removed`` is returned).
    A member let in with the winner's own fleet id (``given``) needs no entry: it was given the key."""
    if winner is None:
        return set(), set(removed)
    missing = {m for m in current if m not in winner.entries and given.get(m) != winner.fleet_id}
    return missing, {k for k in winner.entries if k in removed}


def menders(winner: Rekey | None, current: Iterable[bytes]) -> list[bytes]:
    """Who mends a key that leaves out a member or reached a removed node, in turn: the winner's
    origin if it is still a member, then the other members by key."""
    now = sorted(current)
    first = [winner.origin] if winner is not None and winner.origin in now else []
    return first + [m for m in now if m not in first]


# -- sealing a fleet key to a node key ------------------------------------------------------------


def seal_key(node: bytes, fleet_key: bytes) -> bytes | None:
    """``fleet_key`` sealed to the node key ``node`` (Ed25519, converted to Curve25519); None when
    ``node`` is not a usable public key."""
    try:
        box = nacl.public.SealedBox(nacl.signing.VerifyKey(node).to_curve25519_public_key())
        return bytes(box.encrypt(fleet_key))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return None


def open_key(signing: nacl.signing.SigningKey, sealed: bytes) -> bytes | None:
    """The fleet key sealed to our node key, or None when it does not open (not ours, damaged)."""
    try:
        key = bytes(nacl.public.SealedBox(signing.to_curve25519_private_key()).decrypt(sealed))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return None
    return key if len(key) == FLEET_KEY_BYTES else None
