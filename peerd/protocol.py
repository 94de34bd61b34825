"""The peer sync protocol, sans-io: plain dicts in, plain dicts out.

Message kinds (msgpack maps, key ``t``; the transport seals them):

* ``sync``  A->B  ``{n: A short id, p: A peer port, v: A vector}`` when A knows at most
  ``FULL_VECTOR_MAX`` origins, else ``{n, p, d: digest(A vector)}``; reply ``{t: same}`` when
  the vectors (or digests) match, else ``{t: diff, v: B vector, pg?: page}`` (a page of what A
  lacks when A sent its vector).
* ``pull``  A->B  ``{w: {origin: A seq}}`` for the origins A lacks -> ``{t: page, o, r, m}``
* ``push``  A->B  ``{o: [op, ...], r?: 1}`` -> ``{t: ok, new: count}`` (``r``: sent by a round,
  not a fresh write, so the receiver does not forward it)
* ``peers`` A->B  ``{k: [peer, ...]}`` -> ``{t: peers, k: [peer, ...]}``

Vectors and page ranges name origins by an 8-byte prefix of their key (ops
themselves carry the full key), so an in-sync round costs a few dozen bytes.
Invariants: a page holds every op of each origin in its stated range; a
receiver's vector moves forward with every page it applies, so a round ends;
``client_round`` never trusts a reply it has not checked.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from replica import vector as vec
from replica.errors import RemoteError
from replica.models import ApplyResult, Page

SHORT = 8
PROTOCOL_VERSION = 1
FULL_VECTOR_MAX = 16  # send the whole vector up front when it has at most this many origins

Msg = dict[str, Any]


class ProtocolError(RemoteError):
    """A peer sent a message that does not follow the protocol."""


class SyncReplica(Protocol):
    def vector(self) -> dict[bytes, int]: ...
    def ops_missing(self, theirs: Mapping[bytes, int], byte_budget: int) -> Page: ...
    def apply(self, raws: Sequence[bytes]) -> ApplyResult: ...


def short(key: bytes) -> bytes:
    return key[:SHORT]


def shorten(v: Mapping[bytes, int]) -> dict[bytes, int]:
    return {short(k): n for k, n in v.items()}


def expand(theirs_short: Mapping[bytes, int], ours: Mapping[bytes, int], default_ours: bool) -> dict[bytes, int]:
    """Their vector over our origin keys; origins they don't name count as 0, or as
    ours when ``default_ours`` (they only named what they want)."""
    return {k: theirs_short.get(short(k), n if default_ours else 0) for k, n in ours.items()}


# -- checking what a peer sent ----------------------------------------------------------

def _need(msg: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(msg, dict) or key not in msg or not isinstance(msg[key], kind) or isinstance(msg[key], bool):
        raise ProtocolError(f"message lacks a valid {key!r}")
    return msg[key]


def _short_vector(raw: Any, what: str) -> dict[bytes, int]:
    if not isinstance(raw, dict) or len(raw) > 100_000:
        raise ProtocolError(f"{what} is not a vector")
    for k, n in raw.items():
        if not (isinstance(k, bytes) and len(k) == SHORT and isinstance(n, int) and not isinstance(n, bool) and n >= 0):
            raise ProtocolError(f"{what} has a malformed entry")
    return raw


def _ops(raw: Any) -> list[bytes]:
    if not isinstance(raw, list) or not all(isinstance(o, bytes) for o in raw):
        raise ProtocolError("ops must be a list of byte strings")
    return raw


def _ranges(raw: Any) -> dict[bytes, tuple[int, int]]:
    if not isinstance(raw, dict):
        raise ProtocolError("page ranges are not a map")
    out: dict[bytes, tuple[int, int]] = {}
    for k, r in raw.items():
        ok = isinstance(k, bytes) and isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r)
        if not ok or r[0] > r[1]:
            raise ProtocolError("page range is malformed")
        out[k] = (r[0], r[1])
    return out


# -- server side ---------------------------------------------------------------------

def encode_page(page: Page, *, implicit_when_complete: bool = False) -> Msg:
    """A page on the wire. ``r`` states the seq range per origin it covers; a complete page
    answering a sync (``m`` false) may leave it out: it then covers, for every origin, the
    receiver's seq up to the ``v`` sent alongside it."""
    if implicit_when_complete and not page.more:
        return {"o": page.ops, "m": False}
    return {"o": page.ops, "r": {short(k): list(r) for k, r in page.ranges.items()}, "m": page.more}


def handle_sync(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    ours = rep.vector()
    mine = shorten(ours)
    if "v" in msg:  # small vectors come whole, with no digest
        theirs_short = _short_vector(msg["v"], "vector")
        if theirs_short == mine:
            return {"t": "same"}
        reply: Msg = {"t": "diff", "v": mine}
        page = rep.ops_missing(expand(theirs_short, ours, default_ours=False), budget)
        if page.ops:
            reply["pg"] = encode_page(page, implicit_when_complete=True)
        return reply
    if _need(msg, "d", bytes) == vec.digest(ours):
        return {"t": "same"}
    return {"t": "diff", "v": mine}


def handle_pull(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    want = _short_vector(_need(msg, "w", dict), "want")
    page = rep.ops_missing(expand(want, rep.vector(), default_ours=True), budget)
    return {"t": "page", **encode_page(page)}


def handle_push(rep: SyncReplica, msg: Msg) -> tuple[Msg, ApplyResult]:
    result = rep.apply(_ops(_need(msg, "o", list)))
    return {"t": "ok", "new": result.new}, result


# -- client side ---------------------------------------------------------------------

@dataclass
class RoundResult:
    same: bool = False
    pulled: int = 0
    pushed: int = 0
    requests: int = 1
    their_vector: dict[bytes, int] | None = None


def sync_request(ours: Mapping[bytes, int], me: bytes, port: int) -> Msg:
    msg: Msg = {"t": "sync", "n": short(me), "p": port}
    if len(ours) <= FULL_VECTOR_MAX:
        msg["v"] = shorten(ours)
    else:
        msg["d"] = vec.digest(ours)
    return msg


def _apply_page(rep: SyncReplica, raw: Any) -> tuple[int, bool]:
    if not isinstance(raw, dict):
        raise ProtocolError("page is not a map")
    ops = _ops(raw.get("o"))
    _ranges(raw.get("r", {}))
    more = raw.get("m")
    if not isinstance(more, bool):
        raise ProtocolError("page lacks 'm'")
    return (rep.apply(ops).new if ops else 0), more


def _wants(ours: Mapping[bytes, int], theirs_short: Mapping[bytes, int]) -> dict[bytes, int]:
    mine = shorten(ours)
    return {s: mine.get(s, 0) for s, n in theirs_short.items() if n > mine.get(s, 0)}


def client_round(
    rep: SyncReplica, *, me: bytes, port: int, budget: int
) -> Generator[Msg, Msg, RoundResult]:
    """One push-pull round as a generator: yields requests, is sent replies."""
    res = RoundResult()
    reply = yield sync_request(rep.vector(), me, port)
    if _need(reply, "t", str) == "same":
        res.same = True
        return res
    theirs_short = _short_vector(_need(reply, "v", dict), "their vector")
    res.their_vector = dict(theirs_short)
    more = bool(_wants(rep.vector(), theirs_short))
    if "pg" in reply:
        n, more = _apply_page(rep, reply["pg"])
        res.pulled += n
    while more and (wants := _wants(rep.vector(), theirs_short)):
        reply = yield {"t": "pull", "w": wants}
        res.requests += 1
        n, more = _apply_page(rep, reply)  # ops may all be known already (a concurrent round got them)
        res.pulled += n
        if more and _wants(rep.vector(), theirs_short) == wants:
            raise ProtocolError("peer's page made no progress but claims more")
    res.pushed, pushes = yield from _push_missing(rep, theirs_short, budget)
    res.requests += pushes
    return res


def _push_missing(
    rep: SyncReplica, theirs_short: Mapping[bytes, int], budget: int
) -> Generator[Msg, Msg, tuple[int, int]]:
    theirs = expand(theirs_short, rep.vector(), default_ours=False)
    pushed = requests = 0
    while True:
        page = rep.ops_missing(theirs, budget)
        if not page.ops:
            return pushed, requests
        reply = yield {"t": "push", "o": page.ops, "r": 1}  # r: part of a round, not to be forwarded
        requests += 1
        if _need(reply, "t", str) != "ok":
            raise ProtocolError("push was not acknowledged")
        pushed += len(page.ops)
        for origin, (_lo, hi) in page.ranges.items():
            theirs[origin] = hi
        if not page.more:
            return pushed, requests


def drive(gen: Generator[Msg, Msg, RoundResult], server: Any) -> RoundResult:
    """Run a client round against an in-memory ``server(msg) -> reply`` (tests, simulation)."""
    try:
        req = next(gen)
        while True:
            req = gen.send(server(req))
    except StopIteration as stop:
        result: RoundResult = stop.value
        return result


def serve(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    """Dispatch one request to its handler (the transport seals/unseals around this)."""
    kind = _need(msg, "t", str)
    if kind == "sync":
        return handle_sync(rep, msg, budget)
    if kind == "pull":
        return handle_pull(rep, msg, budget)
    if kind == "push":
        return handle_push(rep, msg)[0]
    raise ProtocolError(f"unknown message kind {kind!r}")


def peers_from(raw: Any) -> Iterable[Msg]:
    """Peer records from an exchange message, checked."""
    for p in _need(raw, "k", list)[:1000]:
        if isinstance(p, dict) and isinstance(p.get("a"), str) and isinstance(p.get("p"), int):
            yield p
