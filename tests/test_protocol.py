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

    return drive(client_round(a, budget=budget), server)


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
        return {"t": "page", "g": protocol.group(held), "r": {}, "m": True}

    with pytest.raises(ProtocolError, match="no progress"):
        drive(client_round(a, budget=4096), stuck)


# -- the wire: codec, envelope, dispatch ------------------------------------------------------


def _request(msg: protocol.Msg, me: bytes = b"A" * 8, port: int = 7001) -> protocol.Request:
    return protocol.decode_request(protocol.encode(protocol.stamp(msg, me=me, port=port)))


def _here(rep: Replica, **extra: object) -> protocol.Here:
    return protocol.Here(**{"me": protocol.short(rep.node_key), "name": "b", "budget": 4096,  # type: ignore[arg-type]
                            "clock_ms": 1234, **extra})


SYNC_CODE = protocol.CODES["sync"]


@pytest.mark.parametrize(("data", "match"), [
    (b"", "empty message"),
    (b"\xc1", "older peerd"),
    (msgpack.packb({"t": "sync", "d": b"12345678"}), "older peerd"),
    (bytes([31]), "unknown message kind code 31"),
    (bytes([0]), "unknown message kind code 0"),
    (bytes([protocol.CODES["same"]]), "unknown message kind 'same'"),
    (bytes([SYNC_CODE]) + b"\xc1", "undecodable"),
    (bytes([SYNC_CODE]) + msgpack.packb([1, 2]), "not a map"),
    (bytes([SYNC_CODE | 0x20]) + b"1234567", "cut short"),
    (bytes([SYNC_CODE | 0x20 | 0x40]) + b"12345678" + b"\x1e", "cut short"),
    (bytes([SYNC_CODE]) + msgpack.packb({"n": b"12345678"}), "repeats a head field"),
    (bytes([SYNC_CODE]) + msgpack.packb({"t": "push"}), "repeats a head field"),
])
def test_a_request_that_is_not_ours_is_a_protocol_error(data: bytes, match: str) -> None:
    """Garbage, a bare map (the first protocol version), an unknown kind, a cut head or a body
    holding head fields: ProtocolError naming it, never a msgpack exception."""
    with pytest.raises(ProtocolError, match=match):
        protocol.decode_request(data)


def test_the_envelope_is_stamped_once_and_read_leniently() -> None:
    """stamp adds n, p and V without overwriting; envelope fields of the wrong type read as absent."""
    assert protocol.stamp({"t": "sync", "p": 9}, me=b"k" * 32, port=1) == {"t": "sync", "p": 9, "n": b"k" * 8,
                                                                          "V": 0b1100}
    env = protocol.envelope({"n": "not bytes", "p": True, "nm": "x" * 65})
    assert env == protocol.Envelope(None, None, None)
    assert _request({"t": "peers", "k": [], "nm": "a"}).envelope == protocol.Envelope(b"A" * 8, 7001, "a", frozenset({2, 3}))


def test_every_reply_names_the_answerer_and_a_peers_reply_its_clock() -> None:
    """dispatch signs each reply with n and V; only a peers reply carries the clock c."""
    b = Replica.open()
    sync = protocol.dispatch(b, _request({"t": "sync", "v": {}}), _here(b))
    assert sync.reply["n"] == protocol.short(b.node_key) and "c" not in sync.reply
    record = protocol.PeerRecord("10.0.0.9", 7733, b"C" * 8, "c", 1.26)
    peers = protocol.dispatch(b, _request({"t": "peers", "k": [], "nm": "a"}), _here(b, peers=[record]))
    assert peers.reply == {"t": "peers", "nm": "b", "k": [{"a": "10.0.0.9", "p": 7733, "n": b"C" * 8, "nm": "c",
                                                           "s": 1.3}], "n": protocol.short(b.node_key), "c": 1234,
                           "V": 0b1100}
    assert peers.learnt.names == ((b"A" * 8, "a"),)


def test_a_fresh_push_forwards_only_what_was_new_and_a_rounds_push_nothing() -> None:
    """The forwarding rule: a push without r passes on its new ops; with r: 1, none."""
    a, b = Replica.open(), Replica.open()
    a.send_message("a", "x", "one")
    old = [raw for _, raw in a.ops_after(0)]
    _round(b, a)  # b holds the first op already
    a.send_message("a", "x", "two")
    ops = [raw for _, raw in a.ops_after(0)]
    fresh = protocol.dispatch(b, _request({"t": "push", "o": ops}), _here(b))
    assert fresh.new == 1 and fresh.forward == [ops[1]] and fresh.reply["new"] == 1
    c = Replica.open()
    by_round = protocol.dispatch(c, _request({"t": "push", "o": old, "r": 1}), _here(c))
    assert by_round.new == 1 and by_round.forward == []


def test_peer_records_are_checked_and_capped() -> None:
    """learn keeps records with a string host and an int port, at most 1000, names only when usable."""
    good = {"a": "10.0.0.1", "p": 7733, "n": b"N" * 8, "nm": "n1"}
    bad = [{"a": 1, "p": 7733}, {"a": "h", "p": "7733"}, {"a": "h", "p": True}, "nope"]
    learnt = protocol.learn({"k": [*bad, good, {"a": "h2", "p": 1, "nm": "y" * 65}] + [good] * 2000})
    assert len(learnt.peers) == 1000 - len(bad)
    assert learnt.peers[0] == protocol.PeerRecord("10.0.0.1", 7733, b"N" * 8, "n1")
    assert learnt.peers[1].name is None
    with pytest.raises(ProtocolError):
        protocol.learn({"t": "peers"})


def test_catch_up_progress_counts_against_the_vector_it_began_with() -> None:
    """Progress is measured against the peer's vector at the start; small gaps report nothing."""
    assert protocol.start_catchup("p", {b"o": 10}, {}, 5.0) is None
    prog = protocol.start_catchup("p", {b"o": 1500, b"q": 10}, {b"q": 20}, 5.0)
    assert prog is not None and prog.total == 1500
    prog.advance({b"o": 600, b"q": 20})
    assert prog.started == 5.0 and prog.done == 600 and prog.to_dict(7.0)["rate"] == 300.0
