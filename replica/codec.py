"""msgpack in and out, with one error for bytes that do not decode.

Invariants:
* ``pack`` always writes bytes as msgpack bin and text as str, so a value
  round-trips through ``unpack`` unchanged (lists stay lists).
* ``unpack`` never lets a msgpack exception through: garbage of any kind
  raises ``Undecodable`` naming what msgpack complained of, and the caller
  translates it into its own error (an invalid op, a bad invite, a peer
  protocol error). Size limits are the caller's (msgpack's ``max_*_len``).
"""

from __future__ import annotations

from typing import Any

import msgpack

from replica.errors import Undecodable


def pack(value: object) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def unpack(data: bytes, *, strict_map_key: bool = True, **limits: int) -> Any:
    """Decode one msgpack value; ``Undecodable`` if ``data`` is not exactly one."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=strict_map_key, **limits)
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise Undecodable(type(exc).__name__) from None
