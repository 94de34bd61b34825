"""Snapshots on the wire, sans-io: a member far behind takes what a peer holds up to a fixed point,
page by page, each page signed by that peer's node key.

* ``snap`` ``{v: caller's vector}`` opens a snapshot; the answer (``shot``) is the **opening**
  ``{s: id, x: [[origin key, start, top], ...], f: [membership op, ...], k?: cursor, ka, sg}``: the
  point (``replica.snapshot.Point``: per origin, by full key, the seqs from the caller's seq + 1 to
  the answerer's), the membership ops the caller checks the signer against, the first cursor.
* ``snap`` ``{s: id, k: [i, seq]}`` asks for the page at a cursor; the answer is a **page**
  ``{s, g: groups of ops, r: [[i, lo, hi], ...], k?: next cursor, ka, sg}``; no ``k``: the last page.
  A snapshot this node does not hold (expired, or the node restarted) is ``{s, gone: true}``.

``ka`` is the answerer's node key and ``sg`` its Ed25519 signature over ``digest``: the page's
fields (for a page, the cursor it was asked for) and every op, length-prefixed.

Invariants:
* Sent only to a peer of wire 3 or later (``versions.takes_every_op``); answered only for one.
* The taker believes nothing it has not checked (``check_opening``, ``check_page``): the signature,
  a signer that is the node that answered (and the same for every page), a point that starts where
  the taker stood, ranges that follow the point's order from the cursor asked for without a gap,
  and a next cursor that follows the last range; that the ops lie, in order, inside the ranges is
  checked as they are decoded (``replica.snapshot.take_page``).
* The answerer keeps at most ``MAX_OFFERS`` snapshots, each forgotten ``OFFER_IDLE`` seconds after
  its last page; a cursor outside its snapshot, an unknown id or a malformed request is an error.
* Randomness and time come from the caller (``token``, ``now``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from peerd.protocol import versions
from peerd.protocol.grouping import group, ungroup
from peerd.protocol.rounds import VECTOR_MAX, _short_vector, expand
from peerd.protocol.wire import SHOT, SNAP, Msg, ProtocolError, count, need, short, shorten
from replica import identity
from replica.codec import pack
from replica.errors import RemoteError
from replica.ops import ORIGIN_BYTES
from replica.snapshot import Cursor, Point, SnapPage

ID_BYTES = 16
MAX_OFFERS = 8
OFFER_IDLE = 300.0  # seconds a snapshot is kept after its last page
_PERSON = b"peerd-snapshot"


class Unavailable(RemoteError):
    """The answerer does not offer a snapshot now (it is taking one itself; its opening would not fit
    a page). Not the caller's fault: it syncs by rounds instead."""


class SnapshotSource(Protocol):
    def vector(self) -> dict[bytes, int]: ...
    def snapshot_point(self, base: Mapping[bytes, int]) -> tuple[Point, list[bytes]]: ...
    def snapshot_page(self, point: Point, cursor: Cursor, budget: int) -> SnapPage: ...


def digest(head: Sequence[Any], ops: Sequence[bytes]) -> bytes:
    """What ``sg`` signs: the page's fields, then each op with its length."""
    h = hashlib.blake2b(digest_size=32, person=_PERSON)
    h.update(pack(list(head)))
    for op in ops:
        h.update(len(op).to_bytes(4, "big"))
        h.update(op)
    return h.digest()


def _cursor(raw: Any) -> Cursor | None:
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and all(map(count, raw))):
        raise ProtocolError("a snapshot cursor must be [origin index, seq]")
    return int(raw[0]), int(raw[1])


def _wire(cursor: Cursor | None) -> list[int] | None:
    return None if cursor is None else list(cursor)


# -- the answerer -------------------------------------------------------------------------


@dataclass
class Offer:
    id: bytes
    point: Point
    used: float


@dataclass
class Shelf:
    """The snapshots this node has open for takers, in memory (a restart forgets them: a taker then
    opens a new one). Thread-safe: pages are built on worker threads."""

    limit: int = MAX_OFFERS
    idle: float = OFFER_IDLE
    offers: dict[bytes, Offer] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, point: Point, token: bytes, now: float) -> Offer:
        with self.lock:
            self._expire(now)
            while len(self.offers) >= self.limit:
                self.offers.pop(min(self.offers.values(), key=lambda o: o.used).id)
            offer = self.offers[token] = Offer(token, point, now)
            return offer

    def get(self, sid: bytes, now: float) -> Offer | None:
        with self.lock:
            self._expire(now)
            offer = self.offers.get(sid)
            if offer is not None:
                offer.used = now
            return offer

    def _expire(self, now: float) -> None:
        for sid in [o.id for o in self.offers.values() if now - o.used > self.idle]:
            del self.offers[sid]


def in_point(point: Point, cursor: Cursor) -> bool:
    """Whether a cursor names a place in the snapshot (at most one past an origin's top)."""
    i, seq = cursor
    return 0 <= i < len(point.origins) and point.starts[i] <= seq <= point.tops[i] + 1


def serve(rep: SnapshotSource, msg: Msg, shelf: Shelf, *, budget: int, sign: Callable[[bytes], bytes],
          signer: bytes, now: float, token: bytes) -> Msg:
    """Answer one ``snap`` request (the opening, or a page); ProtocolError when it is malformed,
    names a cursor outside its snapshot, or comes from a peer of wire 2."""
    if not versions.takes_every_op(versions.stated(msg)):
        raise ProtocolError("snapshots are for peers of wire 3 or later")
    if "s" not in msg:
        return _opening(rep, msg, shelf, budget=budget, sign=sign, signer=signer, now=now, token=token)
    sid = need(msg, "s", bytes)
    cursor = _cursor(need(msg, "k", list))
    offer = shelf.get(sid, now)
    if offer is None:
        return {"t": SHOT, "s": sid, "gone": True}
    assert cursor is not None
    if not in_point(offer.point, cursor):
        raise ProtocolError(f"cursor {list(cursor)} is beyond the snapshot")
    page = rep.snapshot_page(offer.point, cursor, budget)
    index = {k: i for i, k in enumerate(offer.point.origins)}
    ranges = [[index[o], lo, hi] for o, (lo, hi) in page.ranges.items()]
    head = ["page", sid, list(cursor), ranges, _wire(page.next)]
    reply: Msg = {"t": SHOT, "s": sid, "g": group(page.ops), "r": ranges, "ka": signer,
                  "sg": sign(digest(head, page.ops))}
    if page.next is not None:
        reply["k"] = list(page.next)
    return reply


def _opening(rep: SnapshotSource, msg: Msg, shelf: Shelf, *, budget: int, sign: Callable[[bytes], bytes],
             signer: bytes, now: float, token: bytes) -> Msg:
    base = expand(_short_vector(need(msg, "v", dict), "vector"), rep.vector(), default_ours=False)
    point, fleet = rep.snapshot_point(base)
    x = [[k, s, t] for k, s, t in zip(point.origins, point.starts, point.tops, strict=True)]
    if len(x) * (ORIGIN_BYTES + 20) + sum(map(len, fleet)) > budget:
        raise Unavailable("this member's snapshot opening would not fit a page; sync by rounds")
    offer = shelf.put(point, token, now)
    first = point.first()
    reply: Msg = {"t": SHOT, "s": offer.id, "x": x, "f": fleet, "ka": signer,
                  "sg": sign(digest(["open", offer.id, x, _wire(first)], fleet))}
    if first is not None:
        reply["k"] = list(first)
    return reply


# -- the taker ----------------------------------------------------------------------------


def open_request(ours: Mapping[bytes, int]) -> Msg:
    return versions.state({"t": SNAP, "v": shorten(ours)})


def page_request(sid: bytes, cursor: Cursor) -> Msg:
    return versions.state({"t": SNAP, "s": sid, "k": list(cursor)})


@dataclass(frozen=True)
class Opening:
    """A snapshot as its opening says, checked."""

    id: bytes
    signer: bytes
    point: Point
    fleet_ops: list[bytes]
    cursor: Cursor | None


@dataclass(frozen=True)
class Checked:
    """A page, checked: its ops, the ranges it covers (full keys) and the next cursor."""

    ops: list[bytes]
    covered: dict[bytes, tuple[int, int]]
    next: Cursor | None


def gone(reply: Msg) -> bool:
    """Whether the answerer no longer holds the snapshot asked for (open a new one)."""
    return reply.get("t") == SHOT and reply.get("gone") is True


def _signed(reply: Msg, answerer: bytes | None, head: Sequence[Any], ops: Sequence[bytes]) -> bytes:
    """The signer's key, once its signature over ``head`` and ``ops`` verifies."""
    if need(reply, "t", str) != SHOT:
        raise ProtocolError(f"answered a snapshot request with {reply.get('t')!r}")
    signer, sig = need(reply, "ka", bytes), need(reply, "sg", bytes)
    if len(signer) != ORIGIN_BYTES or len(sig) != identity.SIG_BYTES:
        raise ProtocolError("a snapshot's signer key or signature is malformed")
    if answerer is None or short(signer) != answerer:
        raise ProtocolError("the snapshot is signed by another node than the one that answered")
    if not identity.verify(signer, digest(head, ops), sig):
        raise ProtocolError("the snapshot's signature does not verify")
    return bytes(signer)


def _point(raw: Any, base: Mapping[bytes, int]) -> Point:
    if not isinstance(raw, list) or len(raw) > VECTOR_MAX:
        raise ProtocolError("a snapshot's point is not a list")
    keys: list[bytes] = []
    starts: list[int] = []
    tops: list[int] = []
    for entry in raw:
        ok = isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], bytes) \
            and len(entry[0]) == ORIGIN_BYTES and count(entry[1]) and count(entry[2])
        if not ok or (keys and entry[0] <= keys[-1]):
            raise ProtocolError("a snapshot's point must be [origin key, start, top] by increasing key")
        if entry[1] != base.get(entry[0], 0) + 1:
            raise ProtocolError("the snapshot does not start where this node stands")
        keys.append(entry[0])
        starts.append(int(entry[1]))
        tops.append(int(entry[2]))
    return Point(tuple(keys), tuple(starts), tuple(tops))


def check_opening(reply: Msg, base: Mapping[bytes, int], answerer: bytes | None) -> Opening:
    """The opening of a snapshot asked for from ``base`` (our vector as sent, full keys), answered by
    the node whose short id is ``answerer``; ProtocolError if anything in it does not hold."""
    sid = need(reply, "s", bytes)
    if len(sid) != ID_BYTES:
        raise ProtocolError("a snapshot id must be 16 bytes")
    fleet = need(reply, "f", list)
    if not all(isinstance(op, bytes) for op in fleet):
        raise ProtocolError("a snapshot's membership ops must be byte strings")
    x = need(reply, "x", list)
    cursor = _cursor(reply.get("k"))
    signer = _signed(reply, answerer, ["open", sid, x, _wire(cursor)], fleet)
    point = _point(x, base)
    if cursor != point.first():
        raise ProtocolError("a snapshot's first cursor is not where its point starts")
    return Opening(sid, signer, point, fleet, cursor)


def check_page(reply: Msg, opening: Opening, asked: Cursor, answerer: bytes | None) -> Checked:
    """A page of ``opening`` asked for at ``asked``; ProtocolError if it is not what it claims."""
    if need(reply, "s", bytes) != opening.id:
        raise ProtocolError("a page of another snapshot than the one asked for")
    ops = ungroup(reply.get("g"))
    raw_ranges = need(reply, "r", list)
    cursor = _cursor(reply.get("k"))
    signer = _signed(reply, answerer, ["page", opening.id, list(asked), raw_ranges, _wire(cursor)], ops)
    if signer != opening.signer:
        raise ProtocolError("a page signed by another node than the snapshot's opening")
    ranges, end = _walk(opening.point, asked, raw_ranges)
    if cursor != end:
        raise ProtocolError("a page's next cursor does not follow its ranges")
    if cursor is not None and cursor == opening.point.norm(asked):
        raise ProtocolError("a page that covers nothing but claims more")
    return Checked(ops, {opening.point.origins[i]: (lo, hi) for i, lo, hi in ranges}, cursor)


def _walk(point: Point, asked: Cursor, raw: list[Any]) -> tuple[list[tuple[int, int, int]], Cursor | None]:
    """The ranges of a page, each starting where the one before left off (from ``asked``); and the
    cursor after the last. Only the last may end before its origin's top (the budget cut it)."""
    if not in_point(point, asked):
        raise ProtocolError("asked for a cursor outside the snapshot")
    at = point.norm(asked)
    out: list[tuple[int, int, int]] = []
    for n, r in enumerate(raw):
        if not (isinstance(r, list) and len(r) == 3 and all(map(count, r))):
            raise ProtocolError("a page range must be [origin index, lo, hi]")
        i, lo, hi = int(r[0]), int(r[1]), int(r[2])
        if at is None or (i, lo) != at or hi < lo or hi > point.tops[i]:
            raise ProtocolError("a page's ranges do not follow the snapshot from the cursor asked for")
        if hi < point.tops[i] and n != len(raw) - 1:
            raise ProtocolError("a page range ends before its origin's top but is not the last")
        out.append((i, lo, hi))
        at = point.norm((i, hi + 1))
    return out, at

