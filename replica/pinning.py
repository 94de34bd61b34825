"""Role pins, the replica's side: pin a role to nodes, lift a pin, read the pins in force, the
nodes that have sent in each role's name, and the refusals counted here.

Invariants:
* Pinning or unpinning writes one signed ``pin`` op (last writer wins per role across the fleet,
  ``replica.pins``); a node removed from the fleet cannot write one (its peers would refuse it).
* Nodes are named by id (hex, a prefix of at least 4 digits) or by membership name; a word that
  names no node or several is refused, and nothing is written.
* The rules live in ``replica.pins``, the SQL in ``replica.pinstore``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replica import firstseen, fleetstore, pins, pinstore
from replica.checks import required_name
from replica.core import ReplicaCore, iso
from replica.errors import InvalidArgument, NotFound
from replica.hlc import to_iso
from replica.models import NodeRef, RolePin, RoleSender, RoleSenders
from replica.names import name_key


def _ref(node: bytes, names: dict[bytes, str]) -> NodeRef:
    return NodeRef(node.hex(), names.get(node))


def _view(pin: pins.Pin, names: dict[bytes, str]) -> RolePin:
    return RolePin(pin.role, [_ref(n, names) for n in sorted(pin.nodes)], to_iso(pin.hlc), _ref(pin.origin, names),
                   pin.hlc)


class Pinning(ReplicaCore):
    def pin_role(self, role: str, nodes: Sequence[str]) -> RolePin:
        """Bind ``role`` to ``nodes`` (ids or names): from then on every replica refuses new
        messages in its name from other nodes."""
        name = required_name(role, "role")
        if isinstance(nodes, str) or not nodes:
            raise InvalidArgument("name at least one node to pin the role to (to lift a pin: peerd role unpin ROLE)")
        if len(nodes) > pins.MAX_PIN_NODES:
            raise InvalidArgument(f"a role is pinned to at most {pins.MAX_PIN_NODES} nodes")
        with self._store.read() as cur:
            found, unknown, ambiguous = pinstore.resolve(cur, [required_name(n, "node") for n in nodes])
        if unknown:
            raise NotFound(f"no node {', '.join(map(repr, unknown))} is known here (give a node id, or a name "
                           "that peerd roles or peerd peers shows)")
        if ambiguous:
            word, hits = next(iter(ambiguous.items()))
            raise InvalidArgument(f"{word!r} names {len(hits)} nodes ({', '.join(h.hex()[:16] for h in hits)}): "
                                  "give more digits of the id")
        return self._write_pin(name, found)

    def unpin_role(self, role: str) -> RolePin:
        """Lift the pin of ``role``: any member may send in its name again."""
        name = required_name(role, "role")
        with self._store.read() as cur:
            held = pins.winner(pinstore.pins_of(cur, name))
        if held is None or not held.pinned:
            raise NotFound(f"role {name!r} is not pinned")
        return self._write_pin(name, [])

    def _write_pin(self, role: str, nodes: Sequence[bytes]) -> RolePin:
        with self._store.read() as cur:
            removed = self.node_key in fleetstore.removed(cur)
        if removed:
            raise InvalidArgument("this node was removed from the fleet: members refuse its ops, so it cannot "
                                  "pin roles")
        held: dict[str, dict[bytes, int]] = {}

        def cuts(cur: Any) -> None:  # the vector inside the write: every op held before the pin is before it
            held["v"] = {bytes(r[0]): int(r[1]) for r in cur.execute(
                "SELECT node, CASE WHEN oid = ? THEN max(contig, (SELECT coalesce(max(seq), 0) FROM ops"
                " WHERE ops.oid = origins.oid)) ELSE contig END FROM origins", (self._self_oid,))}

        try:
            _lseq, op, _ = self._write_then(pins.KIND_PIN, lambda _seq, _hlc: pins.pin_body(role, nodes, held["v"]),
                                            None, cuts)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        with self._store.read() as cur:
            names = pinstore.node_names(cur)
        return _view(pins.from_body(op.body, op.hlc, op.origin), names)

    def role_pins(self) -> list[RolePin]:
        """The pins in force (lifted ones left out), by role."""
        with self._store.read() as cur:
            held, names = pinstore.in_force(cur), pinstore.node_names(cur)
        return [_view(p, names) for p in held if p.pinned]

    def role_senders(self) -> list[RoleSenders]:
        """Every role known here (``replica.firstseen``: confirmed, or seen only reading), with the
        nodes that sent in its name, and pinned roles."""
        with self._store.read() as cur:
            rows, names = pinstore.senders(cur), pinstore.node_names(cur)
            held = {name_key(p.role): p for p in pinstore.in_force(cur) if p.pinned}
            known = {key: (at, confirmed) for key, at, confirmed in firstseen.known(cur)}
        by_role: dict[str, list[RoleSender]] = {}
        shown: dict[str, str] = {}
        for role, node, count, hlc in rows:
            key = name_key(role)
            shown.setdefault(key, role)
            by_role.setdefault(key, []).append(RoleSender(_ref(node, names), count, to_iso(hlc)))
        for key, pin in held.items():
            shown.setdefault(key, pin.role)
        for key in known:
            shown.setdefault(key, key)

        def standing(key: str) -> tuple[str | None, str | None]:
            at, confirmed = known.get(key, (None, False))
            return (None if at is None else firstseen.CONFIRMED if confirmed else firstseen.UNCONFIRMED), iso(at)

        return [RoleSenders(shown[k], by_role.get(k, []),
                            [_ref(n, names) for n in sorted(held[k].nodes)] if k in held else None, *standing(k))
                for k in sorted(shown)]

    def pin_refusals(self) -> tuple[int, tuple[str, NodeRef, int, str] | None]:
        """How many ops from peers this replica refused for a pin, and the last (role, node, seq, when)."""
        with self._store.read() as cur:
            count, last, names = pinstore.refused(cur), pinstore.last_refused(cur), pinstore.node_names(cur)
        if last is None:
            return count, None
        role, origin, seq, hlc = last
        return count, (role, _ref(origin, names), seq, to_iso(hlc))

