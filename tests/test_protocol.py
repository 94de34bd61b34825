"""The sans-io sync protocol driven in memory between real replicas."""

from __future__ import annotations

import msgpack
import pytest

from peerd import protocol
from peerd.protocol import ProtocolError, client_round, drive, serve
from replica import Replica


def _round(a: Replica, b: Replica, budget: int = 4096) -> protocol.RoundResult:
    sizes: list[int] = []

    def server(msg: protocol.Msg) -> protocol.Msg:
        reply = serve(b, msg, budget)
        sizes.append(len(msgpack.packb(msg)) + len(msgpack.packb(reply)))
        return reply

    return drive(client_round(a, me=a.node_key, port=1, budget=budget), server)


def test_round_brings_both_sides_up_to_date() -> None:
    """One round pulls what A lacks and pushes what B lacks."""
    a, b = Replica.open(), Replica.open()
    for i in range(30):
        a.send_message("a", "x", f"a{i}")
        b.send_message("b", "x", f"b{i}")
    res = _round(a, b, budget=600)
    assert (res.pulled, res.pushed) == (30, 30)
    assert a.state_digest() == b.state_digest() and a.vector() == b.vector()
    assert res.requests > 3  # small budget forced paging


def test_in_sync_round_is_one_tiny_exchange() -> None:
    """Replicas already equal settle in one request answered by 'same'."""
    a, b = Replica.open(), Replica.open()
    a.send_message("a", "x", "m")
    _round(a, b)
    res = _round(a, b)
    assert res.same and res.requests == 1


def test_round_with_many_origins_uses_digest_then_pull() -> None:
    """With more origins than fit up front, the round still converges via pull."""
    a, b = Replica.open(), Replica.open()
    for _ in range(protocol.FULL_VECTOR_MAX + 3):
        o = Replica.open()
        o.send_message("o", "x", "m")
        _round(b, o)
    res = _round(a, b)
    assert res.pulled == protocol.FULL_VECTOR_MAX + 3 and a.state_digest() == b.state_digest()


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        ({"t": "nope"}, "unknown message kind"),
        ({"x": 1}, "valid 't'"),
        ({"t": "sync"}, "valid 'd'"),
        ({"t": "sync", "d": b"12345678", "v": {b"short": 1}}, "malformed entry"),
        ({"t": "pull", "w": {b"12345678": -1}}, "malformed entry"),
        ({"t": "push", "o": ["not bytes"]}, "list of byte strings"),
    ],
)
def test_malformed_requests_are_protocol_errors(msg: protocol.Msg, match: str) -> None:
    """A malformed request is a ProtocolError that names what is wrong, and stores nothing."""
    b = Replica.open()
    before = b.state_digest()
    with pytest.raises(ProtocolError, match=match):
        serve(b, msg, 1000)
    assert b.state_digest() == before


def test_page_without_progress_is_refused() -> None:
    """A peer that keeps sending ops we hold while claiming more is cut off, not looped on."""
    a, b = Replica.open(), Replica.open()
    for i in range(3):
        b.send_message("b", "x", f"m{i}")
    _round(a, b)
    held = [raw for _, raw in b.ops_after(0)]
    b.send_message("b", "x", "new")

    def stuck(msg: protocol.Msg) -> protocol.Msg:
        if msg["t"] == "sync":
            return {"t": "diff", "v": protocol.shorten(b.vector())}
        return {"t": "page", "o": held, "r": {}, "m": True}

    with pytest.raises(ProtocolError, match="no progress"):
        drive(client_round(a, me=a.node_key, port=1, budget=4096), stuck)
