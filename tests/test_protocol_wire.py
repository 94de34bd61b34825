"""The wire of protocol 2: the head codec and a page's ops grouped by origin."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd import protocol
from peerd.protocol import ProtocolError, client_round, drive, serve
from peerd.seal import SEAL_OVERHEAD, seal
from replica import Replica
from replica.errors import RemoteError
from replica.ops import ORIGIN_BYTES, peek

ME = b"M" * 32


def _ops(rep: Replica) -> list[bytes]:
    return [raw for _, raw in rep.ops_after(0)]


def _wire_round(a: Replica, b: Replica, budget: int = 4096) -> protocol.RoundResult:
    """A round whose every request and reply goes through the codec, as between two daemons."""

    def server(msg: protocol.Msg) -> protocol.Msg:
        req = protocol.decode_request(protocol.encode(protocol.stamp(msg, me=a.node_key, port=7733)))
        out = protocol.dispatch(b, req, protocol.Here(protocol.short(b.node_key), "b", budget, 0))
        return protocol.decode(protocol.encode(out.reply))

    return drive(client_round(a, budget=budget), server)


# -- the head codec -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(protocol.CODES))
def test_every_kind_round_trips_through_the_head_codec(kind: str) -> None:
    """Each kind, with and without its envelope and fields, decodes to the message encoded."""
    for msg in ({"t": kind}, {"t": kind, "n": b"N" * 8}, {"t": kind, "p": 65535},
                {"t": kind, "n": b"N" * 8, "p": 1, "v": {b"o" * 8: 3}, "nm": "x", "c": 2**40}):
        assert protocol.decode(protocol.encode(msg)) == msg


def test_the_in_sync_request_is_a_head_and_a_digest() -> None:
    """With more origins than go up front, a sync request is 27 bytes: the head (kind, n, p),
    the digest and the wire versions spoken; sealed, 67."""
    rep = Replica.open()
    for _ in range(protocol.FULL_VECTOR_MAX + 1):
        with Replica.open() as other:
            other.send_message("o", "x", "m")
            rep.apply(_ops(other))
    data = protocol.encode(protocol.stamp(protocol.sync_request(rep.vector()), me=ME, port=7733))
    code = protocol.CODES["sync"] | 0x20 | 0x40
    assert data[:11] == bytes([code]) + ME[:8] + (7733).to_bytes(2, "big")
    assert msgpack.unpackb(data[11:]) == {"d": protocol.sync_request(rep.vector())["d"], "V": 0b1100}
    assert len(data) == 27 and len(seal(bytes(32), data)) == 27 + SEAL_OVERHEAD == 67


def test_the_in_sync_reply_is_a_head_and_the_versions() -> None:
    """``same`` with the answerer's id is 9 bytes, and 3 more state its wire versions (2 and 3)."""
    reply = protocol.sign_reply({"t": "same"}, me=ME, kind="sync", clock_ms=0)
    assert protocol.encode(reply) == bytes([protocol.CODES["same"] | 0x20]) + ME[:8] + msgpack.packb({"V": 12})


@pytest.mark.parametrize(("n", "p"), [(b"x" * 9, 0), (b"x" * 7, 65536), ("text", True), (None, -1)])
def test_an_envelope_the_head_cannot_carry_is_left_out(n: object, p: object) -> None:
    """An n that is not 8 bytes or a p that is not a port would read as absent: it is not sent."""
    msg = protocol.decode(protocol.encode({"t": "sync", "d": b"12345678", "n": n, "p": p}))
    assert msg == {"t": "sync", "d": b"12345678"}
    assert protocol.envelope(msg) == protocol.Envelope()


@pytest.mark.parametrize("kind", ["all", None, 3])
def test_a_kind_without_a_code_is_our_bug(kind: object) -> None:
    with pytest.raises(ValueError, match="no wire code"):
        protocol.encode({"t": kind})


# -- a page's ops grouped by origin ---------------------------------------------------------------


def _signed_ops(origins: int, each: int) -> list[bytes]:
    out: list[bytes] = []
    for i in range(origins):
        with Replica.open() as rep:
            for j in range(each):
                rep.send_message("r", "x", f"{i}-{j} " + "é" * (j * 40))  # crosses the 256-byte bin header
            out += _ops(rep)
    return out


REAL = _signed_ops(3, 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80), st.sampled_from(REAL)), max_size=12))
def test_grouping_gives_back_exactly_the_ops_in_order(raws: list[bytes]) -> None:
    """Any byte strings, ops or not, come back byte for byte and in order."""
    assert protocol.ungroup(protocol.group(raws)) == raws


def test_each_origin_key_is_said_once_per_group() -> None:
    """Ops of one origin form one group naming its key; each op is 32 bytes shorter in it."""
    groups = protocol.group(REAL)
    origins = [ident[0] for ident in map(peek, REAL) if ident is not None]
    assert [g[0] for g in groups] == list(dict.fromkeys(origins)) and len(groups) == 3
    parts = [part for g in groups for part in g[1:]]
    assert [len(raw) - len(part) for raw, part in zip(REAL, parts, strict=True)] == [ORIGIN_BYTES] * len(REAL)
    assert all(g[0] not in part for g in groups for part in g[1:])  # type: ignore[operator]


@pytest.mark.parametrize(("groups", "match"), [
    ({"not": "a list"}, "not a list of groups"),
    ([[]], r"not \[origin key or nil"),
    ([[b"short", b"op"]], r"not \[origin key or nil"),
    ([b"flat op"], r"not \[origin key or nil"),
    ([[None, 5]], "byte strings"),
    ([[b"K" * 32, b"\x92\xc4\x05hello"]], "no place for its origin key"),
])
def test_malformed_groups_are_protocol_errors(groups: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        protocol.ungroup(groups)


def test_a_group_naming_another_origin_fails_verification_and_stores_nothing() -> None:
    """The signature covers the key put back: a page claiming ops for another origin is refused whole."""
    a, b = Replica.open(), Replica.open()
    b.send_message("b", "x", "one")
    b.send_message("b", "x", "two")
    before = a.state_digest()

    def lying(msg: protocol.Msg) -> protocol.Msg:
        reply = serve(b, msg, 4096)
        if "pg" in reply:
            for g in reply["pg"]["g"]:
                g[0] = bytes(32)
        return reply

    with pytest.raises(RemoteError, match="bad signature"):
        drive(client_round(a, budget=4096), lying)
    assert a.state_digest() == before and a.vector() == {}


def test_rounds_through_the_codec_converge_with_grouped_pages() -> None:
    """Paged rounds (small budget, sync, pulls and pushes) between replicas over the codec converge."""
    a, b = Replica.open(), Replica.open()
    for i in range(25):
        a.send_message("a", "x", f"a{i}")
        b.send_message("b", "x", f"b{i}")
    res = _wire_round(a, b, budget=700)
    assert (res.pulled, res.pushed) == (25, 25) and res.requests > 3
    assert a.state_digest() == b.state_digest() and a.vector() == b.vector()
    assert _wire_round(a, b).same
