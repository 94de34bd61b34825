"""Which wire versions a peer speaks, and what two peers use: pure rules.

Every request and every reply of this release states the wire versions its
sender speaks, as one integer ``V`` (bit k set: speaks wire k) in the message's
map, next to the envelope. The first release (0.1.0, wire 2) states nothing:
a message without ``V`` comes from a peer that speaks wire 2 only. mDNS adverts
say the same in TXT (``proto``: the oldest version spoken, which the first
release compares for equality; ``protos``: all of them), and so do peer
exchange records.

Invariants:
* Two peers use the highest version both speak (``negotiate``); none in
  common is a state of its own (``NoCommon``), told once and never retried in
  a loop (``peerd.peers``).
* From wire 3 on a peer stores ops it does not understand (``replica.ops``);
  a peer that speaks only wire 2 refuses a whole batch for one such op, so it
  is sent only ops it takes (``takes_every_op``).
* Each release speaks at least the previous release's wire: ``SPOKEN`` keeps 2.
* A malformed statement reads as no statement (wire 2), never as an error.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Msg = dict[str, Any]

SPOKEN: tuple[int, ...] = (2, 3)
NEWEST = max(SPOKEN)
FIRST_RELEASE: frozenset[int] = frozenset({2})  # what a peer that states nothing speaks
FORWARD_COMPATIBLE = 3  # from this wire on, a peer stores the ops it does not know
KEY = "V"
MAX_VERSION = 30


def mask(versions: Iterable[int]) -> int:
    """The ``V`` integer of a set of versions."""
    out = 0
    for v in versions:
        out |= 1 << v
    return out


OURS = mask(SPOKEN)


def from_mask(raw: object) -> frozenset[int] | None:
    """The versions a ``V`` integer names, or None when it is not one (read as no statement)."""
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 < raw < 1 << (MAX_VERSION + 1):
        return None
    return frozenset(k for k in range(MAX_VERSION + 1) if raw >> k & 1)


def stated(msg: Msg) -> frozenset[int]:
    """The versions a message's sender speaks: its ``V``, or wire 2 alone without one."""
    return from_mask(msg.get(KEY)) or FIRST_RELEASE


def state(msg: Msg) -> Msg:
    """``msg`` stating the versions this release speaks."""
    msg[KEY] = OURS
    return msg


@dataclass(frozen=True)
class NoCommon:
    """Two peers that speak no wire version in common."""

    theirs: frozenset[int]

    def __str__(self) -> str:
        return (f"speaks wire {describe(self.theirs)}, this peerd speaks {describe(SPOKEN)}: no version in common "
                f"({'upgrade this peerd' if min(self.theirs) > NEWEST else 'upgrade that peerd'})")


def negotiate(theirs: Iterable[int]) -> int | NoCommon:
    """The wire version two peers use: the highest both speak."""
    theirs = frozenset(theirs)
    both = theirs & set(SPOKEN)
    return max(both) if both else NoCommon(theirs)


def takes_every_op(theirs: Iterable[int] | None) -> bool:
    """Whether a peer speaking ``theirs`` (None: not known yet) stores ops it does not know."""
    if theirs is None:
        return False
    used = negotiate(theirs)
    return isinstance(used, int) and used >= FORWARD_COMPATIBLE


def describe(versions: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(versions)))


def parse_list(text: str) -> frozenset[int] | None:
    """Versions written as ``2,3`` (mDNS TXT), or None when the text is not such a list."""
    try:
        out = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return None
    return out if out and all(0 <= v <= MAX_VERSION for v in out) else None
