"""Version vectors as pure functions.

A vector maps an origin (32-byte node key) to the highest seq held
contiguously from 1. A missing origin means 0. Invariants: ``contiguous``
never skips a hole; ``missing_ranges`` only offers seqs the sender holds
contiguously, so every page a receiver applies moves its vector forward and a
round can never loop on a hole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

Vector = Mapping[bytes, int]


def contiguous(start: int, held: Iterable[int]) -> int:
    """Highest n >= start such that every seq in (start, n] is held."""
    have = set(held)
    n = start
    while n + 1 in have:
        n += 1
    return n


def stranded(start: int, held: Iterable[int], gone: Iterable[int]) -> set[int]:
    """The seqs of ``gone`` (ops that arrived already purgeable) the mark would not reach from
    ``start`` with ``held`` and ``gone`` counted: they lie above a hole. Such an op is stored, not
    dropped: a dropped seq above the mark would be forgotten, and hold its origin's mark (and every
    later purge of its ops) back until a peer sent it again."""
    gone = set(gone)
    reach = contiguous(start, [*held, *gone])
    return {s for s in gone if s > reach}


def covered_to(contig: int, lo: int, hi: int) -> int:
    """An origin's contiguous mark after a page covering lo..hi: moved to hi when the range starts
    at or below the next seq wanted, else unchanged (a hole before lo stays a hole)."""
    return max(contig, hi) if lo <= contig + 1 else contig


def missing_ranges(ours: Vector, theirs: Vector) -> dict[bytes, tuple[int, int]]:
    """Per origin, the inclusive seq range we hold and they lack."""
    return {o: (theirs.get(o, 0) + 1, top) for o, top in ours.items() if top > theirs.get(o, 0)}


def lag(ours: Vector, theirs: Vector) -> int:
    """How many ops ``theirs`` holds that ``ours`` lacks."""
    return sum(max(0, top - ours.get(o, 0)) for o, top in theirs.items())


def digest(vector: Vector) -> bytes:
    """A short hash of a vector: equal vectors, equal digests (8 bytes)."""
    h = hashlib.blake2b(digest_size=8, person=b"peerd-vector")
    for origin in sorted(o for o, n in vector.items() if n > 0):
        h.update(origin)
        h.update(vector[origin].to_bytes(8, "big"))
    return h.digest()


def take_within(sizes: Iterable[int], budget: int) -> int:
    """How many leading items fit the byte budget (always at least one)."""
    used = 0
    count = 0
    for size in sizes:
        if count and used + size > budget:
            break
        used += size
        count += 1
    return count
