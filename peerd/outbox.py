"""Push on write: the ops waiting for each peer, and the batches that carry them. Pure.

Invariants:
* One queue per peer address. Ops are added in the order they were written or arrived; a queue
  never holds more than ``limit`` ops: past it the oldest are dropped (the peer is far behind,
  and a round repairs what a push no longer carries).
* A queue is drained by one drain at a time: ``add`` says when a drain must start (the queue was
  idle), ``take`` hands out the next batch within ``budget`` bytes (always at least one op) and
  ends the drain when the queue is empty; a failed push drops what was queued for that peer.
"""

from __future__ import annotations

from replica import vector


class Outbox:
    def __init__(self, limit: int, budget: int) -> None:
        self.limit = limit
        self.budget = budget
        self._boxes: dict[str, list[bytes]] = {}
        self._draining: set[str] = set()

    def add(self, addr: str, raws: list[bytes]) -> bool:
        """Queue ``raws`` for ``addr``; True when a drain must be started for it."""
        box = self._boxes.setdefault(addr, [])
        box.extend(raws)
        if len(box) > self.limit:  # far behind: drop the backlog, rounds repair it
            del box[: len(box) - self.limit]
        if addr in self._draining:
            return False
        self._draining.add(addr)
        return True

    def take(self, addr: str) -> list[bytes] | None:
        """The next batch for ``addr``, or None: the queue is empty and its drain ends."""
        box = self._boxes.get(addr) or []
        if not box:
            self._draining.discard(addr)
            return None
        n = vector.take_within((len(r) for r in box), self.budget)
        batch = box[:n]
        del box[:n]
        return batch

    def failed(self, addr: str) -> None:
        """A push to ``addr`` failed: what waits for it goes too (a round repairs it)."""
        self._boxes.pop(addr, None)

    def forget(self, addr: str) -> None:
        """The peer is gone from the table."""
        self._boxes.pop(addr, None)

    def clear(self) -> None:
        self._boxes.clear()

    def queued(self, addr: str) -> int:
        return len(self._boxes.get(addr) or [])
