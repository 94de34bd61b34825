"""Last-writer-wins registers as pure functions.

Every mutable field (receipt delivered/read, profile name/static/dynamic,
agent name/alive, thread membership) is one register keyed by
(table, key, field). A write carries the stamp of its op: (hlc, origin).

Invariants:
* The higher stamp wins (``wins``); stamps never tie, because one origin never
  reuses an HLC and origins differ. ``merge`` is therefore commutative,
  associative and idempotent: any writes, in any order, any number of times,
  give the same registers.
* This is the one LWW rule: the store applies ``wins`` in SQL, and the property
  tests check the store against this model.
* Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Stamp = tuple[int, bytes]
RegisterKey = tuple[str, str, str]
Value = int | str | bool | None


@dataclass(frozen=True)
class Write:
    key: RegisterKey
    value: Value
    stamp: Stamp


def wins(new: Stamp, old: Stamp | None) -> bool:
    return old is None or new > old


def merge(state: Mapping[RegisterKey, Write], writes: Iterable[Write]) -> dict[RegisterKey, Write]:
    """The registers after applying ``writes`` in any order."""
    out = dict(state)
    for w in writes:
        cur = out.get(w.key)
        if wins(w.stamp, cur.stamp if cur else None):
            out[w.key] = w
    return out


def join_key(parts: Iterable[str]) -> str:
    """A register key's parts as one string (the store's ``lww.k`` column)."""
    return "\x1f".join(parts)
