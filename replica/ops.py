"""Ops: the only thing that changes replicated state.

Wire and storage form of a signed op (msgpack)::

    [unsigned: bin, signature: bin(64)]
    unsigned = msgpack([VERSION, origin: bin(32), seq: int>=1, hlc: int, kind: str, body: map])

The signature covers the exact ``unsigned`` bytes, so verification never depends
on re-encoding. Invariants checked by ``decode``: the encoding, the signature
against the origin key, seq >= 1, the op size, a known kind and a body that
matches the kind's schema and size limits. Every integer of an op (seq, hlc, the
values of its writes) fits SQLite's signed 64 bits: seq in [1, 2^63 - 1], stamps
in [0, 2^63 - 1], wall-clock times in [0, 2^47 - 1], so nothing a peer signs can
overflow the store or the calendar. ``decode`` is pure: bytes in, ``Op`` or
``InvalidOp`` out; ``peek`` reads only what ``decode`` would accept as an identity.

Kinds: ``msg`` (a message), ``set`` (last-writer-wins register writes),
``rtr`` (a retraction of a message by its sender role), the membership kinds ``admit`` and
``rekey`` (``replica.membership``), ``ret`` (the retention horizon, ``replica.retention``),
``pin`` (a role pinned to nodes, ``replica.pins``) and the ``lease.*`` kinds (``replica.leases``).
A message body gains
``sd`` (session day) and ``tn`` (tenant) only when the sender gave them, so a
plain message keeps the original six keys.

Forward compatibility (an op written by a newer release): ``decode`` verifies
what it can of any op (encoding, header, signature, size) and returns it with
``understood`` False when its kind, or a body field or register write inside
it, is one this release does not know. Such an op is still stored, counted
and relayed byte for byte (``replica.store``); what this release knows of it
is applied, the rest waits for an upgrade. A body field this release knows is
always checked in full: an op is never half-valid. ``v1`` says whether a
peer of the first release (wire 2), which refuses every unknown kind, field
or table, would take the op; such peers are only ever sent ops with ``v1``.
Local writes are checked strictly (``validate_body``): this release never
writes what it would not understand.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replica import identity, leases, membership, pins, retention
from replica.codec import pack, unpack
from replica.errors import InvalidOp, Undecodable

VERSION = 1  # the op format (header layout); new features are new kinds or fields, never a new format
# What this release understands: 1 = the first release's kinds and fields, 2 = 0.2.0's (with ``ret``),
# 3 = with ``pin``, the ``lease.*`` kinds and acknowledgements, 4 = a pin's cuts (``c``), 5 = a role
# forgotten (``seen.forgot``) and a retracted message's sighting (``seen.sent``). An op held by a lower
# level is applied on upgrade (``migrate.upgrade_held``).
OP_LEVEL = 5
MAX_KIND_CHARS = 32  # an op kind this release does not know is still stored when its name is sane
MAX_CONTENT_BYTES = 900_000  # VantagePeers' limit: 900,000 bytes of UTF-8
MAX_OP_BYTES = 1024 * 1024  # a message of MAX_CONTENT_BYTES plus its header, names and signature
# A local JSON request (API or MCP) that carries one largest content even with every byte escaped
# (\u0001 is 6 bytes), plus the rest of the request: every local body limit uses this one.
MAX_JSON_REQUEST_BYTES = 6 * 1024 * 1024
MAX_NAME_CHARS = 256
MAX_WRITES_PER_OP = 1000
ORIGIN_BYTES = 32
MAX_SEQ = 2**63 - 1  # the largest SQLite integer: no op has a larger seq or hlc
MAX_WALL_MS = 2**47 - 1  # the wall-clock part of an HLC (63 bits less 16 logical ones)
MAX_SESSION_DAY = 2**31 - 1
MAX_MESSAGE_ID_CHARS = 64
MAX_FIELD_KEY_CHARS = 128

KIND_MSG = "msg"
KIND_SET = "set"
KIND_RETRACT = "rtr"

MSG_KEYS = frozenset({"f", "fi", "c", "ti", "t", "x"})
MSG_OPTIONAL_KEYS = frozenset({"sd", "tn"})
PROFILE_GROUPS = ("static", "dynamic")
# The key that a whole-text static or dynamic (peerd before profile objects) stands for: the text
# said what an agent is (VantagePeers' static.role) and what it is doing (dynamic.currentTask).
TEXT_KEYS = {"static": "role", "dynamic": "currentTask"}

Body = dict[str, Any]


@dataclass(frozen=True)
class Op:
    origin: bytes
    seq: int
    hlc: int
    kind: str
    body: Body
    raw: bytes
    understood: bool = True  # this release knows the kind and every field (module docstring)
    v1: bool = True  # a peer of the first release (wire 2) would take it

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
    if not is_seq(seq):  # no op has such a seq, and SQLite cannot even compare it
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
    if not is_seq(seq):
        raise InvalidOp(f"seq is not an integer in 1..{MAX_SEQ}")
    if not _stamp(hlc):
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
    if isinstance(origin, bytes) and len(origin) == ORIGIN_BYTES and is_seq(seq):
        return origin, seq
    return None


def decode(raw: bytes, *, verify: bool = True) -> Op:
    """Verify and decode one signed op; raise ``InvalidOp`` saying why not. ``verify=False`` checks
    everything but the signature (a snapshot page vouched for by a member: ``replica.bulk``)."""
    if not isinstance(raw, bytes | bytearray):
        raise InvalidOp("op is not bytes")
    raw = bytes(raw)
    if len(raw) > MAX_OP_BYTES:
        raise InvalidOp(f"op is {len(raw)} bytes, limit {MAX_OP_BYTES}")
    unsigned, sig, header = _unwrap(raw)
    _check_header(header)
    origin = header[1]
    if not verify and len(sig) != identity.SIG_BYTES:  # checked later, so it must at least have the form
        raise InvalidOp(f"signature is not {identity.SIG_BYTES} bytes")
    if verify and not identity.verify(origin, unsigned, sig):
        raise InvalidOp("bad signature for its origin")
    return _judged(header, raw)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_seq(v: object) -> bool:
    """An op's seq: an integer (never a bool) in 1..MAX_SEQ."""
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SEQ


def _stamp(v: object) -> bool:
    """An HLC stamp: an integer in 0..MAX_SEQ."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEQ


def _wall_ms(v: object) -> bool:
    """A wall-clock time in Unix milliseconds, as an HLC can carry it."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_WALL_MS


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


def _check_msg(body: Mapping[str, Any]) -> bool:
    if not set(body) >= MSG_KEYS:
        raise InvalidOp("msg body must have the keys f, fi, c, ti, t, x (and optionally sd, tn)")
    _name(body["f"], "sender")
    _name(body["fi"], "sender instance", optional=True)
    _name(body["c"], "channel", optional=body["t"] is not None)
    _name(body["ti"], "target instance", optional=True)
    _name(body["t"], "thread", optional=True)
    _content(body["x"])
    if "sd" in body and not (_is_int(body["sd"]) and 1 <= body["sd"] <= MAX_SESSION_DAY):
        raise InvalidOp(f"session day must be an integer from 1 to {MAX_SESSION_DAY}")
    if "tn" in body:
        _name(body["tn"], "tenant")
    return set(body) <= MSG_KEYS | MSG_OPTIONAL_KEYS


def _check_retract(body: Mapping[str, Any]) -> bool:
    if not set(body) >= {"m", "f"}:
        raise InvalidOp("rtr body must have the keys m, f")
    m = body["m"]
    if not isinstance(m, str) or not m or len(m) > MAX_MESSAGE_ID_CHARS:
        raise InvalidOp(f"retracted message id must be a non-empty string of at most {MAX_MESSAGE_ID_CHARS} chars")
    _name(body["f"], "retracting role")
    return set(body) == {"m", "f"}


def _str_or_none(v: object) -> bool:
    return v is None or (isinstance(v, str) and len(v.encode("utf-8", "surrogatepass")) <= MAX_CONTENT_BYTES)


def _json_or_none(v: object) -> bool:
    """A profile field's value: JSON text (any JSON value), or None for a removed field."""
    if v is None:
        return True
    if not _str_or_none(v):
        return False
    try:
        json.loads(v)  # type: ignore[arg-type]
    except (ValueError, RecursionError):
        return False
    return True


_FIELD_KEY = re.compile(rf"[^\x00-\x1f.]{{1,{MAX_FIELD_KEY_CHARS}}}")


def profile_field(group: str, key: str) -> str:
    """The register field of one key of a profile's ``static`` or ``dynamic`` object."""
    return f"{group}.{key}"


def split_profile_field(field: str) -> tuple[str, str] | None:
    """(group, key) of a per-key profile field such as ``dynamic.currentTask``, else None."""
    group, dot, key = field.partition(".")
    if not dot or group not in PROFILE_GROUPS or not _FIELD_KEY.fullmatch(key):
        return None
    return group, key


def _prof_field(field: str) -> Callable[[object], bool] | None:
    if field in ("name", "static", "dynamic"):  # name, and the whole-text fields of older nodes
        return _str_or_none
    return _json_or_none if split_profile_field(field) is not None else None


# LWW tables: table -> (key arities, {field: value predicate} or a field -> predicate lookup).
# A profile's key is [role] or [role, instance].
LWW_SCHEMA: dict[str, tuple[tuple[int, ...], Callable[[str], Callable[[object], bool] | None]]] = {
    "rcpt": ((3,), {"d": _wall_ms, "r": _wall_ms, "a": _wall_ms}.get),  # a: acknowledged (0.3)
    "ack": ((1,), {"req": lambda v: isinstance(v, bool)}.get),  # a message asks for acknowledgements (0.3)
    "prof": ((1, 2), _prof_field),
    "agent": ((1,), {"name": lambda v: isinstance(v, str), "alive": lambda v: isinstance(v, bool)}.get),
    "member": ((2,), {"in": lambda v: isinstance(v, bool)}.get),
    "thread": ((1,), {"created": _stamp}.get),
    # not last-writer-wins: a role's sightings and forgets (``replica.firstseen``); forgot, sent: 0.3
    "seen": ((1,), {"at": _wall_ms, "forgot": _wall_ms, "sent": _wall_ms}.get),
}


def _key_part(k: object) -> bool:
    return isinstance(k, str) and len(k) <= MAX_NAME_CHARS


def _check_write(w: object) -> bool:
    """Check one register write; False when its table or field is one this release does not know
    (a newer release's: kept, not applied). A known field is checked in full."""
    if not (isinstance(w, list) and len(w) == 4):
        raise InvalidOp("a write must be [table, key, field, value]")
    table, key, field, value = w
    if not isinstance(table, str) or not isinstance(field, str):
        raise InvalidOp("a write's table and field must be strings")
    schema = LWW_SCHEMA.get(table)
    if schema is None:
        return False
    arities, fields = schema
    if not (isinstance(key, list) and len(key) in arities and all(_key_part(k) for k in key)):
        raise InvalidOp(f"key of {table} must be {' or '.join(map(str, arities))} strings")
    check = fields(field)
    if check is None:
        return False
    if not check(value):
        raise InvalidOp(f"bad value for {table}.{field}")
    return True


def _check_set(body: Mapping[str, Any]) -> bool:
    writes = body.get("w")
    if not isinstance(writes, list) or not writes:
        raise InvalidOp("set body must be {w: [write, ...]} with at least one write")
    if len(writes) > MAX_WRITES_PER_OP:
        raise InvalidOp(f"more than {MAX_WRITES_PER_OP} writes in one op")
    known = [_check_write(w) for w in writes]
    return all(known) and set(body) == {"w"}


def _exact(check: Callable[[Mapping[str, Any]], None], keys: frozenset[str]) -> Callable[[Mapping[str, Any]], bool]:
    """A check of a body with exactly ``keys`` turned into one that also takes a newer release's
    fields beside them: the known ones are checked in full, the result says whether there were others."""
    def lenient(body: Mapping[str, Any]) -> bool:
        check({k: v for k, v in body.items() if k in keys} if keys <= set(body) else body)
        return set(body) == keys
    return lenient


_CHECKS: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    KIND_MSG: _check_msg, KIND_SET: _check_set, KIND_RETRACT: _check_retract,
    **{kind: _exact(check, membership.BODY_KEYS[kind]) for kind, check in membership.CHECKS.items()},
    **{kind: _exact(check, retention.BODY_KEYS[kind]) for kind, check in retention.CHECKS.items()},
    **pins.CHECKS,  # a pin's own check knows its optional cuts
    **{kind: _exact(check, leases.BODY_KEYS[kind]) for kind, check in leases.CHECKS.items()},
}

KNOWN_KINDS = frozenset(_CHECKS)

# What a peer of the first release takes (wire 2; it refuses every other kind, field or table).
V1_KINDS = frozenset({KIND_MSG, KIND_SET, KIND_RETRACT, *membership.KINDS})
V1_TABLE_FIELDS: dict[str, frozenset[str] | None] = {  # None: every field this release checks
    "rcpt": frozenset({"d", "r"}), "prof": None, "agent": frozenset({"name", "alive"}),
    "member": frozenset({"in"}), "thread": frozenset({"created"}), "seen": frozenset({"at"}),
}
_KIND = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_KIND_CHARS}}}")


def inspect_body(kind: object, body: Mapping[str, Any]) -> bool:
    """Check a peer's op body as far as this release can: InvalidOp when something it knows is
    wrong; True when it knows the kind and every field, False when the op holds a newer release's
    kind, field or register write (module docstring)."""
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is None:
        if not (isinstance(kind, str) and _KIND.fullmatch(kind)):
            raise InvalidOp(f"kind must be a name of 1 to {MAX_KIND_CHARS} letters, digits or _.:-")
        return False
    return check(body)


def validate_body(kind: object, body: Mapping[str, Any]) -> None:
    """Check a body this node is about to write: strictly, it must know the kind and every field."""
    if not isinstance(kind, str) or kind not in _CHECKS:
        raise InvalidOp(f"unknown kind {kind!r}")
    if not inspect_body(kind, body):
        raise InvalidOp(f"{kind} body holds fields this release does not know")


def _v1_tables_exceeded(kind: str, body: Mapping[str, Any]) -> bool:
    """Whether a set op writes a table or field the first release does not know."""
    if kind != KIND_SET:
        return False
    for table, _key, field, _value in body["w"]:
        fields = V1_TABLE_FIELDS.get(table, frozenset())
        if fields is not None and field not in fields:
            return True
    return False


def known_writes(op: Op) -> list[list[Any]]:
    """The register writes of a set op that this release knows (all of them, for an understood op)."""
    writes: list[list[Any]] = op.body["w"]
    if op.understood:
        return writes
    return [w for w in writes if (s := LWW_SCHEMA.get(w[0])) is not None and s[1](w[2]) is not None]


def level_of(op: Op) -> int | None:
    """What an op is stored with: None when this release understands it, else ``OP_LEVEL`` (the op
    waits for a release that knows more; ``replica.migrate.upgrade_held``)."""
    return None if op.understood else OP_LEVEL


def read_stored(raw: bytes) -> Op:
    """Decode an op this replica stored (it was verified when it arrived): no signature check, but
    what this release understands of it is judged again (an older release may have stored it)."""
    _unsigned, _sig, header = _unwrap(raw)
    return _judged(header, raw)


def local_op(origin: bytes, seq: int, hlc: int, kind: str, body: Body, *, raw: bytes) -> Op:
    """An op this node just wrote (its body checked strictly): understood, and taken by a peer of
    the first release only when it is of that release's kinds and tables."""
    return Op(origin, seq, hlc, kind, body, raw, understood=True,
              v1=kind in V1_KINDS and not _v1_tables_exceeded(kind, body))


def _judged(header: list[Any], raw: bytes) -> Op:
    """An op from its verified header: what this release understands of it judged."""
    _version, origin, seq, hlc, kind, body = header
    understood = inspect_body(kind, body)
    return Op(origin=origin, seq=seq, hlc=hlc, kind=kind, body=body, raw=raw, understood=understood,
              v1=understood and kind in V1_KINDS and not _v1_tables_exceeded(kind, body))
