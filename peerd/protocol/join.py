"""The join wire: unsealed requests to ``POST /v1/join`` on a member's peer port.

A machine that is not a member yet cannot seal, so these requests are plain msgpack maps with a
kind ``t``. Nothing in them or in their answers is secret: the fleet key only ever travels boxed
to the joiner's node key (approval, invite) or under the PAKE's key (one-time code).

* ``ask`` {``k`` joiner key, ``nm`` name, ``c`` commitment}
  -> ``asked`` {``id``, ``ka``, ``nm``, ``f``, ``na``, ``ttl``}
* ``reveal`` {``id``, ``nb`` the nonce committed to} -> ``waiting`` {``ttl``}
* ``wait`` {``id``} (long poll, at most ``WAIT_MAX`` s) -> ``waiting`` | ``approved`` {``s``} | ``rejected``
* ``cancel`` {``id``} -> ``ok``
* ``code`` {``ci`` code id, ``k``, ``nm``, ``pa`` PAKE message} -> ``code`` {``sid``, ``ka``, ``nm``, ``f``, ``pb``}
* ``confirm`` {``sid``, ``cb`` joiner's confirmation} -> ``approved`` {``ca``, ``s``}
* ``redeem`` {``i`` invite id, ``k``, ``nm``, ``x`` nonce, ``p`` proof} -> ``approved`` {``ka``, ``m``, ``s``}

A refusal is ``{t: error, e: message}`` with an HTTP status saying which kind (400 malformed,
403 refused, 404 unknown, 409 conflict, 410 expired or used, 413 too large, 429 too many).

Invariants: ``decode_join`` returns a ``JoinRequest`` whose fields have the types and sizes above,
or raises ``ProtocolError``; a body over ``MAX_BODY`` bytes is never decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peerd.protocol.wire import ERROR, Msg, ProtocolError, decode_map, encode_map

PATH = "/v1/join"
MAX_BODY = 2048
WAIT_MAX = 20.0
NAME_MAX = 64

ASK, REVEAL, WAIT, CANCEL, CODE, CONFIRM, REDEEM = "ask", "reveal", "wait", "cancel", "code", "confirm", "redeem"
ASKED, WAITING, APPROVED, REJECTED, OK = "asked", "waiting", "approved", "rejected", "ok"
OPENING = (ASK, CODE, REDEEM)  # the requests that open a request, a PAKE session or try an invite

# kind -> {field: (type, min length, max length)}
_FIELDS: dict[str, dict[str, tuple[type, int, int]]] = {
    ASK: {"k": (bytes, 32, 32), "nm": (str, 1, NAME_MAX), "c": (bytes, 32, 32)},
    REVEAL: {"id": (bytes, 16, 16), "nb": (bytes, 16, 16)},
    WAIT: {"id": (bytes, 16, 16)},
    CANCEL: {"id": (bytes, 16, 16)},
    CODE: {"ci": (str, 2, 2), "k": (bytes, 32, 32), "nm": (str, 1, NAME_MAX), "pa": (bytes, 1, 128)},
    CONFIRM: {"sid": (bytes, 16, 16), "cb": (bytes, 32, 32)},
    REDEEM: {"i": (bytes, 8, 8), "k": (bytes, 32, 32), "nm": (str, 1, NAME_MAX), "x": (bytes, 16, 16),
             "p": (bytes, 32, 32)},
}
KINDS = tuple(_FIELDS)


@dataclass(frozen=True)
class JoinRequest:
    kind: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def decode_join(data: bytes) -> JoinRequest:
    """A join request from its body; ProtocolError naming what is wrong."""
    if len(data) > MAX_BODY:
        raise ProtocolError(f"join request over {MAX_BODY} bytes")
    msg = decode_map(data)
    kind = msg.get("t")
    spec = _FIELDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        raise ProtocolError(f"unknown join request kind {kind!r}")
    fields: dict[str, Any] = {}
    for key, (typ, low, high) in spec.items():
        value = msg.get(key)
        if not isinstance(value, bytes | str) or not isinstance(value, typ) or not low <= len(value) <= high:
            raise ProtocolError(f"join request {kind!r} lacks a valid {key!r}")
        if isinstance(value, str) and not value.isprintable():
            raise ProtocolError(f"join request {kind!r} has control characters in {key!r}")
        fields[key] = value
    return JoinRequest(str(kind), fields)


def request(kind: str, **fields: Any) -> bytes:
    return encode_map({"t": kind, **fields})


def error(message: str) -> Msg:
    return {"t": ERROR, "e": message}


class JoinRefused(ProtocolError):
    """The member refused a join request; ``status`` says how (see the table above)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def answer_of(data: bytes, status: int) -> Msg:
    """A member's answer; JoinRefused for an ``error`` (with its message), ProtocolError if it is
    not one of ours at all."""
    msg = decode_map(data)
    if msg.get("t") == ERROR or status != 200:
        raise JoinRefused(str(msg.get("e", f"HTTP {status}")), status)
    return msg
