"""Sync rounds, sans-io: what a round asks, and how a replica answers (plain dicts in and out).

* ``sync``  A->B  ``{v: A vector}`` when A knows at most ``FULL_VECTOR_MAX`` origins, else
  ``{d: digest(A vector)}``; reply ``{t: same}`` when the vectors (or digests) match, else
  ``{t: diff, v: B vector, pg?: page}`` (a page of what A lacks when A sent its vector).
* ``pull``  A->B  ``{w: {origin: A seq}}`` for the origins A lacks -> ``{t: page, g, r, m}``
* ``push``  A->B  ``{o: [op, ...], r?: 1, c?: ranges}`` -> ``{t: ok, new: count}`` (``r``: sent by
  a round, not a fresh write, so the receiver does not forward it; ``c``: the seq ranges per origin
  the push covers, from wire 3 on, so that purged ops are known to be gone)

A page (``pg`` of a ``diff``, or a ``page``) carries its ops in ``g``, grouped by origin so
that each origin's key is said once (``peerd.protocol.grouping``); a push carries whole ops.

Vectors and page ranges name origins by an 8-byte prefix of their key (ops
themselves carry the full key), so an in-sync round costs a few dozen bytes.

What the other side takes depends on the wire versions it states
(``peerd.protocol.versions``): a peer of wire 3 or later takes every op and
moves its vector over the ranges a page or push covers (purged ops are gone);
a peer of wire 2 only (the first release) refuses a batch holding one op it
does not know and reads no ranges, so it is served runs of ops it takes
(``V1_RUN``) and pushed the rest past the gaps (``V1_ALL``), with ``pushed``
marks (per origin: its seq when pushed, and the seq pushed through) so that a
round does not offer the same ops again while its vector stays behind a gap it
can never fill; a mark holds while the peer's seq has not gone back below it.
Invariants: a page holds every op of each origin in its stated range that the
sender still holds; a receiver's vector moves forward with every page it applies, so a round ends
(a removed origin is wanted only up to its cutoff, so ops the receiver refuses
never keep a round going);
``client_round`` never trusts a reply it has not checked. The envelope
(``n``, ``p``) is not added here: ``wire.stamp`` adds it to every request.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peerd.protocol import versions
from peerd.protocol.grouping import group, ungroup
from peerd.protocol.wire import (
    DIFF,
    OK,
    PAGE,
    PULL,
    PUSH,
    SAME,
    SHORT,
    SYNC,
    Msg,
    ProtocolError,
    count,
    need,
    short,
    shorten,
)
from replica import vector as vec
from replica.errors import InvalidOp
from replica.membership import KINDS, cap_vector
from replica.models import ApplyResult, Page
from replica.ops import peek, read_stored
from replica.sync import ALL, V1_ALL, V1_RUN

FULL_VECTOR_MAX = 16  # send the whole vector up front when it has at most this many origins


class SyncReplica(Protocol):
    @property
    def node_key(self) -> bytes: ...
    def vector(self) -> dict[bytes, int]: ...
    def removed(self) -> dict[bytes, int]: ...
    def barring(self) -> tuple[dict[bytes, int], frozenset[bytes] | None]: ...
    def fleet_digest(self) -> bytes: ...
    def membership_ops(self) -> list[bytes]: ...
    def ops_missing(self, theirs: Mapping[bytes, int], byte_budget: int, mode: str = ALL) -> Page: ...
    def apply(self, raws: Sequence[bytes], covered: Mapping[bytes, tuple[int, int]] | None = None) -> ApplyResult: ...


Pushed = dict[bytes, tuple[int, int]]  # short origin -> (their seq then, pushed through): module docstring


def serving_mode(msg: Msg) -> str:
    """What to serve the sender of ``msg``: every op, or runs a first-release peer takes."""
    return ALL if versions.takes_every_op(versions.stated(msg)) else V1_RUN


def expand(theirs_short: Mapping[bytes, int], ours: Mapping[bytes, int], default_ours: bool) -> dict[bytes, int]:
    """Their vector over our origin keys; origins they don't name count as 0, or as
    ours when ``default_ours`` (they only named what they want)."""
    return {k: theirs_short.get(short(k), n if default_ours else 0) for k, n in ours.items()}


# -- checking what a peer sent ----------------------------------------------------------

VECTOR_MAX = 100_000  # origins a peer's vector may name


def _short_vector(raw: Any, what: str) -> dict[bytes, int]:
    """A vector by short ids: every key SHORT bytes, every seq in 0..MAX_COUNT."""
    if not isinstance(raw, dict) or len(raw) > VECTOR_MAX:
        raise ProtocolError(f"{what} is not a vector")
    for k, n in raw.items():
        if not (isinstance(k, bytes) and len(k) == SHORT and count(n)):
            raise ProtocolError(f"{what} has a malformed entry (keys of {SHORT} bytes, seqs in 0..2^63-1)")
    return raw


def _ops(raw: Any) -> list[bytes]:
    if not isinstance(raw, list) or not all(isinstance(o, bytes) for o in raw):
        raise ProtocolError("ops must be a list of byte strings")
    return raw


def _ranges(raw: Any) -> dict[bytes, tuple[int, int]]:
    if not isinstance(raw, dict):
        raise ProtocolError("page ranges are not a map")
    if len(raw) > VECTOR_MAX:
        raise ProtocolError("page ranges name too many origins")
    out: dict[bytes, tuple[int, int]] = {}
    for k, r in raw.items():
        ok = isinstance(k, bytes) and len(k) == SHORT and isinstance(r, list) and len(r) == 2 and all(map(count, r))
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
        return {"g": group(page.ops), "m": False}
    return {"g": group(page.ops), "r": {short(k): list(r) for k, r in page.ranges.items()}, "m": page.more}


def handle_sync(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    return _with_fleet(rep, msg, _sync_reply(rep, msg, budget))


def _sync_reply(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    ours = rep.vector()
    mine = shorten(ours)
    if "v" in msg:  # small vectors come whole, with no digest
        theirs_short = _short_vector(msg["v"], "vector")
        if theirs_short == mine:
            return {"t": SAME}
        reply: Msg = {"t": DIFF, "v": mine}
        page = rep.ops_missing(expand(theirs_short, ours, default_ours=False), budget, serving_mode(msg))
        if page.ops:
            reply["pg"] = encode_page(page, implicit_when_complete=True)
        return reply
    if need(msg, "d", bytes) == vec.digest(ours):
        return {"t": SAME}
    return {"t": DIFF, "v": mine}


def _with_fleet(rep: SyncReplica, msg: Msg, reply: Msg) -> Msg:
    """A sync that states its membership digest (``fd``, from this release on) is answered with
    ours, and with every membership op we hold (``fo``) when the two differ: membership is decided
    on the whole set, which vectors cannot carry (a removed node's rekey lies past its cutoff)."""
    if "fd" not in msg:
        return reply
    theirs = need(msg, "fd", bytes)
    reply["fd"] = rep.fleet_digest()
    if theirs != reply["fd"]:
        reply["fo"] = rep.membership_ops()
    return reply


def handle_pull(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    want = _short_vector(need(msg, "w", dict), "want")
    page = rep.ops_missing(expand(want, rep.vector(), default_ours=True), budget, serving_mode(msg))
    return {"t": PAGE, **encode_page(page)}


def handle_push(rep: SyncReplica, msg: Msg) -> tuple[Msg, ApplyResult]:
    ops = _ops(need(msg, "o", list))
    covered = _ranges(msg["c"]) if "c" in msg else {}
    result = rep.apply(ops, _full_keys(covered, rep, ops) or None)
    return {"t": OK, "new": result.new}, result


def is_membership_op(raw: bytes) -> bool:
    """Whether ``raw`` is an op of a membership kind (read, not verified: ``apply`` verifies)."""
    try:
        return read_stored(raw).kind in KINDS
    except InvalidOp:  # anything that does not even read is no membership op
        return False


def first_release_takes(raws: Sequence[bytes]) -> list[bytes]:
    """The ops of ``raws`` that a peer of the first release takes (held ops, verified on arrival)."""
    return [raw for raw in raws if read_stored(raw).v1]


def _full_keys(short_ranges: Mapping[bytes, tuple[int, int]], rep: SyncReplica,
               ops: Sequence[bytes]) -> dict[bytes, tuple[int, int]]:
    """Ranges by full origin key: the origins of ``ops`` and those we hold name them; a range of an
    origin we know nothing of is left out (it is covered again by a later page)."""
    if not short_ranges:
        return {}
    keys = {short(k): k for k in rep.vector()}
    for raw in ops:
        ident = peek(raw)
        if ident is not None:
            keys[short(ident[0])] = ident[0]
    return {keys[s]: r for s, r in short_ranges.items() if s in keys}


# -- client side ---------------------------------------------------------------------

@dataclass
class RoundResult:
    wire: frozenset[int] = versions.FIRST_RELEASE  # the versions the answerer stated
    same: bool = False
    pulled: int = 0
    pushed: int = 0
    requests: int = 1
    their_vector: dict[bytes, int] | None = None
    ours: dict[bytes, int] | None = None  # our vector (short ids) as the round ended


def sync_request(ours: Mapping[bytes, int], fleet_digest: bytes | None = None) -> Msg:
    msg: Msg = versions.state({"t": SYNC})
    if fleet_digest is not None:
        msg["fd"] = fleet_digest
    if len(ours) <= FULL_VECTOR_MAX:
        msg["v"] = shorten(ours)
    else:
        msg["d"] = vec.digest(ours)
    return msg


def _apply_page(rep: SyncReplica, raw: Any, implicit: Mapping[bytes, tuple[int, int]] | None) -> tuple[int, bool]:
    """Apply a page; ``implicit`` is None when the answerer reads no ranges (the first release), else
    the ranges a complete sync page without ``r`` covers."""
    if not isinstance(raw, dict):
        raise ProtocolError("page is not a map")
    ops = ungroup(raw.get("g"))
    ranges = _ranges(raw.get("r", {}))
    more = raw.get("m")
    if not isinstance(more, bool):
        raise ProtocolError("page lacks 'm'")
    covered = {} if implicit is None else _full_keys(ranges if "r" in raw else implicit, rep, ops)
    if not ops and not covered:
        return 0, more
    return rep.apply(ops, covered or None).new, more


def _wants(ours: Mapping[bytes, int], theirs_short: Mapping[bytes, int]) -> dict[bytes, int]:
    mine = shorten(ours)
    return {s: mine.get(s, 0) for s, n in theirs_short.items() if n > mine.get(s, 0)}


def client_round(rep: SyncReplica, *, budget: int, pushed: Pushed | None = None) -> Generator[Msg, Msg, RoundResult]:
    """One push-pull round as a generator: yields requests, is sent replies. The result
    carries our vector as the round ended, read in the round's last step (off the caller's
    event loop when the caller steps the round on a worker thread). ``pushed``: the marks kept
    for this peer between rounds (used when it speaks only the first release's wire)."""
    res = RoundResult()
    reply = yield sync_request(rep.vector(), rep.fleet_digest())
    res.wire = versions.stated(reply) if isinstance(reply, dict) else versions.FIRST_RELEASE
    every_op = versions.takes_every_op(res.wire)
    fleet_moved = yield from _settle_fleet(rep, reply)
    if need(reply, "t", str) == SAME:
        res.same = not fleet_moved
        res.ours = shorten(rep.vector())
        return res
    theirs_short = wanted(rep, _short_vector(need(reply, "v", dict), "their vector"))
    res.their_vector = dict(theirs_short)
    more = bool(_wants(rep.vector(), theirs_short))
    if "pg" in reply:
        implicit = {s: (seq + 1, theirs_short[s]) for s, seq in _wants(rep.vector(), theirs_short).items()}
        n, more = _apply_page(rep, reply["pg"], implicit if every_op else None)
        res.pulled += n
    while more and (wants := _wants(rep.vector(), theirs_short)):
        reply = yield versions.state({"t": PULL, "w": wants})
        res.requests += 1
        n, more = _apply_page(rep, reply, {} if every_op else None)  # ops may all be held already
        res.pulled += n
        if more and _wants(rep.vector(), theirs_short) == wants:
            raise ProtocolError("peer's page made no progress but claims more")
    if every_op:
        res.pushed, pushes = yield from _push_missing(rep, theirs_short, budget)
    else:
        res.pushed, pushes = yield from _push_v1(rep, theirs_short, budget, {} if pushed is None else pushed)
    res.requests += pushes
    res.ours = shorten(rep.vector())
    return res


def wanted(rep: SyncReplica, theirs_short: Mapping[bytes, int]) -> dict[bytes, int]:
    """A peer's vector as far as we want it: a removed node's ops above its cutoff are never wanted,
    even from a peer that has not heard yet, nor ops of a node nobody let in (its membership ops
    come with the set, ``_settle_fleet``)."""
    removed, let_in = rep.barring()
    out = cap_vector(theirs_short, shorten(removed))
    if let_in is not None:
        mine, counted = shorten(rep.vector()), {short(k) for k in (*let_in, rep.node_key)}
        out = {s: n if s in counted else min(n, mine.get(s, 0)) for s, n in out.items()}
    return out


def _settle_fleet(rep: SyncReplica, reply: Msg) -> Generator[Msg, Msg, bool]:
    """Make our set of membership ops and the peer's one: take what its reply carries (``fo``), and
    push it ours when its digest still differs. True when either side's set changed."""
    if not isinstance(reply, dict) or "fd" not in reply:
        return False  # a peer of an earlier release: it keeps no set
    moved = False
    if "fo" in reply:
        moved = rep.apply(_ops(reply["fo"])).new > 0
    if need(reply, "fd", bytes) != rep.fleet_digest():
        answer = yield versions.state({"t": PUSH, "o": rep.membership_ops(), "r": 1})
        if need(answer, "t", str) != OK:
            raise ProtocolError("push of membership ops was not acknowledged")
        moved = True
    return moved


def _push_missing(
    rep: SyncReplica, theirs_short: Mapping[bytes, int], budget: int
) -> Generator[Msg, Msg, tuple[int, int]]:
    """Push a peer of wire 3 or later every op it lacks, with the ranges each push covers."""
    theirs = expand(theirs_short, rep.vector(), default_ours=False)
    pushed = requests = 0
    while True:
        page = rep.ops_missing(theirs, budget)
        if not page.ops and not page.ranges:
            return pushed, requests
        cover = {short(k): list(r) for k, r in page.ranges.items()}
        # r: part of a round, not to be forwarded
        reply = yield versions.state({"t": PUSH, "o": page.ops, "r": 1, "c": cover})
        requests += 1
        if need(reply, "t", str) != OK:
            raise ProtocolError("push was not acknowledged")
        pushed += len(page.ops)
        for origin, (_lo, hi) in page.ranges.items():
            theirs[origin] = hi
        if not page.more:
            return pushed, requests


def _push_v1(
    rep: SyncReplica, theirs_short: Mapping[bytes, int], budget: int, marks: Pushed
) -> Generator[Msg, Msg, tuple[int, int]]:
    """Push a first-release peer every op it takes that it lacks, past the gaps it cannot fill (ops
    it would refuse, purged ones); ``marks`` remember how far, while its vector stays where it was."""
    theirs = expand(theirs_short, rep.vector(), default_ours=False)
    at = dict(theirs)
    for origin, seq in at.items():
        mark = marks.get(short(origin))
        if mark is not None and mark[0] <= seq:  # what it took it keeps, unless it started afresh
            theirs[origin] = max(seq, mark[1])
    pushed = requests = 0
    while True:
        page = rep.ops_missing(theirs, budget, V1_ALL)
        if page.ops:
            reply = yield versions.state({"t": PUSH, "o": page.ops, "r": 1})
            requests += 1
            if need(reply, "t", str) != OK:
                raise ProtocolError("push was not acknowledged")
            pushed += len(page.ops)
        for origin, (_lo, hi) in page.ranges.items():  # taken (or nothing it takes was there)
            theirs[origin] = hi
            marks[short(origin)] = (at[origin], hi)
        if not page.ops or not page.more:
            return pushed, requests


def step(gen: Generator[Msg, Msg, RoundResult], reply: Msg | None) -> tuple[Msg | None, RoundResult | None]:
    """Advance a round by one reply (None to start it): the next request, or the result."""
    try:
        return (next(gen) if reply is None else gen.send(reply)), None
    except StopIteration as stop:
        return None, stop.value


def drive(gen: Generator[Msg, Msg, RoundResult], server: Callable[[Msg], Msg]) -> RoundResult:
    """Run a client round against an in-memory ``server(msg) -> reply`` (tests, simulation)."""
    try:
        req = next(gen)
        while True:
            req = gen.send(server(req))
    except StopIteration as stop:
        result: RoundResult = stop.value
        return result


def kind_of(msg: Msg) -> str:
    kind: str = need(msg, "t", str)
    return kind


def serve(rep: SyncReplica, msg: Msg, budget: int) -> Msg:
    """Answer one round request (sync, pull or push) from ``rep``; the reply states our versions."""
    kind = kind_of(msg)
    if kind == SYNC:
        return versions.state(handle_sync(rep, msg, budget))
    if kind == PULL:
        return versions.state(handle_pull(rep, msg, budget))
    if kind == PUSH:
        return versions.state(handle_push(rep, msg)[0])
    raise ProtocolError(f"unknown message kind {kind!r}")
