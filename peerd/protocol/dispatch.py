"""Answering one request: the reply, and what the answering node must do about it.

The whole server side of the protocol, bytes in and values out. A node opens
the seal, calls ``decode_request``, runs ``dispatch`` (off its event loop: it
reads and writes the replica), follows the ``Outcome`` (peer table, forwards,
wake-ups), and seals ``Outcome.reply``.

Invariants: a request is one of ``KINDS``, from a caller that speaks a
wire version in common, or a ``ProtocolError``; every reply carries the
answerer's ``n`` and ``V``, and a ``peers`` reply its clock ``c``; the
forwarding rule (``forwarded``) is stated once, here: a fresh push (no ``r``)
passes on the ops that were new to this node, to anyone but its sender; ops a
round pushed (``r: 1``) are never passed on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from peerd.protocol import versions
from peerd.protocol.exchange import Learnt, PeerRecord, learn, peers_message
from peerd.protocol.rounds import SyncReplica, handle_push, kind_of, serve
from peerd.protocol.wire import (
    BACK,
    PEERS,
    PULL,
    PUSH,
    SNAP,
    SYNC,
    Envelope,
    Msg,
    ProtocolError,
    decode,
    envelope,
    sign_reply,
)
from replica.models import ApplyResult

# snap: answered by the node's snapshot server (peerd.snapshotting); back: by the node's relay links
# (peerd.relaylink), which call the caller back
KINDS = (SYNC, PULL, PUSH, PEERS, SNAP, BACK)


@dataclass(frozen=True)
class Request:
    kind: str
    msg: Msg
    envelope: Envelope

    @property
    def wants_peers(self) -> bool:
        """The reply lists the answerer's peers (which only the node's table knows)."""
        return self.kind == PEERS


def decode_request(data: bytes) -> Request:
    """A request from its plaintext; ProtocolError if it is not one of ours, or its sender states
    wire versions none of which this release speaks."""
    msg = decode(data)
    kind = kind_of(msg)
    if kind not in KINDS:
        raise ProtocolError(f"unknown message kind {kind!r}")
    env = envelope(msg)
    used = versions.negotiate(env.wire)
    if isinstance(used, versions.NoCommon):
        raise ProtocolError(f"the caller {used}")
    return Request(kind, msg, env)


@dataclass(frozen=True)
class Here:
    """What the answering node tells the protocol about itself for one request."""

    me: bytes  # short node id
    name: str
    budget: int  # page bytes
    clock_ms: int  # wall clock, Unix milliseconds
    peers: Sequence[PeerRecord] = ()  # the peers it can reach (for a ``peers`` reply)


@dataclass(frozen=True)
class Outcome:
    reply: Msg
    new: int = 0  # ops a push brought that were new here
    barred: int = 0  # ops a push brought that the membership bars here (not stored)
    forward: list[bytes] = field(default_factory=list)  # ops to push on, to anyone but the sender
    learnt: Learnt = field(default_factory=Learnt)


def forwarded(msg: Msg, result: ApplyResult) -> list[bytes]:
    """The ops of a push to pass on: those new here, unless a round pushed them."""
    return [] if msg.get("r") else [msg["o"][i] for i in result.new_index]


def dispatch(rep: SyncReplica, req: Request, here: Here) -> Outcome:
    """Answer ``req`` from ``rep``; RemoteError (400) when it is malformed or its ops fail."""
    if req.kind == PEERS:
        out = Outcome(peers_message(here.name, here.peers), learnt=learn(req.msg))
    elif req.kind == PUSH:
        reply, result = handle_push(rep, req.msg)
        out = Outcome(reply, new=result.new, barred=result.refused, forward=forwarded(req.msg, result))
    else:
        out = Outcome(serve(rep, req.msg, here.budget))
    sign_reply(out.reply, me=here.me, kind=req.kind, clock_ms=here.clock_ms)
    return out
