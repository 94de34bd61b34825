"""The wire: message kinds, the envelope, and the codec.

A message is a map with string keys and a kind ``t``; byte strings are msgpack
``bin``. Every request carries the caller's envelope (``n`` its short id, ``p``
its peer port; ``nm`` its name on ``peers``; ``V`` the wire versions it speaks,
``peerd.protocol.versions``), every 200 reply the answerer's ``n`` and ``V``
(and ``c``, its clock, on ``peers``), every error reply its ``V``.

A sealed peer message (``encode``/``decode``) is a head, then the other fields
as a msgpack map (left out when there are none)::

    head byte: bits 0-4 the kind's code (``CODES``), bit 5 set when ``n`` follows,
               bit 6 set when ``p`` follows, bit 7 clear
    [n: 8 bytes]  [p: 2 bytes, big-endian]  [msgpack map of the other fields]

so the kind and the envelope cost 1 + 8 + 2 bytes instead of their keys and
msgpack framing. Bit 7 is set in the first byte of every msgpack map, so a
message of the first protocol version (a bare map) and one of this version can
never be taken for each other. The unsealed join wire (``peerd.protocol.join``)
stays a bare msgpack map (``encode_map``/``decode_map``).

Invariants: ``decode`` returns a map or raises ``ProtocolError`` (msgpack's
own exceptions never escape); its body never holds ``t``, ``n`` or ``p``
(they are the head's); ``encode`` carries ``n`` and ``p`` only when they are a
``SHORT``-byte id and a port in 1..65535 (anything else would read as absent);
``stamp`` never overwrites a field a message already has; an envelope field of
the wrong type or out of range reads as absent, never as an error, so an odd
caller is still answered; every integer taken from a peer passes ``count``
(0..``MAX_COUNT``, SQLite's signed 64 bits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgpack

from peerd.protocol import versions
from replica.errors import RemoteError

SHORT = 8
# Wire 2: the head codec, page ops grouped by origin. Wire 3 (``versions``): the version statement
# ``V``, pages and pushes that cover purged ops, ops of newer releases stored and relayed.
PROTOCOL_VERSION = versions.NEWEST
NAME_MAX = 64  # longest node name taken from a peer (liveness gossip, never stored)
MAX_COUNT = 2**63 - 1  # seqs and counts a peer may name: SQLite's largest integer

# Request kinds.
SYNC, PULL, PUSH, PEERS = "sync", "pull", "push", "peers"
# Reply kinds (``peers`` answers ``peers``). ``rekey`` answers any request sealed with a key the
# fleet used before a rotation: ``{t: rekey, o: [rekey op, ...]}``, sealed with that old key.
SAME, DIFF, PAGE, OK, ERROR, REKEY = "same", "diff", "page", "ok", "error", "rekey"
# Snapshots (wire 3 on, ``peerd.protocol.snapshot``): ``snap`` asks, ``shot`` answers.
SNAP, SHOT = "snap", "shot"
# The return path (``peerd.protocol.link``): ``link`` opens a relay link, ``back`` asks for a call back.
LINK, BACK = "link", "back"
# Each kind's code in a sealed message's head (1..31).
CODES = {SYNC: 1, PULL: 2, PUSH: 3, PEERS: 4, SAME: 5, DIFF: 6, PAGE: 7, OK: 8, ERROR: 9, REKEY: 10, SNAP: 11, SHOT: 12,
         LINK: 13, BACK: 14}
KIND_OF_CODE = {code: kind for kind, code in CODES.items()}
CODE_BITS, HAS_N, HAS_P, MAP_BIT = 0x1F, 0x20, 0x40, 0x80
HEAD_FIELDS = frozenset({"t", "n", "p"})

Msg = dict[str, Any]


class ProtocolError(RemoteError):
    """A peer sent a message that does not follow the protocol."""


def short(key: bytes) -> bytes:
    return key[:SHORT]


def shorten(v: Mapping[bytes, int]) -> dict[bytes, int]:
    return {short(k): n for k, n in v.items()}


# -- codec ------------------------------------------------------------------------------


def encode_map(msg: Msg) -> bytes:
    """A message as one bare msgpack map (the join wire)."""
    out: bytes = msgpack.packb(msg, use_bin_type=True)
    return out


def decode_map(data: bytes) -> Msg:
    """A bare msgpack map; ProtocolError if ``data`` is not one."""
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise ProtocolError(f"undecodable message ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
    return msg


def encode(msg: Msg) -> bytes:
    """A sealed peer message's plaintext: the head, then the other fields (module docstring).
    ValueError for a kind with no code: a bug of ours, never a peer's doing."""
    kind = msg.get("t")
    code = CODES.get(kind) if isinstance(kind, str) else None
    if code is None:
        raise ValueError(f"no wire code for message kind {msg.get('t')!r}")
    head = bytearray([code])
    n, p = msg.get("n"), msg.get("p")
    if isinstance(n, bytes) and len(n) == SHORT:
        head[0] |= HAS_N
        head += n
    if port_number(p):
        head[0] |= HAS_P
        head += p.to_bytes(2, "big")
    rest = {k: v for k, v in msg.items() if k not in HEAD_FIELDS}
    return bytes(head) + (encode_map(rest) if rest else b"")


def _head(data: bytes) -> tuple[Msg, int]:
    """The head's fields (``t``, and ``n``, ``p`` when flagged) and where the body starts."""
    if not data:
        raise ProtocolError("empty message")
    head = data[0]
    if head & MAP_BIT:
        raise ProtocolError("not a peer message of wire 2 or later (a peer on an older peerd?)")
    kind = KIND_OF_CODE.get(head & CODE_BITS)
    if kind is None:
        raise ProtocolError(f"unknown message kind code {head & CODE_BITS}")
    fields: Msg = {"t": kind}
    end = 1
    if head & HAS_N:
        fields["n"], end = data[end : end + SHORT], end + SHORT
    if head & HAS_P:
        fields["p"], end = int.from_bytes(data[end : end + 2], "big"), end + 2
    if len(data) < end:
        raise ProtocolError("message head is cut short")
    return fields, end


def decode(data: bytes) -> Msg:
    """A sealed peer message from its plaintext; ProtocolError if it is not one of this version."""
    fields, end = _head(data)
    msg: Msg = decode_map(data[end:]) if len(data) > end else {}
    if HEAD_FIELDS & msg.keys():
        raise ProtocolError("message body repeats a head field (t, n or p)")
    msg.update(fields)
    return msg


def need(msg: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    """``msg[key]`` if ``msg`` is a map holding a ``kind`` there (never a bool), else ProtocolError."""
    if not isinstance(msg, dict) or key not in msg or not isinstance(msg[key], kind) or isinstance(msg[key], bool):
        raise ProtocolError(f"message lacks a valid {key!r}")
    return msg[key]


# -- the envelope -----------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    """Who sent a request: fields the caller adds to every request it makes."""

    sender: bytes | None = None  # n: short node id
    port: int | None = None  # p: the port its peer server listens on
    name: str | None = None  # nm: the name it goes by (``peers`` only)
    wire: frozenset[int] = versions.FIRST_RELEASE  # V: the wire versions it speaks


def count(v: object) -> bool:
    """An integer a peer may send as a seq or a count: never a bool, in 0..MAX_COUNT."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def port_number(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535


def envelope(msg: Msg) -> Envelope:
    n, p = msg.get("n"), msg.get("p")
    return Envelope(
        sender=n if isinstance(n, bytes) and len(n) == SHORT else None,
        port=p if port_number(p) else None,
        name=node_name(msg.get("nm")),
        wire=versions.stated(msg),
    )


def node_name(raw: object) -> str | None:
    """A peer's name as gossip may carry it, or None when it is not a usable one."""
    return raw if isinstance(raw, str) and 0 < len(raw) <= NAME_MAX else None


def stamp(msg: Msg, *, me: bytes, port: int) -> Msg:
    """``msg`` with the caller's envelope (kept where the message already has it)."""
    return {**msg, "n": msg.get("n", short(me)), "p": msg.get("p", port),
            versions.KEY: msg.get(versions.KEY, versions.OURS)}


def sign_reply(reply: Msg, *, me: bytes, kind: str, clock_ms: int) -> Msg:
    """The answerer's fields on a 200 reply: its short id, and on ``peers`` its wall clock
    (milliseconds, for clock-skew checks: ``peerd doctor``)."""
    reply["n"] = short(me)
    versions.state(reply)
    if kind == PEERS:
        reply["c"] = clock_ms
    return reply


def error_reply(exc: Exception) -> Msg:
    return versions.state({"t": ERROR, "e": str(exc)})


def refusal(reply: Msg, status: int) -> str | None:
    """Why a reply refuses the request (an ``error`` or a status other than 200), or None."""
    if reply.get("t") == ERROR or status != 200:
        return str(reply.get("e", status))
    return None
