"""Snapshots in memory, for tests: a member that serves them (``Server``: real replica, real codec,
real signatures) and a taker's loop (``take``), plus a fleet's worth of varied state (``busy_hub``).

Usage::

    hub = busy_hub()                      # messages, threads, receipts, profiles, a retraction, ...
    server = Server(hub)
    taker = Replica.open()
    take(taker, server)                   # opening, membership check, then every page
    assert taker.state_digest() == hub.state_digest()
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from peerd import protocol
from peerd.protocol import Msg, snapshot
from replica import Replica
from replica.snapshot import Cursor, Taking
from tests.conftest import pull
from tests.newer import NewerNode

FLEET_ID = "0123456789abcdef"


class Server:
    """A member answering ``snap`` requests from its replica, every message through the wire codec."""

    def __init__(self, rep: Replica, *, budget: int = 16 * 1024, now: Callable[[], float] = time.monotonic) -> None:
        self.rep = rep
        self.budget = budget
        self.shelf = snapshot.Shelf()
        self.now = now
        self.calls = 0

    def sign(self, data: bytes) -> bytes:
        return bytes(self.rep.signing_key.sign(data).signature)

    def __call__(self, msg: Msg, *, caller: bytes = b"\x01" * 32) -> Msg:
        self.calls += 1
        wire = protocol.decode(protocol.encode(protocol.stamp(msg, me=caller, port=1)))
        reply = snapshot.serve(self.rep, wire, self.shelf, budget=self.budget, sign=self.sign,
                               signer=self.rep.node_key, now=self.now(), token=os.urandom(snapshot.ID_BYTES))
        protocol.sign_reply(reply, me=self.rep.node_key, kind=protocol.SHOT, clock_ms=0)
        return protocol.decode(protocol.encode(reply))

    @property
    def short(self) -> bytes:
        return protocol.short(self.rep.node_key)


Tamper = Callable[[Msg], Msg]


def open_snapshot(taker: Replica, server: Server) -> tuple[Taking, snapshot.Opening]:
    """The opening, checked, the signer vetted and the snapshot begun on ``taker``."""
    ours = taker.vector()
    opening = snapshot.check_opening(server(snapshot.open_request(ours)), ours, server.short)
    why = taker.signer_standing(opening.signer, opening.fleet_ops)
    if why is not None:
        raise protocol.ProtocolError(f"its signer is not a member of this fleet: {why}")
    taking = Taking("memory", opening.id, opening.signer, opening.point, time.time())
    taker.begin_snapshot(taking, opening.cursor, opening.fleet_ops)
    return taking, opening


def take_page(taker: Replica, server: Server, taking: Taking, opening: snapshot.Opening, cursor: Cursor,
              tamper: Tamper | None = None) -> Cursor | None:
    """Ask for, check and store one page; the next cursor."""
    reply = server(snapshot.page_request(opening.id, cursor))
    if tamper is not None:
        reply = tamper(reply)
    checked = snapshot.check_page(reply, opening, cursor, server.short)
    taker.take_page(taking, checked.ops, checked.covered, checked.next)
    return checked.next


def take(taker: Replica, server: Server, *, stop_after: int | None = None) -> int:
    """Take a whole snapshot (or ``stop_after`` pages of it); the number of pages taken."""
    taking, opening = open_snapshot(taker, server)
    cursor, pages = opening.cursor, 0
    while cursor is not None and (stop_after is None or pages < stop_after):
        cursor = take_page(taker, server, taking, opening, cursor)
        pages += 1
    return pages


def resume(taker: Replica, server: Server) -> int:
    """Go on with the snapshot ``taker`` kept (after a restart); the number of pages taken."""
    held = taker.snapshot_taking()
    assert held is not None
    taking, cursor = held
    opening = snapshot.Opening(taking.id, taking.signer, taking.point, [], cursor)
    pages = 0
    while cursor is not None:
        cursor = take_page(taker, server, taking, opening, cursor)
        pages += 1
    return pages


def busy_hub(*, messages: int = 60, wall: Callable[[], int] | None = None) -> Replica:
    """A member holding what a fleet writes: messages to one role, to role lists and to everyone,
    thread messages, receipts delivered and read, profiles, a retraction, an op of a newer release,
    from three nodes; the hub itself admitted to the fleet."""
    kw: dict[str, Any] = {} if wall is None else {"wall": wall}
    hub = Replica.open(**kw)
    hub.admit_node(hub.node_key, "hub", FLEET_ID)
    authors = [Replica.open(**kw) for _ in range(2)]
    channels = ("tau", "tau, phi", "broadcast", "Phi")
    for n in range(messages):
        author = authors[n % 2]
        author.send_message(f"agent{n % 3}", channels[n % 4], f"message {n} about the build")
    alice, bob = authors[0].create_agent("alice"), authors[0].create_agent("bob")
    thread = authors[0].create_thread(alice, bob)
    for n in range(5):
        authors[0].append(thread, alice, f"thread note {n}")
    first = authors[1].send_message("phi", "tau", "to be taken back")
    authors[1].retract_message(first.id, "phi")
    authors[0].update_profile("tau", name="Tau", static={"workspace": "/src"}, dynamic={"currentTask": "build"})
    for r in authors:
        pull(hub, r)
    inbox = hub.check_messages("tau", limit=30)
    hub.mark_as_read([m.receipt_id for m in inbox.messages[:10]])
    hub.apply([NewerNode().op("lease", {"p": "src/*.py", "ttl": 60})])
    for r in authors:
        r.close()
    return hub
