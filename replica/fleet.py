"""Fleet membership, the replica's side: admit a node, remove one (rotating the key), rotate the key,
the roots this replica trusts, and the standing.

Invariants:
* Removing writes one ``rekey`` op: the removed node with its cutoff (the highest seq of it this
  replica holds contiguously), and a fresh fleet key sealed to every remaining member, this node
  included; rotating writes one with no removal. Its epoch is above every rekey held, so it ranks
  first. The caller makes the key; the replica never keeps a fleet key in clear.
* A node cannot remove itself, remove a node twice, admit a removed node, or change the fleet once
  it was removed itself or while nobody let it in (its ops would count for nothing).
* ``keys`` opens only entries sealed to this node's own key; ``rules`` live in ``replica.membership``
  and the SQL in ``replica.fleetstore``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nacl.signing import SigningKey

from replica import fleetstore
from replica import identity as idmod
from replica import membership as mem
from replica.core import const_body
from replica.errors import InvalidArgument, NotFound
from replica.ops import Op
from replica.store import Store
from replica.sync import Sync


@dataclass(frozen=True)
class Admitted:
    node: bytes
    name: str
    fleet_id: str  # the fleet whose key it was given


@dataclass(frozen=True)
class FleetView:
    """What this replica knows of the fleet's membership."""

    me: bytes
    standing: mem.Standing
    admitted: dict[bytes, Admitted] = field(default_factory=dict)  # the newest admit naming each node
    origins: tuple[bytes, ...] = ()  # every node that wrote an op held here

    @property
    def members(self) -> set[bytes]:
        """Who holds the fleet key by right: the nodes let in, less the removed (on an open replica:
        every node that wrote or was named, this one included, less the removed)."""
        st = self.standing
        if st.admitted is not None:
            return {k for k in st.admitted if k not in st.removed}
        return mem.members((*self.origins, self.me), self.admitted, st.removed)

    def name_of(self, node: bytes) -> str | None:
        a = self.admitted.get(node)
        return None if a is None else a.name

    def gaps(self) -> tuple[set[bytes], set[bytes]]:
        given = {k: a.fleet_id for k, a in self.admitted.items()}
        return mem.gaps(self.standing.winner, self.members, given, self.standing.removed)

    def menders(self) -> list[bytes]:
        """Who re-rotates, in turn, when ``gaps`` finds the key in force wanting."""
        return mem.menders(self.standing.winner, self.members)


@dataclass(frozen=True)
class FleetKeys:
    """The fleet keys sealed to this node: the current one (None: none sealed to us in the winning
    rotation), every one it ever opened (oldest first), and whether it was removed."""

    current: bytes | None
    opened: tuple[bytes, ...]
    epoch: int
    removed: bool
    removed_by: bytes | None = None
    view: FleetView | None = field(default=None, repr=False)  # what they were read from


class Fleet(Sync):
    def __init__(self, st: Store, ident: idmod.Identity, **kw: Any) -> None:
        super().__init__(st, ident, **kw)
        with st.write() as cur:
            fleetstore.remember_self(cur, ident.public_key)

    @property
    def signing_key(self) -> SigningKey:
        """This node's private key (pairing boxes the fleet key from it; it never leaves the process)."""
        return self._ident.signing_key

    def removed(self) -> dict[bytes, int]:
        """Removed node -> the highest of its seqs that is kept."""
        with self._store.read() as cur:
            return fleetstore.removed(cur)

    def barring(self) -> tuple[dict[bytes, int], frozenset[bytes] | None]:
        """(removed node -> cutoff, the nodes let in; None on an open replica): what a round may ask for."""
        with self._store.read() as cur:
            let_in = (frozenset(bytes(r[0]) for r in cur.execute("SELECT node FROM fleet_members"))
                      if fleetstore.closed(cur) else None)
            return fleetstore.removed(cur), let_in

    def fleet_view(self) -> FleetView:
        with self._store.read() as cur:
            standing = fleetstore.standing(cur)
            admitted = {bytes(r[0]): Admitted(bytes(r[0]), str(r[1]), str(r[2]))
                        for r in cur.execute("SELECT node, name, fleet FROM fleet_admits")}
            origins = tuple(bytes(r[0]) for r in cur.execute("SELECT node FROM origins WHERE contig > 0 OR top > 0"))
        return FleetView(self.node_key, standing, admitted, origins)

    def fleet_keys(self) -> FleetKeys:
        view = self.fleet_view()
        st, me = view.standing, self.node_key
        opened = [k for r in st.valid if me in r.entries and (k := mem.open_key(self._ident.signing_key,
                                                                               r.entries[me])) is not None]
        win = st.winner
        current = mem.open_key(self._ident.signing_key, win.entries[me]) if win and me in win.entries else None
        by = next((r.origin for r in st.valid if me in r.removes), None)
        return FleetKeys(current, tuple(dict.fromkeys(opened)), st.epoch, me in st.removed, by, view)

    def membership_ops(self) -> list[bytes]:
        """Every membership op held, as signed: what a member on another key, a snapshot taker or a
        peer whose set differs (``fleet_digest``) needs to decide as we do."""
        with self._store.read() as cur:
            return fleetstore.blobs(cur)

    def fleet_digest(self) -> bytes:
        """A digest of the set of membership ops held (equal digests: the same standing)."""
        with self._store.read() as cur:
            return fleetstore.digest(cur)

    # -- roots: whom this replica trusts without an admit ------------------------------------------

    def fleet_roots(self) -> frozenset[bytes] | None:
        """The nodes this replica trusts without an admit (None: an open replica, outside any fleet)."""
        with self._store.read() as cur:
            return fleetstore.roots(cur)

    def roots_to_give(self) -> frozenset[bytes]:
        """The roots a machine this node lets in should trust: ours, or those of our own admission
        (a home given only the fleet key), or this node alone (an open replica)."""
        with self._store.read() as cur:
            roots = fleetstore.roots(cur)
            admits = fleetstore.read_ops(cur)[1]
        if roots is None:
            return frozenset({self.node_key})
        return roots or mem.trusted_roots(admits, self.node_key)

    def set_fleet_roots(self, nodes: frozenset[bytes]) -> None:
        """Close the replica on ``nodes``: a new fleet's founder is its own root; a machine let in
        takes the roots of the member that let it in; a home given only the fleet key takes none
        (the roots of its own admission, ``membership.trusted_roots``)."""
        with self._store.write() as cur:
            fleetstore.set_roots(cur, frozenset(nodes))
        self.fleet_changes += 1

    def close_open_fleet(self) -> frozenset[bytes] | None:
        """A replica still open (written before admission was required, or never in a fleet) is
        closed on the members it knows: every node that wrote or was named, less the removed, and this
        one. Those stay members without an admit; others need one. Returns the roots set, or None
        when the replica was closed already."""
        with self._store.read() as cur:
            if fleetstore.closed(cur):
                return None
        known = frozenset(self.fleet_view().members | {self.node_key})
        self.set_fleet_roots(known)
        return known

    def vouch_for_roots(self, fleet_id: str) -> int:
        """Write an admit for each root no other node let in, so that replicas closed on fewer roots
        (they learnt of it later) count it too: the local trust of an upgrade becomes the fleet's.
        Returns how many were written."""
        roots = self.fleet_roots() or frozenset()
        view = self.fleet_view()
        with self._store.read() as cur:
            named = {a.node for a in fleetstore.read_ops(cur)[1] if a.origin != a.node}
        todo = sorted(r for r in roots if r != self.node_key and r not in named and r not in view.standing.removed)
        for node in todo:
            self.admit_node(node, view.name_of(node) or f"node-{node.hex()[:8]}", fleet_id)
        return len(todo)

    # -- writing -----------------------------------------------------------------------------

    def admit_node(self, node: bytes, name: str, fleet_id: str) -> None:
        """Record that ``node`` was let in with the key of ``fleet_id`` (this node naming itself
        needs nothing; letting another in needs this node to be a member that counts)."""
        if node != self.node_key:
            view = self.fleet_view()
            if node in view.standing.removed:
                raise InvalidArgument(f"node {node.hex()[:16]} was removed from the fleet; a removed node key "
                                      "can never join again (that machine joins with a fresh home)")
            self._require_member(view)
        self._write_fleet_op(mem.KIND_ADMIT, mem.admit_body(node, name, fleet_id))

    def remove_node(self, node: bytes, new_key: bytes, fleet_id: str) -> mem.Rekey:
        """Remove ``node``: cut its ops off at what we hold, and seal ``new_key`` to everyone else."""
        view = self.fleet_view()
        if node == self.node_key:
            raise InvalidArgument("a node cannot remove itself; run `peerd remove` on another member")
        if node in view.standing.removed:
            raise InvalidArgument(f"node {node.hex()[:16]} is already removed")
        if node not in view.origins and node not in view.admitted:
            raise NotFound(f"no node {node.hex()[:16]} is known in this fleet")
        upto = self.vector().get(node, 0)
        return self._rotate(view, new_key, fleet_id, {node: upto})

    def rotate(self, new_key: bytes, fleet_id: str) -> mem.Rekey:
        """A new fleet key for the members as they stand, removing nobody: after a leaked key, and to
        mend a rotation that missed someone or reached a removed node."""
        return self._rotate(self.fleet_view(), new_key, fleet_id, {})

    def _require_member(self, view: FleetView) -> None:
        st = view.standing
        if self.node_key in st.removed:
            raise InvalidArgument("this node was removed from the fleet; it can no longer change it")
        if not st.counts(self.node_key):
            raise InvalidArgument("this node was never admitted to the fleet, so its membership changes would "
                                  "count for nothing; let it in from a member first (`peerd admit` there)")

    def _rotate(self, view: FleetView, new_key: bytes, fleet_id: str, removes: dict[bytes, int]) -> mem.Rekey:
        self._require_member(view)
        if len(new_key) != mem.FLEET_KEY_BYTES:
            raise InvalidArgument(f"a fleet key has {mem.FLEET_KEY_BYTES} bytes")
        keep = view.members - set(removes)
        entries = {m: sealed for m in sorted(keep) if (sealed := mem.seal_key(m, new_key)) is not None}
        if len(entries) > mem.MAX_MEMBERS:
            raise InvalidArgument(f"a fleet has at most {mem.MAX_MEMBERS} members")
        with self._store.read() as cur:
            epoch = max((r.epoch for r in fleetstore.rekeys(cur)), default=0) + 1  # above every one, void or not
        body = mem.rekey_body(epoch, fleet_id, entries, removes)
        _lseq, op = self._write_fleet_op(mem.KIND_REKEY, body)
        return mem.Rekey.from_body(op.origin, op.seq, op.hlc, op.body)

    def _write_fleet_op(self, kind: str, body: dict[str, Any]) -> tuple[int, Op]:
        lseq, op, _ = self._write_then(kind, const_body(body), lambda cur, _op: fleetstore.settle(cur))
        self.fleet_changes += 1
        return lseq, op
