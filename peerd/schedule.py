"""When the gossip rounds are due: a backoff schedule on the caller's clock. Pure.

Invariants:
* While rounds find work (``busy``: a round that was not in sync, a first contact, new ops that
  arrived, a peer that is failing but not given up), the wait between ticks is ``base``; while
  they find nothing it grows 1.5 times per tick up to ``cap``; a wake-up (a new peer, new ops)
  brings it back to ``base`` at once.
* Every wait is jittered by +/- 20 % (the injected random source), so nodes started together do
  not round in lockstep; ticks are at least ``gap`` apart whatever wakes them.
* Every ``exchange_every``-th tick's rounds also exchange peer lists.
"""

from __future__ import annotations

import random

MIN_ROUND_GAP = 0.1  # seconds: wake-ups start rounds at most this often
EXCHANGE_EVERY = 5
BACKOFF = 1.5


class Schedule:
    def __init__(self, base: float, cap: float, rng: random.Random, *, gap: float = MIN_ROUND_GAP,
                 exchange_every: int = EXCHANGE_EVERY) -> None:
        self.base, self.cap, self.rng, self.gap = base, cap, rng, gap
        self.interval = base
        self.ticks = 0
        self.exchange_every = exchange_every
        self._busy = False

    def exchange_due(self) -> bool:
        """Whether this tick's rounds exchange peer lists too (the first tick's do)."""
        return self.ticks % self.exchange_every == 0

    def busy(self) -> None:
        """Rounds or pushes found work: keep the pace up."""
        self._busy = True

    def ticked(self, *, failing: bool) -> float:
        """After a tick: the seconds to wait for the next one unless woken (jittered)."""
        self.ticks += 1
        busy, self._busy = self._busy or failing, False
        self.interval = self.base if busy else min(self.interval * BACKOFF, self.cap)
        return self.interval * self.rng.uniform(0.8, 1.2)

    def woken(self) -> None:
        """Something worth a round happened: back to the base pace."""
        self.interval = self.base
