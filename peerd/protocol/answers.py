"""What an answer to a sealed request means, and which status each kind of answer gets: sans-io.

The answering side picks a status by what went wrong (``status_for``); the calling side reads
an answer (its status and, when it opened, its message) as one of a few meanings (``meaning``):

======================  =========================================================================
status                  meaning
======================  =========================================================================
200 and a reply         ``Replied``; a ``rekey`` reply is ``Rekey`` (the answerer opened our
                        request only with a key the fleet used before: here is the rotation)
403 (not sealed)        ``WrongKey``: our body did not open there (another fleet, or a rotation
                        that key missed)
any other, or ``error``  ``Refused`` with the answerer's reason
a body that does not    ``Unreadable``
open or decode
======================  =========================================================================

Invariants: every status number of the peer protocol is named here once; ``meaning`` never
raises (a malformed rotation is ``Unreadable``); the message builders are the only literals of
the messages a node sends outside a round (a push, a rotation push, a ``rekey`` reply).
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.protocol.wire import ERROR, PUSH, REKEY, Msg

OK = 200
BAD_REQUEST = 400  # the body opened but is not a valid request of ours (ProtocolError, InvalidOp)
WRONG_KEY = 403  # the body did not open with the fleet's key (answered in plain text)
INTERNAL = 500  # a bug of the answering node
UNAVAILABLE = 503  # the answering node's replica failed for now, or it is busy taking a snapshot


@dataclass(frozen=True)
class Replied:
    msg: Msg


@dataclass(frozen=True)
class Rekey:
    ops: list[bytes]


@dataclass(frozen=True)
class WrongKey:
    pass


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass(frozen=True)
class Unreadable:
    detail: str


Meaning = Replied | Rekey | WrongKey | Refused | Unreadable


def meaning(status: int, msg: Msg | None, unreadable: str | None = None) -> Meaning:
    """What an answer says: ``msg`` is its opened, decoded body (None when it did not open or
    decode, ``unreadable`` then saying why)."""
    if status == WRONG_KEY:
        return WrongKey()
    if msg is None:
        return Unreadable(f"sent an unreadable reply (HTTP {status}): {unreadable or 'no body'}")
    if msg.get("t") == REKEY and status == OK:
        ops = msg.get("o")
        if not isinstance(ops, list) or not all(isinstance(o, bytes) for o in ops):
            return Unreadable("answered with a malformed key rotation")
        return Rekey(ops)
    if msg.get("t") == ERROR or status != OK:
        return Refused(str(msg.get("e", status)))
    return Replied(msg)


def push(ops: list[bytes]) -> Msg:
    """A fresh push (on write, a forward, a rotation handed over): its receiver passes new ops on."""
    return {"t": PUSH, "o": ops}


def rekey_reply(ops: list[bytes]) -> Msg:
    """The answer to a request sealed with an old key: the rotation, nothing else."""
    return {"t": REKEY, "o": ops}
