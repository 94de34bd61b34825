"""Role pins: which nodes may send in a role's name (pure rules; ``replica.pinstore`` holds the SQL).

The op: kind ``pin``, body ``{r: role, n: [node key, ...]}``; an empty ``n`` lifts the pin (an
unpin). Any member may write one. Per role (matched by ``names.name_key``) the pins form a
last-writer-wins register: of a role's pin ops, the one with the highest stamp (hlc, origin) is
in force (``winner``), whatever order they arrived in.

What a pin binds: a message (``msg``) or a retraction (``rtr``) whose role (``f``) is pinned,
written by a node outside the pin, is refused. "New" is judged by the op's own stamp, never by
when it arrives: an op is measured against the pin in force *just before its HLC*
(``binding_at``: the winner among the role's pins stamped strictly below it). So a message sent
before the pin (in HLC order) is never refused because of it, a message stamped after it is
refused by every replica that holds the pin when the message lands, and a replica that stored a
message before it heard of the pin keeps it (nothing stored is ever taken back).

Invariants:
* ``winner`` and ``binding_at`` are functions of the set of pins alone: commutative,
  associative and idempotent in the pins they are given (``tests/test_pins.py``).
* Without a pin, or under an unpin, ``allows`` is always True: nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replica.errors import InvalidOp

KIND_PIN = "pin"
BODY_KEYS = frozenset({"r", "n"})
NODE_BYTES = 32
MAX_PIN_NODES = 64
MAX_ROLE_CHARS = 256
BOUND_KINDS = frozenset({"msg", "rtr"})  # the ops in a role's name a pin binds


@dataclass(frozen=True)
class Pin:
    """One pin op of a role: ``nodes`` empty means unpinned."""

    role: str
    nodes: frozenset[bytes]
    hlc: int
    origin: bytes

    @property
    def stamp(self) -> tuple[int, bytes]:
        return (self.hlc, self.origin)

    @property
    def pinned(self) -> bool:
        return bool(self.nodes)


def pin_body(role: str, nodes: Sequence[bytes]) -> dict[str, Any]:
    """The body of a pin op (sorted, unique nodes; none: an unpin)."""
    return {"r": role, "n": sorted(set(nodes))}


def check_pin(body: Mapping[str, Any]) -> None:
    if set(body) != BODY_KEYS:
        raise InvalidOp("pin body must have exactly the keys r, n")
    role, nodes = body["r"], body["n"]
    if not isinstance(role, str) or not role or len(role) > MAX_ROLE_CHARS:
        raise InvalidOp(f"pinned role must be a non-empty string of at most {MAX_ROLE_CHARS} chars")
    if not isinstance(nodes, list) or len(nodes) > MAX_PIN_NODES:
        raise InvalidOp(f"pinned nodes must be a list of at most {MAX_PIN_NODES} node keys")
    if not all(isinstance(n, bytes) and len(n) == NODE_BYTES for n in nodes):
        raise InvalidOp("a pinned node must be a 32-byte node key")
    if len(set(nodes)) != len(nodes):
        raise InvalidOp("a pin names each node once")


CHECKS = {KIND_PIN: check_pin}


def from_body(body: Mapping[str, Any], hlc: int, origin: bytes) -> Pin:
    return Pin(str(body["r"]), frozenset(bytes(n) for n in body["n"]), hlc, origin)


def winner(pins: Iterable[Pin]) -> Pin | None:
    """The pin in force: the highest stamp (hlc, origin) of a role's pins; None without any."""
    return max(pins, key=lambda p: p.stamp, default=None)


def binding_at(pins: Iterable[Pin], hlc: int) -> Pin | None:
    """The pin in force just before stamp ``hlc``: the winner of the pins stamped below it."""
    return winner(p for p in pins if p.hlc < hlc)


def allows(pins: Iterable[Pin], origin: bytes, hlc: int) -> bool:
    """Whether a node may write, at ``hlc``, an op in the name of the role these pins are of."""
    bound = binding_at(pins, hlc)
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
