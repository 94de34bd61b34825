"""The wire: message kinds, the envelope, and the msgpack codec.

A message is a msgpack map with string keys and a kind ``t``; byte strings are
msgpack ``bin``. Every request carries the caller's envelope (``n`` its short
id, ``p`` its peer port; ``nm`` its name on ``peers``), every 200 reply the
answerer's ``n`` (and ``c``, its clock, on ``peers``).

Invariants: ``decode`` returns a map or raises ``ProtocolError`` (msgpack's
own exceptions never escape); ``stamp`` never overwrites a field a message
already has; an envelope field of the wrong type or out of range (``n`` not
``SHORT`` bytes, ``p`` not a port in 1..65535) reads as absent, never as an
error, so an old or odd caller is still answered; every integer taken from a
peer passes ``count`` (0..``MAX_COUNT``, SQLite's signed 64 bits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from replica.errors import RemoteError

SHORT = 8
PROTOCOL_VERSION = 1
NAME_MAX = 64  # longest node name taken from a peer (liveness gossip, never stored)
MAX_COUNT = 2**63 - 1  # seqs and counts a peer may name: SQLite's largest integer

# Request kinds.
SYNC, PULL, PUSH, PEERS = "sync", "pull", "push", "peers"
# Reply kinds (``peers`` answers ``peers``). ``rekey`` answers any request sealed with a key the
# fleet used before a rotation: ``{t: rekey, o: [rekey op, ...]}``, sealed with that old key.
SAME, DIFF, PAGE, OK, ERROR, REKEY = "same", "diff", "page", "ok", "error", "rekey"

Msg = dict[str, Any]


class ProtocolError(RemoteError):
    """A peer sent a message that does not follow the protocol."""


def short(key: bytes) -> bytes:
    return key[:SHORT]


def shorten(v: Mapping[bytes, int]) -> dict[bytes, int]:
    return {short(k): n for k, n in v.items()}


# -- codec ------------------------------------------------------------------------------


def encode(msg: Msg) -> bytes:
    out: bytes = msgpack.packb(msg, use_bin_type=True)
    return out


def decode(data: bytes) -> Msg:
    """A message from its plaintext; ProtocolError if it is not a msgpack map."""
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises many unrelated types on garbage
        raise ProtocolError(f"undecodable message ({type(exc).__name__})") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
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


def count(v: object) -> bool:
    """An integer a peer may send as a seq or a count: never a bool, in 0..MAX_COUNT."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def port_number(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535


def envelope(msg: Msg) -> Envelope:
    n, p = msg.get("n"), msg.get("p")
    return Envelope(
        sender=n if isinstance(n, bytes) and len(n) == SHORT else None,
        port=p if port_number(p) else None,
        name=node_name(msg.get("nm")),
    )


def node_name(raw: object) -> str | None:
    """A peer's name as gossip may carry it, or None when it is not a usable one."""
    return raw if isinstance(raw, str) and 0 < len(raw) <= NAME_MAX else None


def stamp(msg: Msg, *, me: bytes, port: int) -> Msg:
    """``msg`` with the caller's envelope (kept where the message already has it)."""
    return {**msg, "n": msg.get("n", short(me)), "p": msg.get("p", port)}


def sign_reply(reply: Msg, *, me: bytes, kind: str, clock_ms: int) -> Msg:
    """The answerer's fields on a 200 reply: its short id, and on ``peers`` its wall clock
    (milliseconds, for clock-skew checks: ``peerd doctor``)."""
    reply["n"] = short(me)
    if kind == PEERS:
        reply["c"] = clock_ms
    return reply


def error_reply(exc: Exception) -> Msg:
    return {"t": ERROR, "e": str(exc)}


def refusal(reply: Msg, status: int) -> str | None:
    """Why a reply refuses the request (an ``error`` or a status other than 200), or None."""
    if reply.get("t") == ERROR or status != 200:
        return str(reply.get("e", status))
    return None
