"""Real daemons against outsiders and bad input: wrong fleet key, forged ops, malformed and oversized bodies."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from peerd import protocol
from peerd.config import decode_fleet_key, encode_fleet_key, fleet_id, new_fleet_key
from peerd.seal import open_sealed, seal
from replica import identity, open_home, ops
from tests.daemons import Daemon, Fleet, message_ids, post_raw, read_only, wait_until

pytest_plugins = ["tests.daemons"]

MiB = 1024 * 1024
MAX_CONTENT = ops.MAX_CONTENT_BYTES


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Daemon, Daemon, Daemon]]:
    """Victim ``a`` and its honest peer ``b`` share a key; ``w`` has another key and is seeded with ``a``."""
    fleet = Fleet(tmp_path_factory.mktemp("security"))
    try:
        a = fleet.add("a")
        b = fleet.add("b", seeds=[a])
        w = fleet.add("w", seeds=[a], fleet_key=encode_fleet_key(new_fleet_key()))
        fleet.start()
        wait_until(lambda: (row := b.peer(a)) is not None and row["reachable"], 20, "b to reach a")
        fleet.wait_converged([a, b])  # b's own first op (its admit) is on a before any test looks at a's state
        yield fleet, a, b, w
    finally:
        fleet.close()


def origins(d: Daemon) -> set[str]:
    """Hex keys of every origin whose ops the replica holds."""
    with read_only(d.db) as conn:
        return {bytes(r[0]).hex() for r in conn.execute("SELECT node FROM origins WHERE contig > 0 OR top > 0")}


def stored_state(d: Daemon) -> tuple[Any, ...]:
    """Everything a bad request must leave unchanged: op count, origins, messages, digest."""
    return d.status()["totals"]["ops"], origins(d), message_ids(d.db), d.digest()


def test_node_with_the_wrong_fleet_key_is_refused(trio: tuple[Fleet, Daemon, Daemon, Daemon]) -> None:
    """A daemon with another fleet key gets nowhere: the victim refuses it and stores nothing it has."""
    _, a, b, w = trio
    mid = w.send("intruder", "victims", "let me in")["messageId"]

    # w may first fail to connect (a's port not yet open): wait for the refusal itself.
    row = wait_until(lambda: (r := next((p for p in w.peers() if p["address"] == a.addr), None))
                     and "not in the same fleet" in (r["last_error"] or "") and r, 20, "w to be refused by a")
    assert not row["reachable"]
    wait_until(lambda: "refused request" in a.log_text(), 10, "a to log the refused request")
    refused = a.status()["counters"]["refused"]
    assert refused >= 1
    wait_until(lambda: a.status()["counters"]["refused"] >= refused + 2, 20,
               "w to retry (and be refused) twice more: a chance for a stray success to show")
    assert not a.has_message(mid)
    assert mid not in message_ids(a.db)
    assert w.node_id not in origins(a)
    assert w.short_id not in {p["node_id"] for p in a.peers()}
    assert (row := b.peer(a)) is not None and row["reachable"]


def _signed_op(ident: identity.Identity, seq: int, content: str, **body: Any) -> bytes:
    fields = {"f": "mallory", "fi": None, "c": "victims", "ti": None, "t": None, "x": content, **body}
    return ops.encode(ident.public_key, seq, time.time_ns() // 1_000_000 << 16, "msg", fields, sign=ident.sign)


def _altered(raw: bytes, **changes: Any) -> bytes:
    """The op with its content (or header) changed after signing; the old signature kept."""
    unsigned, sig = msgpack.unpackb(raw)
    version, origin, seq, hlc, kind, body = msgpack.unpackb(unsigned)
    body = {**body, **changes.pop("body", {})}
    header = {"origin": origin, "seq": seq, "hlc": hlc, "kind": kind, **changes}
    packed = msgpack.packb([version, header["origin"], header["seq"], header["hlc"], header["kind"], body],
                           use_bin_type=True)
    return bytes(msgpack.packb([packed, sig], use_bin_type=True))


def _forged_as(victim_key: bytes) -> bytes:
    """An op claiming the victim as its origin, signed by someone else's key (a seq the victim has
    not used: an op whose (origin, seq) is held already is skipped unchecked)."""
    mallory = identity.generate()
    unsigned = msgpack.packb([ops.VERSION, victim_key, 1000, 1, "msg",
                              {"f": "boss", "fi": None, "c": "victims", "ti": None, "t": None, "x": "pay mallory"}],
                             use_bin_type=True)
    return bytes(msgpack.packb([unsigned, mallory.sign(unsigned)], use_bin_type=True))


BadBatch = Callable[[Daemon, bytes], list[bytes]]

BAD_OPS: dict[str, tuple[BadBatch, str]] = {
    "altered content": (lambda a, good: [_altered(good, body={"x": "tampered"})], "bad signature"),
    "altered seq": (lambda a, good: [_altered(good, seq=7)], "bad signature"),
    "forged origin": (lambda a, good: [_forged_as(bytes.fromhex(a.node_id))], "bad signature"),
    "signed but oversized content": (
        lambda a, good: [_signed_op(identity.generate(), 1, "z" * (MAX_CONTENT + 1))], "content exceeds"),
    "signed but malformed body": (
        lambda a, good: [_signed_op(identity.generate(), 1, "hi", f=["not", "a", "name"])], "sender must be"),
    "a newer release's field beside a malformed one": (
        lambda a, good: [_signed_op(identity.generate(), 1, "hi", ti=7, extra="key")], "target instance must be"),
    "valid op batched with an altered one": (
        lambda a, good: [good, _altered(good, body={"x": "tampered"})], "bad signature"),
}


def _push(a: Daemon, key: bytes, batch: list[bytes]) -> tuple[int, dict[str, Any]]:
    body = seal(key, protocol.encode({"t": "push", "o": batch, "n": b"\x00" * 8}))
    status, reply = post_raw(a.peer_url, body)
    return status, protocol.decode(open_sealed(key, reply))


@pytest.mark.parametrize("case", list(BAD_OPS))
def test_forged_or_altered_op_is_rejected_with_a_reason(trio: tuple[Fleet, Daemon, Daemon, Daemon], case: str) -> None:
    """A sealed push holding a forged or altered op gets HTTP 400 with a sealed reason; nothing is stored."""
    fleet, a, _, _ = trio
    key = decode_fleet_key(fleet.key)
    author = identity.generate()
    good = _signed_op(author, 1, f"genuine for {case}")
    make, reason = BAD_OPS[case]
    before = stored_state(a)

    status, reply = _push(a, key, make(a, good))

    assert status == 400
    assert reply["t"] == "error"
    assert reason in reply["e"]
    assert stored_state(a) == before
    assert author.public_key.hex() not in origins(a)
    # The same good op alone is refused quietly while nobody let its author in (the fleet key alone
    # gives no voice), and accepted once a member did: the rejection was about the bad op.
    status, reply = _push(a, key, [good])
    assert (status, reply["t"], reply["new"]) == (200, "ok", 0)
    assert ops.message_id(author.public_key, 1) not in message_ids(a.db)
    with contextlib.closing(open_home(a.home)) as rep:
        rep.admit_node(author.public_key, "author", fleet_id(key))
    status, reply = _push(a, key, [good])
    assert (status, reply["t"], reply["new"]) == (200, "ok", 1)
    assert ops.message_id(author.public_key, 1) in message_ids(a.db)


MALFORMED: dict[str, tuple[Callable[[bytes], bytes], int]] = {
    "garbage sealed with the fleet key": (lambda k: seal(k, os.urandom(300)), 400),
    "sealed head whose fields are not a map": (lambda k: seal(k, bytes([protocol.CODES["sync"]]) + msgpack.packb([1, 2])),
                                               400),
    "sealed head of an unknown kind": (lambda k: seal(k, bytes([31])), 400),
    "sealed head cut short": (lambda k: seal(k, bytes([protocol.CODES["sync"] | 0x20]) + b"abc"), 400),
    "sealed bare map (the first protocol version)": (lambda k: seal(k, msgpack.packb({"t": "sync", "d": b"x"})), 400),
    "sealed push whose ops are not bytes": (lambda k: seal(k, protocol.encode({"t": "push", "o": [1, "x"]})), 400),
    "garbage, unsealed": (lambda k: os.urandom(300), 403),
    "plain msgpack, unsealed": (lambda k: msgpack.packb({"t": "sync", "d": b"x"}), 403),
    "empty body": (lambda k: b"", 403),
    "sealed with another key": (lambda k: seal(new_fleet_key(), msgpack.packb({"t": "sync", "d": b"x"})), 403),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_peer_body_is_refused(trio: tuple[Fleet, Daemon, Daemon, Daemon], case: str) -> None:
    """A body that does not open gets 403; one that opens but breaks the protocol gets a sealed 400."""
    fleet, a, _, _ = trio
    key = decode_fleet_key(fleet.key)
    make, expected = MALFORMED[case]
    before = stored_state(a)

    status, reply = post_raw(a.peer_url, make(key))

    assert status == expected
    if expected == 400:
        answer = protocol.decode(open_sealed(key, reply))
        assert answer["t"] == "error" and answer["e"]
    else:
        assert reply  # a readable reason, not an empty answer
    assert stored_state(a) == before


def test_oversized_peer_body_gets_413(trio: tuple[Fleet, Daemon, Daemon, Daemon]) -> None:
    """A peer body over max_body_bytes (4 MiB by default) is refused with 413 and changes nothing."""
    fleet, a, _, _ = trio
    before = stored_state(a)
    body = seal(decode_fleet_key(fleet.key), os.urandom(4 * MiB + 1024))
    status, _ = post_raw(a.peer_url, body)
    assert status == 413
    assert stored_state(a) == before


def test_content_over_64k_via_local_api_gets_400(trio: tuple[Fleet, Daemon, Daemon, Daemon]) -> None:
    """/api/send refuses content over 900,000 bytes with 400 and a reason, stores nothing; exactly that is fine."""
    _, a, _, _ = trio
    before = stored_state(a)
    status, body = a.call("POST", "/api/send", {"from": "big", "channel": "sink", "content": "é" * (MAX_CONTENT // 2 + 1)})
    assert status == 400
    assert "content" in body["error"]
    assert stored_state(a) == before
    sent = a.send("big", "sink", "q" * MAX_CONTENT)
    assert sent["messageId"] in message_ids(a.db)
