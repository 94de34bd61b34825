"""Exponential backoff with jitter, as a pure function of the failure count.

Invariants:
- ``delay(0, u) == 0``: a peer that has not failed is tried at once.
- For ``failures >= 1`` the un-jittered delay is
  ``min(cap, base * factor ** (failures - 1))``: non-decreasing in the
  failure count and never above ``cap``.
- Jitter only shortens: the returned delay lies in
  ``[(1 - jitter) * d, d]`` for the un-jittered delay ``d``, so spreading
  retries never breaks the cap.
- No clock and no hidden randomness: the caller passes the uniform sample
  ``u`` in ``[0, 1)``; ``next_delay`` is the convenience that draws it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Retry schedule: ``base`` seconds after the first failure, times ``factor`` after each
    further one, at most ``cap`` seconds, shortened by up to ``jitter`` (a fraction)."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 120.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ValueError(f"backoff base must be > 0, got {self.base}")
        if not self.factor >= 1:
            raise ValueError(f"backoff factor must be >= 1, got {self.factor}")
        if not self.cap >= self.base:
            raise ValueError(f"backoff cap must be >= base ({self.base}), got {self.cap}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter must be in [0, 1], got {self.jitter}")

    def ceiling(self, failures: int) -> float:
        """The un-jittered delay after ``failures`` consecutive failures."""
        if failures <= 0:
            return 0.0
        steps = failures - 1
        # Compare in log space so huge failure counts never overflow a float.
        if self.factor > 1 and steps * math.log(self.factor) >= math.log(self.cap / self.base):
            return self.cap
        return min(self.cap, self.base * self.factor**steps)

    def delay(self, failures: int, u: float) -> float:
        """The delay after ``failures`` consecutive failures, given a uniform sample ``u``."""
        if not 0 <= u < 1:
            raise ValueError(f"jitter sample must be in [0, 1), got {u}")
        return self.ceiling(failures) * (1 - self.jitter * u)

    def next_delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """``delay`` with a fresh sample from ``rng`` (``random.random`` by default)."""
        return self.delay(failures, rng())
