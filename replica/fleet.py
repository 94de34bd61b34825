"""Fleet membership, the replica's side: admit a node, remove one (rotating the key), read the standing.

Invariants:
* Removing writes one ``rekey`` op: the removed node with its cutoff (the highest seq of it this
  replica holds contiguously), and a fresh fleet key sealed to every remaining member, this node
  included. The caller makes the key; the replica never keeps a fleet key in clear.
* A node cannot remove itself, remove a node twice, or rotate once it was removed itself.
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
    admitted: dict[bytes, Admitted] = field(default_factory=dict)
    origins: tuple[bytes, ...] = ()  # every node that wrote an op held here

    @property
    def members(self) -> set[bytes]:
        """Every node that wrote or was let in, this one included, less the removed."""
        return mem.members((*self.origins, self.me), self.admitted, self.standing.removed)

    def name_of(self, node: bytes) -> str | None:
        a = self.admitted.get(node)
        return None if a is None else a.name

    def gaps(self) -> tuple[set[bytes], set[bytes]]:
        given = {k: a.fleet_id for k, a in self.admitted.items()}
        return mem.gaps(self.standing.winner, self.members, given, self.standing.removed)


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

    def fleet_view(self) -> FleetView:
        with self._store.read() as cur:
            rekeys = fleetstore.rekeys(cur)
            admitted = {bytes(r[0]): Admitted(bytes(r[0]), str(r[1]), str(r[2]))
                        for r in cur.execute("SELECT node, name, fleet FROM fleet_admits")}
            origins = tuple(bytes(r[0]) for r in cur.execute("SELECT node FROM origins WHERE contig > 0 OR top > 0"))
        return FleetView(self.node_key, mem.standing(rekeys), admitted, origins)

    def fleet_keys(self) -> FleetKeys:
        view = self.fleet_view()
        st, me = view.standing, self.node_key
        opened = [k for r in st.valid if me in r.entries and (k := mem.open_key(self._ident.signing_key,
                                                                               r.entries[me])) is not None]
        win = st.winner
        current = mem.open_key(self._ident.signing_key, win.entries[me]) if win and me in win.entries else None
        by = next((r.origin for r in st.valid if me in r.removes), None)
        return FleetKeys(current, tuple(dict.fromkeys(opened)), st.epoch, me in st.removed, by, view)

    def rekey_ops(self) -> list[bytes]:
        """Every rekey op held (what a member still on an old key needs to catch up)."""
        with self._store.read() as cur:
            rows = cur.execute("SELECT o.blob FROM fleet_rekeys r JOIN ops o ON o.lseq = r.lseq ORDER BY r.lseq")
            return [bytes(r[0]) for r in rows if r[0]]

    # -- writing -----------------------------------------------------------------------------

    def admit_node(self, node: bytes, name: str, fleet_id: str) -> None:
        """Record that ``node`` was let in with the key of ``fleet_id``."""
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
        """A new fleet key for the members as they stand (mends a rotation that missed someone)."""
        return self._rotate(self.fleet_view(), new_key, fleet_id, {})

    def _rotate(self, view: FleetView, new_key: bytes, fleet_id: str, removes: dict[bytes, int]) -> mem.Rekey:
        if self.node_key in view.standing.removed:
            raise InvalidArgument("this node was removed from the fleet; it can no longer change it")
        if len(new_key) != mem.FLEET_KEY_BYTES:
            raise InvalidArgument(f"a fleet key has {mem.FLEET_KEY_BYTES} bytes")
        keep = view.members - set(removes)
        entries = {m: sealed for m in sorted(keep) if (sealed := mem.seal_key(m, new_key)) is not None}
        if len(entries) > mem.MAX_MEMBERS:
            raise InvalidArgument(f"a fleet has at most {mem.MAX_MEMBERS} members")
        body = mem.rekey_body(view.standing.epoch + 1, fleet_id, entries, removes)
        _lseq, op = self._write_fleet_op(mem.KIND_REKEY, body)
        return mem.Rekey.from_body(op.origin, op.seq, op.hlc, op.body)

    def _write_fleet_op(self, kind: str, body: dict[str, Any]) -> Any:
        out = self._write(kind, const_body(body))
        self.fleet_changes += 1
        return out
