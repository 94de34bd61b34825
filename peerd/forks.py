"""Noticing a home that is an older copy of itself (restored by copying files, not ``peerd restore``).

A node numbers its own ops in its own replica, so no peer can hold more of them than the node
itself: every one is written here first. A peer whose vector holds this node's origin beyond the
newest own seq this replica held during the round therefore means this replica is an older copy
of the node (a home copied back by hand, or one ``node.key`` run in two homes). Its writes since
the copy took numbers the fleet already holds, and peers keep the op they saw first: a fork of its
own history. The same shows when a peer pushes this node one of its own ops that its replica never
held (the replica remembers the first such op: ``Replica.own_history_ahead``), whichever comes
first. The node is told once (an error in the log, ``own_history_ahead`` in its status,
a failure in ``peerd doctor``) and goes on as before; the fix is a new node made from this home.

Invariants:
* Only our own origin counts, compared with what this replica held during the round (the newer of
  its start and its end): a peer ahead on any other origin is ordinary news, never a fork.
* Telling is all it does: nothing is refused, rewritten or stopped; the fix is the operator's.
* Pure: values in, a value out; the node logs and keeps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

FIX = ("make this home a new node: peerd backup FILE, then peerd restore FILE --home NEW_HOME, and run "
       "NEW_HOME instead (nothing is lost: this node's ops stay, under its old id)")


@dataclass(frozen=True)
class OwnAhead:
    """A peer held this node's own ops up to ``theirs`` while this replica held them up to ``ours``."""

    peer: str
    theirs: int
    ours: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> str:
        return (f"peer {self.peer} holds this node's own ops up to #{self.theirs}, but this replica held only "
                f"up to #{self.ours}: this home is an older copy of itself (restored by copying files?), and "
                f"what it wrote since took numbers the fleet already holds, which peers ignore")


def own_ahead(me: bytes, peer: str, theirs: Mapping[bytes, int] | None,
              ours_before: Mapping[bytes, int], ours_after: Mapping[bytes, int] | None = None) -> OwnAhead | None:
    """What a round shows when ``theirs`` (a peer's vector) holds our origin ``me`` beyond what this
    replica held (the newer of ``ours_before``, our vector as the round began, and ``ours_after``, as it
    ended), else None. Our own writes during the round may reach the peer before its vector is read, so
    the round's end counts too; an op of ours the round pulled in is told by ``own_history_ahead``.
    Vectors by the same ids (short or full)."""
    t = (theirs or {}).get(me, 0)
    o = max(ours_before.get(me, 0), (ours_after or {}).get(me, 0))
    return OwnAhead(peer, t, o) if t > o else None
