"""Ops: the only thing that changes replicated state.

Wire and storage form of a signed op (msgpack)::

    [unsigned: bin, signature: bin(64)]
    unsigned = msgpack([VERSION, origin: bin(32), seq: int>=1, hlc: int, kind: str, body: map])

The signature covers the exact ``unsigned`` bytes, so verification never depends
on re-encoding. Invariants checked by ``decode``: the encoding, the signature
against the origin key, seq >= 1, the op size, a known kind and a body that
matches the kind's schema and size limits. ``decode`` is pure: bytes in, ``Op``
or ``InvalidOp`` out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replica import identity, membership
from replica.codec import pack, unpack
from replica.errors import InvalidOp, Undecodable

VERSION = 1
MAX_OP_BYTES = 256 * 1024
MAX_CONTENT_BYTES = 64 * 1024
MAX_NAME_CHARS = 256
MAX_WRITES_PER_OP = 1000
ORIGIN_BYTES = 32

KIND_MSG = "msg"
KIND_SET = "set"

Body = dict[str, Any]


@dataclass(frozen=True)
class Op:
    origin: bytes
    seq: int
    hlc: int
    kind: str
    body: Body
    raw: bytes

    @property
    def size(self) -> int:
        return len(self.raw)


def encode(origin: bytes, seq: int, hlc: int, kind: str, body: Body, *, sign: Callable[[bytes], bytes]) -> bytes:
    """Build and sign an op; returns its storage/wire bytes."""
    unsigned = pack([VERSION, origin, seq, hlc, kind, body])
    return pack([unsigned, sign(unsigned)])


MESSAGE_ID_PREFIX = 8


def message_id(origin: bytes, seq: int) -> str:
    """A message's id: stable and global, named after the op that wrote it (origin prefix, seq)."""
    return f"{origin[:MESSAGE_ID_PREFIX].hex()}-{seq}"


def parse_message_id(mid: str) -> tuple[bytes, int] | None:
    """(origin prefix, seq) of a message id, or None if it is not one."""
    head, _, tail = mid.partition("-")
    if len(head) != 2 * MESSAGE_ID_PREFIX or not tail.isascii() or not tail.isdigit() or len(tail) > 19:
        return None
    seq = int(tail)
    if seq >= 2**63:  # no op has such a seq, and SQLite cannot even compare it
        return None
    try:
        return bytes.fromhex(head), seq
    except ValueError:
        return None


def derived_id(prefix: str, origin: bytes, seq: int) -> str:
    return prefix + hashlib.blake2b(origin + seq.to_bytes(8, "big"), digest_size=10).hexdigest()


def _unpack(data: bytes) -> Any:
    try:
        return unpack(data, max_bin_len=MAX_OP_BYTES, max_str_len=MAX_OP_BYTES,
                      max_array_len=MAX_WRITES_PER_OP * 4, max_map_len=64)
    except Undecodable as exc:
        raise InvalidOp(f"undecodable op ({exc.cause})") from None


def _unwrap(raw: bytes) -> tuple[bytes, bytes, Any]:
    """Split a signed op into (unsigned bytes, signature, decoded header)."""
    outer = _unpack(raw)
    if not (isinstance(outer, list) and len(outer) == 2):
        raise InvalidOp("op is not [unsigned, signature]")
    unsigned, sig = outer
    if not isinstance(unsigned, bytes) or not isinstance(sig, bytes):
        raise InvalidOp("op parts are not bytes")
    return unsigned, sig, _unpack(unsigned)


def _check_header(header: Any) -> None:
    if not (isinstance(header, list) and len(header) == 6):
        raise InvalidOp("op header is not a 6-item list")
    version, origin, seq, hlc, _kind, body = header
    if version != VERSION:
        raise InvalidOp(f"unsupported op version {version!r}")
    if not isinstance(origin, bytes) or len(origin) != ORIGIN_BYTES:
        raise InvalidOp("origin is not a 32-byte node key")
    if not _is_int(seq) or seq < 1:
        raise InvalidOp("seq is not an integer >= 1")
    if not _is_int(hlc) or hlc < 0 or hlc >= 1 << 63:
        raise InvalidOp("hlc is not a non-negative 63-bit integer")
    if not isinstance(body, dict):
        raise InvalidOp("body is not a map")


def peek(raw: object) -> tuple[bytes, int] | None:
    """(origin, seq) of an op without verifying it, or None if it does not parse."""
    if not isinstance(raw, bytes) or len(raw) > MAX_OP_BYTES:
        return None
    try:
        _unsigned, _sig, header = _unwrap(raw)
    except InvalidOp:
        return None
    if not (isinstance(header, list) and len(header) == 6):
        return None
    origin, seq = header[1], header[2]
    if isinstance(origin, bytes) and len(origin) == ORIGIN_BYTES and _is_int(seq):
        return origin, seq
    return None


def decode(raw: bytes) -> Op:
    """Verify and decode one signed op; raise ``InvalidOp`` saying why not."""
    if not isinstance(raw, bytes | bytearray):
        raise InvalidOp("op is not bytes")
    raw = bytes(raw)
    if len(raw) > MAX_OP_BYTES:
        raise InvalidOp(f"op is {len(raw)} bytes, limit {MAX_OP_BYTES}")
    unsigned, sig, header = _unwrap(raw)
    _check_header(header)
    _version, origin, seq, hlc, kind, body = header
    if not identity.verify(origin, unsigned, sig):
        raise InvalidOp("bad signature for its origin")
    validate_body(kind, body)
    return Op(origin=origin, seq=seq, hlc=hlc, kind=kind, body=body, raw=raw)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _name(v: object, what: str, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if not isinstance(v, str) or not v or len(v) > MAX_NAME_CHARS:
        raise InvalidOp(f"{what} must be a non-empty string of at most {MAX_NAME_CHARS} chars")


def _content(v: object) -> None:
    if not isinstance(v, str):
        raise InvalidOp("content must be a string")
    if len(v.encode("utf-8", "surrogatepass")) > MAX_CONTENT_BYTES:
        raise InvalidOp(f"content exceeds {MAX_CONTENT_BYTES} bytes")


def _check_msg(body: Mapping[str, Any]) -> None:
    if set(body) != {"f", "fi", "c", "ti", "t", "x"}:
        raise InvalidOp("msg body must have exactly the keys f, fi, c, ti, t, x")
    _name(body["f"], "sender")
    _name(body["fi"], "sender instance", optional=True)
    _name(body["c"], "channel", optional=body["t"] is not None)
    _name(body["ti"], "target instance", optional=True)
    _name(body["t"], "thread", optional=True)
    _content(body["x"])


def _wall_ms(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63


def _str_or_none(v: object) -> bool:
    return v is None or (isinstance(v, str) and len(v.encode("utf-8", "surrogatepass")) <= MAX_CONTENT_BYTES)


# LWW tables: table -> (key arity, {field: value predicate})
LWW_SCHEMA: dict[str, tuple[int, dict[str, Callable[[object], bool]]]] = {
    "rcpt": (3, {"d": _is_int, "r": _is_int}),
    "prof": (1, {"name": _str_or_none, "static": _str_or_none, "dynamic": _str_or_none}),
    "agent": (1, {"name": lambda v: isinstance(v, str), "alive": lambda v: isinstance(v, bool)}),
    "member": (2, {"in": lambda v: isinstance(v, bool)}),
    "thread": (1, {"created": _is_int}),
    # not last-writer-wins: the earliest time wins (``replica.firstseen``)
    "seen": (1, {"at": _wall_ms}),
}


def _key_part(k: object) -> bool:
    return isinstance(k, str) and len(k) <= MAX_NAME_CHARS


def _check_write(w: object) -> None:
    if not (isinstance(w, list) and len(w) == 4):
        raise InvalidOp("a write must be [table, key, field, value]")
    table, key, field, value = w
    schema = LWW_SCHEMA.get(table) if isinstance(table, str) else None
    if schema is None:
        raise InvalidOp(f"unknown table {table!r}")
    arity, fields = schema
    if not (isinstance(key, list) and len(key) == arity and all(_key_part(k) for k in key)):
        raise InvalidOp(f"key of {table} must be {arity} strings")
    check = fields.get(field) if isinstance(field, str) else None
    if check is None:
        raise InvalidOp(f"unknown field {field!r} of {table}")
    if not check(value):
        raise InvalidOp(f"bad value for {table}.{field}")


def _check_set(body: Mapping[str, Any]) -> None:
    writes = body.get("w")
    if set(body) != {"w"} or not isinstance(writes, list) or not writes:
        raise InvalidOp("set body must be {w: [write, ...]} with at least one write")
    if len(writes) > MAX_WRITES_PER_OP:
        raise InvalidOp(f"more than {MAX_WRITES_PER_OP} writes in one op")
    for w in writes:
        _check_write(w)


_CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {KIND_MSG: _check_msg, KIND_SET: _check_set,
                                                          **membership.CHECKS}


def validate_body(kind: object, body: Mapping[str, Any]) -> None:
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        raise InvalidOp(f"unknown kind {kind!r}")
    check(body)
