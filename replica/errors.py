"""One error hierarchy for the replica.

Invariants:
* Every error peerd raises on purpose is a ``PeerdError``; anything else is a bug.
* A bad call from a local caller is a ``LocalError`` and changed nothing; bad data from a
  peer is a ``RemoteError`` and none of it was stored; a storage failure is a ``StoreError``.
* sqlite3 exceptions are translated at the boundary and never escape the public API; bytes
  that are not msgpack are ``Undecodable``, which each caller turns into its own error.
"""

from __future__ import annotations


class PeerdError(Exception):
    """Base of every error peerd raises on purpose."""


class LocalError(PeerdError):
    """The local caller asked for something invalid; nothing was changed."""


class InvalidArgument(LocalError, ValueError):
    """An argument is malformed, out of bounds or contradicts the state."""


class RolePinned(InvalidArgument):
    """A role is pinned to other nodes (``replica.pins``): this node may not send in its name."""

    def __init__(self, role: str, nodes: tuple[bytes, ...], sentence: str) -> None:
        self.role = role
        self.nodes = nodes
        super().__init__(sentence)


class NotFound(LocalError, LookupError):
    """An id (message, receipt, thread, agent) is unknown to this replica."""


class RemoteError(PeerdError):
    """A peer sent data that fails verification; none of it was stored."""


class InvalidOp(RemoteError):
    """An op failed verification (encoding, signature, origin, size, kind, body)."""

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        self.reason = reason
        self.index = index
        where = f"op #{index}: " if index is not None else ""
        super().__init__(f"invalid op: {where}{reason}")


class StoreError(PeerdError):
    """The SQLite store failed (corrupt file, disk full, locked for too long)."""


class Undecodable(PeerdError, ValueError):
    """Bytes are not the msgpack they should be (``codec.unpack``); callers translate
    it into their own error (an invalid op, a bad invite, a peer protocol error)."""

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(f"undecodable msgpack ({cause})")
