"""Role pins: which nodes may send in a role's name (pure rules; ``replica.pinstore`` holds the SQL).

The op: kind ``pin``, body ``{r: role, n: [node key, ...], c: [[node key, seq], ...]}``; an empty
``n`` lifts the pin (an unpin). Any member may write one. Per role (matched by ``names.name_key``)
the pins form a last-writer-wins register: of a role's pin ops, the one with the highest stamp
(hlc, origin) is in force (``winner``), whatever order they arrived in.

What a pin binds: a message (``msg``) or a retraction (``rtr``) whose role (``f``) is pinned,
written by a node outside the pin, is refused. Whether an op comes *after* a pin is judged by its
writer's op sequence, never by the clock the writer claims: ``c`` holds the **cuts**, for each node
the pin does not name, the highest seq of it the pinning replica held (its version vector), and an
op of node ``x`` with seq ``s`` is after the pin iff ``s`` is above ``x``'s cut (0 for a node the
pinner held nothing of). An op is judged by the pin in force just before it (``binding``): the
winner among the role's pins it is after (the pins whose writer had not seen it). So a message the
node wrote before the pin (its seq at or below its cut) is never refused because of it, and a
message written after it is refused whatever stamp it carries. A later pin (a move or a lift)
carries cuts of its own: an op after it is judged by it, one before it by the pins before.

A pin op without ``c`` (written by a release before cuts, ``Pin.cuts`` None) is judged as that
release judged it: an op is after it iff the op's own stamp is above the pin's.

Invariants:
* ``winner``, ``binding`` and ``allows`` are functions of the set of pins alone: commutative,
  associative and idempotent in the pins they are given (``tests/test_pins.py``).
* Without a pin, or under an unpin, ``allows`` is always True: nothing changes.
* A pin never binds an op its writer had seen (seq at or below its cut): pins written later
  cannot take back what a pinner saw before it pinned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replica.errors import InvalidOp

KIND_PIN = "pin"
BODY_KEYS = frozenset({"r", "n"})  # what a pin op of the release before cuts has
CUTS_KEY = "c"
KNOWN_KEYS = BODY_KEYS | {CUTS_KEY}
NODE_BYTES = 32
MAX_PIN_NODES = 64
MAX_CUTS = 1000  # one per member of the fleet (``membership.MAX_MEMBERS``)
MAX_SEQ = 2**63 - 1
MAX_ROLE_CHARS = 256
BOUND_KINDS = frozenset({"msg", "rtr"})  # the ops in a role's name a pin binds


@dataclass(frozen=True)
class Pin:
    """One pin op of a role: ``nodes`` empty means unpinned; ``cuts`` None: a pin op without cuts."""

    role: str
    nodes: frozenset[bytes]
    hlc: int
    origin: bytes
    cuts: Mapping[bytes, int] | None = None

    @property
    def stamp(self) -> tuple[int, bytes]:
        return (self.hlc, self.origin)

    @property
    def pinned(self) -> bool:
        return bool(self.nodes)

    def precedes(self, origin: bytes, seq: int, hlc: int) -> bool:
        """Whether this pin comes before the op (origin, seq, hlc), so may bind it: its writer's seq above its cut,
        or (a pin without cuts) its stamp above the pin's."""
        if self.cuts is None:
            return self.hlc < hlc
        return seq > self.cuts.get(origin, 0)


def pin_body(role: str, nodes: Sequence[bytes], held: Mapping[bytes, int]) -> dict[str, Any]:
    """The body of a pin op (sorted, unique nodes; none: an unpin), with the cuts of ``held``
    (this replica's vector): every node it holds ops of but those pinned, by key."""
    named = set(nodes)
    cuts = sorted([k, s] for k, s in held.items() if k not in named and s > 0)
    if len(cuts) > MAX_CUTS:
        raise ValueError(f"a pin holds the cuts of at most {MAX_CUTS} nodes; this replica holds ops of {len(cuts)}")
    return {"r": role, "n": sorted(named), CUTS_KEY: cuts}


def _check_cuts(cuts: object, nodes: Sequence[bytes]) -> None:
    if not isinstance(cuts, list) or len(cuts) > MAX_CUTS:
        raise InvalidOp(f"pin cuts must be a list of at most {MAX_CUTS} [node key, seq] pairs")
    keys = []
    for cut in cuts:
        if not (isinstance(cut, list) and len(cut) == 2 and isinstance(cut[0], bytes) and len(cut[0]) == NODE_BYTES
                and isinstance(cut[1], int) and not isinstance(cut[1], bool) and 1 <= cut[1] <= MAX_SEQ):
            raise InvalidOp(f"a pin cut must be [32-byte node key, seq from 1 to {MAX_SEQ}]")
        keys.append(cut[0])
    if keys != sorted(set(keys)):
        raise InvalidOp("pin cuts name each node once, by increasing key")
    if set(keys) & set(nodes):
        raise InvalidOp("a pin holds no cut for a node it pins the role to")


def check_pin(body: Mapping[str, Any]) -> bool:
    """Check a pin body in full; True when this release knows every field (False: a newer
    release's fields beside them, kept and not applied)."""
    if not set(body) >= BODY_KEYS:
        raise InvalidOp("pin body must have the keys r, n (and c)")
    role, nodes = body["r"], body["n"]
    if not isinstance(role, str) or not role or len(role) > MAX_ROLE_CHARS:
        raise InvalidOp(f"pinned role must be a non-empty string of at most {MAX_ROLE_CHARS} chars")
    if not isinstance(nodes, list) or len(nodes) > MAX_PIN_NODES:
        raise InvalidOp(f"pinned nodes must be a list of at most {MAX_PIN_NODES} node keys")
    if not all(isinstance(n, bytes) and len(n) == NODE_BYTES for n in nodes):
        raise InvalidOp("a pinned node must be a 32-byte node key")
    if len(set(nodes)) != len(nodes):
        raise InvalidOp("a pin names each node once")
    if CUTS_KEY in body:
        _check_cuts(body[CUTS_KEY], nodes)
    return set(body) <= KNOWN_KEYS


CHECKS = {KIND_PIN: check_pin}


def cuts_of(body: Mapping[str, Any]) -> dict[bytes, int] | None:
    """The cuts of a pin body, or None for a pin op without them."""
    cuts = body.get(CUTS_KEY)
    return None if cuts is None else {bytes(k): int(s) for k, s in cuts}


def from_body(body: Mapping[str, Any], hlc: int, origin: bytes) -> Pin:
    return Pin(str(body["r"]), frozenset(bytes(n) for n in body["n"]), hlc, origin, cuts_of(body))


def winner(pins: Iterable[Pin]) -> Pin | None:
    """The pin in force: the highest stamp (hlc, origin) of a role's pins; None without any."""
    return max(pins, key=lambda p: p.stamp, default=None)


def binding(pins: Iterable[Pin], origin: bytes, seq: int, hlc: int) -> Pin | None:
    """The pin in force just before the op (origin, seq, hlc): the winner of the pins it is after."""
    return winner(p for p in pins if p.precedes(origin, seq, hlc))


def allows(pins: Iterable[Pin], origin: bytes, seq: int, hlc: int) -> bool:
    """Whether node ``origin`` may write its op ``seq`` (stamped ``hlc``) in the name of the role
    these pins are of."""
    bound = binding(pins, origin, seq, hlc)
    return bound is None or not bound.pinned or origin in bound.nodes


def binds(kind: str, body: Mapping[str, Any]) -> str | None:
    """The role an op is written in the name of, when a pin can bind it; else None."""
    if kind not in BOUND_KINDS:
        return None
    role = body.get("f")
    return role if isinstance(role, str) else None


def refusal(role: str, nodes: Iterable[bytes], names: Mapping[bytes, str]) -> str:
    """The sentence a refused local write is told: the role and the nodes it is pinned to."""
    who = ", ".join(f"{names[n]} ({n.hex()[:16]})" if n in names else n.hex()[:16] for n in sorted(nodes))
    return (f"role {role!r} is pinned to {who}: only those nodes may send in its name "
            f"(lift it with: peerd role unpin {role})")
