"""The fleet keys a node holds: the one it seals with, and the ones the fleet used before.

Invariants:
- ``current`` seals every request and reply; a body that opens only with a previous key
  comes from a member that missed a rotation (or a removed node), and is answered with the
  rotation alone (``peerd.node``), never with data.
- ``derive`` is pure: the config's keys plus what the replica opened for this node. The current
  key is the winning rotation's, when it sealed one to us; otherwise the config's (a node let in
  after the rotation, or one that was removed and so keeps a key nobody uses any more).
- ``previous`` never holds ``current`` nor a duplicate, newest first, at most ``MAX_PREVIOUS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from peerd.config import MAX_PREVIOUS_KEYS, fleet_id
from peerd.errors import SealError
from peerd.seal import WRONG_KEY, open_sealed, seal

MAX_PREVIOUS = MAX_PREVIOUS_KEYS


@dataclass(frozen=True)
class KeyRing:
    current: bytes = field(repr=False)
    previous: tuple[bytes, ...] = field(default=(), repr=False)
    epoch: int = 0
    removed: bool = False  # this node was removed from the fleet: nobody opens its requests any more

    @property
    def fleet_id(self) -> str:
        return fleet_id(self.current)

    @property
    def previous_ids(self) -> tuple[str, ...]:
        return tuple(fleet_id(k) for k in self.previous)

    def seal(self, plaintext: bytes, key: bytes | None = None) -> bytes:
        """Seal with the current key, or with ``key`` (a previous one, to answer in kind)."""
        return seal(self.current if key is None else key, plaintext)

    def open(self, body: bytes) -> tuple[bytes, bytes]:
        """(plaintext, the key that opened it: ``current``, or one of ``previous``)."""
        try:
            return open_sealed(self.current, body), self.current
        except SealError as first:
            for key in self.previous:
                try:
                    return open_sealed(key, body), key
                except SealError:
                    continue
            if str(first) != WRONG_KEY:
                raise
            raise SealError(WRONG_KEY) from None


def derive(config_key: bytes, config_previous: Sequence[bytes], opened: Sequence[bytes],
           sealed_to_us: bytes | None, *, epoch: int = 0, removed: bool = False) -> KeyRing:
    """The key ring from the config's keys and the keys rotations sealed to this node (oldest first)."""
    current = sealed_to_us if sealed_to_us is not None else config_key
    older = [*reversed(opened), config_key, *config_previous]
    previous = tuple(k for k in dict.fromkeys(older) if k != current)[:MAX_PREVIOUS]
    return KeyRing(current, previous, epoch, removed)
