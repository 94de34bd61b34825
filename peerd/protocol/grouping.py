"""A page's ops grouped by origin, so each origin's 32-byte key crosses the wire once.

An op as stored (``replica.ops``) is the msgpack array ``[unsigned, signature]``: the byte
``0x92``, a bin header (2, 3 or 5 bytes), then ``unsigned``, which opens with ``0x96 0x01
0xc4 0x20`` and the origin's 32-byte key. In a page the ops go as groups ``[origin, op', ...]``,
each op' being the op with those 32 key bytes cut out (everything else, headers included, kept
byte for byte); the receiver puts the key back and verifies the op as it would any other (the
signature covers the key, so a group naming the wrong origin fails verification). An op not laid
out so goes whole, in a group whose origin is nil.

Invariants: ``ungroup(group(raws)) == raws`` for any list of byte strings, order kept;
``ungroup`` raises ``ProtocolError`` for anything but groups of that shape, never a library
exception; a cut op is never longer than its op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peerd.protocol.wire import ProtocolError
from replica.ops import ORIGIN_BYTES

ARRAY_OF_TWO = 0x92
BIN_HEADER = {0xC4: 2, 0xC5: 3, 0xC6: 5}  # msgpack bin 8, 16, 32: bytes before the unsigned op
OPENING = b"\x96\x01\xc4\x20"  # unsigned: a 6-item array, op version 1, a 32-byte bin (the key)


def key_at(op: bytes) -> int | None:
    """Where the origin key starts in ``op`` (whole or cut), or None when it is not laid out so."""
    if len(op) < 2 or op[0] != ARRAY_OF_TWO or op[1] not in BIN_HEADER:
        return None
    at = 1 + BIN_HEADER[op[1]] + len(OPENING)
    return at if op[at - len(OPENING) : at] == OPENING else None


def _cut(raw: bytes) -> tuple[bytes | None, bytes]:
    """(origin, op without its key), or (None, raw) when the key cannot be cut out."""
    at = key_at(raw)
    if at is None or len(raw) < at + ORIGIN_BYTES:
        return None, raw
    return raw[at : at + ORIGIN_BYTES], raw[:at] + raw[at + ORIGIN_BYTES :]


def group(raws: Sequence[bytes]) -> list[list[bytes | None]]:
    """Consecutive ops of one origin as one group ``[origin, op', ...]`` (pure)."""
    groups: list[list[bytes | None]] = []
    for raw in raws:
        origin, part = _cut(raw)
        if groups and groups[-1][0] == origin:
            groups[-1].append(part)
        else:
            groups.append([origin, part])
    return groups


def _put_back(part: object, origin: bytes | None) -> bytes:
    if not isinstance(part, bytes):
        raise ProtocolError("a page's ops must be byte strings")
    if origin is None:
        return part
    at = key_at(part)
    if at is None:
        raise ProtocolError("an op in a page group has no place for its origin key")
    return part[:at] + origin + part[at:]


def ungroup(raw: Any) -> list[bytes]:
    """The ops of a page's groups, in order; ProtocolError when they are not groups."""
    if not isinstance(raw, list):
        raise ProtocolError("page ops are not a list of groups")
    out: list[bytes] = []
    for g in raw:
        if not (isinstance(g, list) and g and (g[0] is None or (isinstance(g[0], bytes)
                                                                and len(g[0]) == ORIGIN_BYTES))):
            raise ProtocolError("a page group is not [origin key or nil, op, ...]")
        out += (_put_back(part, g[0]) for part in g[1:])
    return out
