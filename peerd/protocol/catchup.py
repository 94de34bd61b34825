"""Catch-up accounting on short-id vectors: how far behind one side is, and how far a
catch-up in flight has come.

Pure values and arithmetic; the caller supplies the vectors (read off its event
loop) and decides what to log. Invariants: ``behind`` never goes below zero;
a ``Progress`` measures against the peer's vector as the catch-up began, so a
peer that keeps writing does not move the goal; ``advance_known`` only moves a
vector forward by contiguous seqs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from peerd.protocol.wire import Msg, short
from replica.ops import peek

CATCHUP_REPORT = 1000  # a round that must pull at least this many ops reports progress


def behind(theirs: Mapping[bytes, int], ours: Mapping[bytes, int]) -> int:
    """Ops ``theirs`` holds that ``ours`` lacks."""
    return sum(max(0, n - ours.get(k, 0)) for k, n in theirs.items())


def reply_vector(reply: Msg) -> dict[bytes, int] | None:
    """The vector a reply carries (``v`` of a ``diff``), integers only; None without one."""
    theirs = reply.get("v")
    if not isinstance(theirs, dict):
        return None
    return {k: n for k, n in theirs.items() if isinstance(n, int)}


@dataclass
class Progress:
    """A catch-up in flight: ops pulled of the ops the peer had that we lacked."""

    peer: str
    total: int
    theirs: dict[bytes, int]  # the peer's vector when the catch-up began
    started: float  # when it began, on the caller's clock
    done: int = 0
    logged: float = 0.0

    def advance(self, ours: Mapping[bytes, int]) -> None:
        self.done = self.total - behind(self.theirs, ours)

    def to_dict(self, now: float) -> dict[str, Any]:
        elapsed = max(now - self.started, 1e-6)
        rate = self.done / elapsed
        left = max(self.total - self.done, 0)
        return {"peer": self.peer, "done": self.done, "total": self.total, "rate": round(rate, 1),
                "eta": round(left / rate, 1) if rate > 0 else None,
                "percent": round(100 * self.done / self.total, 1) if self.total else 100.0}


def start_catchup(peer: str, theirs: Mapping[bytes, int], ours: Mapping[bytes, int], now: float) -> Progress | None:
    """A Progress when we lack at least ``CATCHUP_REPORT`` of the ops ``theirs`` holds."""
    total = behind(theirs, ours)
    return Progress(peer, total, dict(theirs), now) if total >= CATCHUP_REPORT else None


def advance_known(their_vector: dict[bytes, int], raws: Iterable[bytes]) -> None:
    """Count ops a peer acknowledged (a push) as held there, where they extend its vector."""
    for raw in raws:
        ident = peek(raw)
        if ident is not None:
            origin = short(ident[0])
            if their_vector.get(origin, 0) == ident[1] - 1:
                their_vector[origin] = ident[1]
