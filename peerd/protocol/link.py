"""The return path's wire: a long-lived link a member nobody can call keeps open to a reachable one.

A member behind NAT opens a WebSocket (``GET LINK_PATH``) on a reachable member's sealed peer
port and holds it. Every frame is binary; its first byte says what it is::

    HELLO  0x00  sealed body              the linking member's first frame: a stamped ``link``
                                          message (its ``n``, ``p`` and ``V``), sealed with the fleet key
    WELCOME 0x01 sealed body              the relay took the link (a sealed ``ok``)
    CALL   0x02  id (4 bytes)  sealed body  a request the relay makes of the linked member: exactly
                                          the body it would ``POST /v1`` to a reachable peer
    ANSWER 0x03  id  status (2 bytes)  body  the linked member's answer to the call with that id

A relay that will not hold the link closes it with one of ``CLOSE_CODES``, its reason in words
(a WebSocket close code of the 4000 range): ``FULL`` (the relay's cap on links, per source
address or in total, is reached: try another member), ``NOT_MEMBER`` (the hello did not open
with the fleet key, or is no ``link`` message), ``REPLACED`` (the same member linked again).
Keepalives are WebSocket pings (the transport's), never frames of ours.

The ``back`` request (``POST /v1``, sealed like any other) asks the answerer to call the
caller's advertised address (the address it came from, at the port of its envelope) once and
say whether that worked: ``{t: ok, b: true|false}``. An older member answers it with an error,
which means "do not know".

Invariants: ``parse_frame`` returns a frame or raises ``ProtocolError``, never a library
exception; ids are 32-bit and chosen by the relay; every literal of the return path's wire is
here.
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.protocol.wire import BACK, LINK, OK, Envelope, Msg, ProtocolError, decode, envelope

LINK_PATH = "/v1/link"

HELLO, WELCOME, CALL, ANSWER = 0, 1, 2, 3
ID_BYTES = 4
MAX_ID = 2**32 - 1

FULL, NOT_MEMBER, REPLACED = 4429, 4403, 4409
CLOSE_CODES = {FULL: "relay full", NOT_MEMBER: "not a member of this fleet", REPLACED: "linked again"}


@dataclass(frozen=True)
class Hello:
    sealed: bytes


@dataclass(frozen=True)
class Welcome:
    sealed: bytes


@dataclass(frozen=True)
class Call:
    rid: int
    sealed: bytes


@dataclass(frozen=True)
class Reply:
    rid: int
    status: int
    body: bytes


Frame = Hello | Welcome | Call | Reply


def hello(sealed: bytes) -> bytes:
    return bytes([HELLO]) + sealed


def welcome(sealed: bytes) -> bytes:
    return bytes([WELCOME]) + sealed


def call(rid: int, sealed: bytes) -> bytes:
    return bytes([CALL]) + rid.to_bytes(ID_BYTES, "big") + sealed


def answer(rid: int, status: int, body: bytes) -> bytes:
    return bytes([ANSWER]) + rid.to_bytes(ID_BYTES, "big") + status.to_bytes(2, "big") + body


def parse_frame(data: bytes) -> Frame:
    """One frame of a link; ProtocolError when it is none of ours."""
    if not data:
        raise ProtocolError("empty link frame")
    kind, rest = data[0], data[1:]
    if kind == HELLO:
        return Hello(rest)
    if kind == WELCOME:
        return Welcome(rest)
    if len(rest) < ID_BYTES:
        raise ProtocolError("link frame cut short")
    rid = int.from_bytes(rest[:ID_BYTES], "big")
    if kind == CALL:
        return Call(rid, rest[ID_BYTES:])
    if kind == ANSWER and len(rest) >= ID_BYTES + 2:
        return Reply(rid, int.from_bytes(rest[ID_BYTES:ID_BYTES + 2], "big"), rest[ID_BYTES + 2:])
    raise ProtocolError(f"unknown link frame {kind}")


def link_message() -> Msg:
    """The body of a hello (stamped with the caller's envelope before it is sealed)."""
    return {"t": LINK}


def read_hello(plain: bytes) -> Envelope:
    """Who links: the envelope of an opened hello; ProtocolError if it is no ``link`` message
    or names no node and port."""
    msg = decode(plain)
    env = envelope(msg)
    if msg.get("t") != LINK or env.sender is None or env.port is None:
        raise ProtocolError("link hello without a node id and port")
    return env


def back_message() -> Msg:
    """Ask the answerer to call us back at our advertised address."""
    return {"t": BACK}


def back_reply(reached: bool) -> Msg:
    return {"t": OK, "b": reached}


def reached(reply: Msg) -> bool | None:
    """What a ``back`` reply says: True (we are reachable), False, None (no answer of that kind)."""
    b = reply.get("b")
    return b if isinstance(b, bool) else None


def close_reason(code: int | None, text: str) -> str:
    """A closed link in words, for the log and the peer table."""
    known = CLOSE_CODES.get(code or 0)
    return f"{known}: {text}" if known and text else known or text or f"closed (code {code})"
