"""Op verification: tampered or malformed ops are refused and leave the replica unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import InvalidOp, Replica, Undecodable, codec, identity
from replica.ops import MAX_CONTENT_BYTES, VERSION, encode

Mutate = Callable[[list[Any]], None]


def _good_op(sender: Replica) -> bytes:
    sender.send_message("alpha", "beta", "original")
    return sender.ops_after(0)[0][1]


def _reseal(raw: bytes, mutate: Mutate, *, resign: identity.Identity | None = None) -> bytes:
    unsigned, sig = msgpack.unpackb(raw)
    header = msgpack.unpackb(unsigned)
    mutate(header)
    new_unsigned = msgpack.packb(header, use_bin_type=True)
    new_sig = resign.sign(new_unsigned) if resign else sig
    return msgpack.packb([new_unsigned, new_sig], use_bin_type=True)


def _apply_fails(r: Replica, raw: bytes, match: str) -> None:
    before = (r.state_digest(), r.vector(), r.stats())
    with pytest.raises(InvalidOp, match=match):
        r.apply([raw])
    assert (r.state_digest(), r.vector(), r.stats()) == before


def test_bad_signature_refused(mem: Replica) -> None:
    """An op whose signature bytes are flipped is refused."""
    raw = _good_op(Replica.open())
    unsigned, sig = msgpack.unpackb(raw)
    bad = msgpack.packb([unsigned, bytes([sig[0] ^ 1]) + sig[1:]], use_bin_type=True)
    _apply_fails(mem, bad, "bad signature")


def test_altered_body_refused(mem: Replica) -> None:
    """Changing the content after signing breaks the signature."""
    raw = _good_op(Replica.open())
    bad = _reseal(raw, lambda h: h[5].__setitem__("x", "forged"))
    _apply_fails(mem, bad, "bad signature")


def test_wrong_origin_refused(mem: Replica) -> None:
    """An op signed by one key but claiming another origin is refused."""
    victim = Replica.open()
    raw = _good_op(Replica.open())
    bad = _reseal(raw, lambda h: h.__setitem__(1, victim.node_key), resign=identity.generate())
    _apply_fails(mem, bad, "bad signature")


def _signed(kind: str, body: dict[str, Any], *, seq: int = 1) -> bytes:
    ident = identity.generate()
    return encode(ident.public_key, seq, 1 << 20, kind, body, sign=ident.sign)


def test_oversized_content_refused_even_if_signed(mem: Replica) -> None:
    """A validly signed op with content over the limit is refused."""
    body = {"f": "a", "fi": None, "c": "b", "ti": None, "t": None, "x": "x" * (MAX_CONTENT_BYTES + 1)}
    _apply_fails(mem, _signed("msg", body), "content exceeds")


def test_a_kind_that_is_no_name_is_refused(mem: Replica) -> None:
    """An op of a kind this release does not know is kept (tests/test_forward_compat.py), but only
    when its kind is a name: a kind with spaces, too long or not text is refused."""
    for kind in ("delete everything", "k" * 33, ""):
        _apply_fails(mem, _signed(kind, {}), "kind must be a name")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"w": [["rcpt", ["m", "r"], "d", 1]]}, "key of rcpt must be 3 strings"),
        ({"w": [[7, ["k"], "f", 1]]}, "table and field must be strings"),
        ({"w": [["prof", ["k"], None, "x"]]}, "table and field must be strings"),
        ({"w": [["member", ["t", "a"], "in", "yes"]]}, "bad value"),
        ({"w": []}, "at least one write"),
        ({"f": "a"}, "set body must be"),
    ],
)
def test_malformed_set_bodies_refused(mem: Replica, body: dict[str, Any], match: str) -> None:
    """Signed set ops with malformed writes are refused with a reason."""
    _apply_fails(mem, _signed("set", body), match)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "undecodable"),
        (b"\x93\x01\x02\x03", "not \\[unsigned, signature\\]"),
        (msgpack.packb([b"abc", b"def"]), "undecodable"),
        (msgpack.packb([msgpack.packb([VERSION + 1, b"k" * 32, 1, 1, "msg", {}]), b"s" * 64]), "unsupported op version"),
        (msgpack.packb([msgpack.packb([VERSION, b"k" * 31, 1, 1, "msg", {}]), b"s" * 64]), "32-byte"),
        (msgpack.packb([msgpack.packb([VERSION, b"k" * 32, 0, 1, "msg", {}]), b"s" * 64]), "seq"),
        (b"\xc1" * 10, "undecodable"),
    ],
)
def test_garbage_refused(mem: Replica, raw: bytes, match: str) -> None:
    """Undecodable or malformed bytes are refused with a clear reason."""
    _apply_fails(mem, raw, match)


def test_one_bad_op_rejects_the_whole_batch(mem: Replica) -> None:
    """A batch with one forged op stores none of it, and the error names the op's index."""
    src = Replica.open()
    for i in range(3):
        src.send_message("a", "b", f"m{i}")
    raws = [raw for _, raw in src.ops_after(0)]
    raws[2] = _reseal(raws[2], lambda h: h[5].__setitem__("x", "evil"))
    with pytest.raises(InvalidOp, match="op #2"):
        mem.apply(raws)
    assert mem.stats()["ops"] == 0


def test_apply_is_idempotent(mem: Replica) -> None:
    """Applying the same ops twice stores them once."""
    src = Replica.open()
    src.send_message("a", "b", "x")
    raws = [raw for _, raw in src.ops_after(0)]
    assert mem.apply(raws).new == 1
    again = mem.apply(raws)
    assert (again.new, again.duplicate) == (0, 1)
    assert mem.stats()["messages"] == 1


@given(st.binary(max_size=200))
def test_unpack_of_any_bytes_is_a_value_or_undecodable(data: bytes) -> None:
    """The one msgpack reader never lets a msgpack exception through, whatever the bytes."""
    try:
        codec.unpack(data)
    except Undecodable as exc:
        assert exc.cause


@given(st.binary(max_size=200))
def test_any_bytes_as_an_op_are_refused_cleanly(data: bytes) -> None:
    """Garbage offered as an op is an InvalidOp (never another exception) and stores nothing."""
    with Replica.open() as r, pytest.raises(InvalidOp):
        r.apply([data])
