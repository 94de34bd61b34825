"""Leases: advisory reservations of paths in a project, as pure rules (``replica.leasestore`` holds
the SQL, ``replica.leasing`` the API).

The ops (one lease or one change per op; every name as written, matched by ``names.name_key``):

* ``lease.take`` ``{p: project, g: path or glob, r: role, i: instance or None, x: exclusive,
  ttl: ms, why: reason}``: a new lease, whose id is ``lease_id(origin, seq)``; it starts at the
  op's HLC and expires at the op's wall time plus ``ttl``.
* ``lease.renew`` ``{l: lease id, r: role, ttl: ms}``: by the holder's role, while the lease is
  live at the renew's time: the expiry becomes at least the renew's wall time plus ``ttl``.
* ``lease.release`` ``{l: lease id, r: role}``: by the holder's role: the lease ends then.
* ``lease.force`` ``{l: lease id, r: role, why: note}``: by any role (a stale holder): the lease
  ends then.

Invariants (every rule is a function of the set of ops held, never of their arrival order, and
holding an op twice changes nothing; ``tests/test_leases.py`` proves it with Hypothesis):

* A lease's span is ``span(take, changes)``: changes are taken in stamp order (hlc, origin, seq),
  a renew or release by another role than the holder's is void, a renew after the lease ended
  or expired is void.
* Two leases clash when they are of different roles in the same project, their patterns overlap
  (``overlaps``: equal, one matches the other as a glob, or one is a folder holding the other)
  and at least one is exclusive.
* Who holds (``decide``): leases are taken in stamp order; a lease is *lost* to the earliest
  lease before it that is not lost itself, clashes with it, and is live at its start (its span
  covers the later one's start). So a take made after its taker saw a live clashing lease never
  wins (the HLC is causal: its stamp is later), and of two takes made apart (a partition) the
  earlier stamp wins on every replica; a lost lease stays lost.
* Bounds: a pattern is relative to the project, normalised (``normal_pattern``: no leading
  ``/``, no ``..``, no ``~``), at most ``MAX_PATTERN_CHARS``; a ttl is 1 s to one year.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replica.errors import InvalidOp

KIND_TAKE = "lease.take"
KIND_RENEW = "lease.renew"
KIND_RELEASE = "lease.release"
KIND_FORCE = "lease.force"
KINDS = frozenset({KIND_TAKE, KIND_RENEW, KIND_RELEASE, KIND_FORCE})
CHANGES = frozenset({KIND_RENEW, KIND_RELEASE, KIND_FORCE})
SECOND_MS = 1000
MIN_TTL_MS = SECOND_MS
MAX_TTL_MS = 365 * 86_400_000
MAX_PATTERN_CHARS = 1024
MAX_REASON_CHARS = 2048
MAX_NAME_CHARS = 256
LEASE_ID_PREFIX = "fr_"
LEASE_ID_CHARS = len(LEASE_ID_PREFIX) + 20

BODY_KEYS: dict[str, frozenset[str]] = {
    KIND_TAKE: frozenset({"p", "g", "r", "i", "x", "ttl", "why"}),
    KIND_RENEW: frozenset({"l", "r", "ttl"}),
    KIND_RELEASE: frozenset({"l", "r"}),
    KIND_FORCE: frozenset({"l", "r", "why"}),
}

Stamp = tuple[int, bytes, int]  # (hlc, origin, seq): the total order of ops


def lease_id(origin: bytes, seq: int) -> str:
    """The id of the lease a take op creates: stable and the same on every replica."""
    return LEASE_ID_PREFIX + hashlib.blake2b(origin + seq.to_bytes(8, "big"), digest_size=10).hexdigest()


# -- patterns ---------------------------------------------------------------------------------------


def normal_pattern(text: str) -> str:
    """``text`` as a project-relative pattern (``./a//b`` is ``a/b``); ValueError saying why it is
    not one (absolute, escaping the project, empty, too long, control characters)."""
    if not isinstance(text, str):
        raise ValueError("a path must be a string")
    raw = text.strip().replace("\\", "/")
    if not raw or len(raw) > MAX_PATTERN_CHARS:
        raise ValueError(f"a path must be 1 to {MAX_PATTERN_CHARS} characters")
    if any(ord(c) < 0x20 for c in raw):
        raise ValueError("a path must not contain control characters")
    if raw.startswith(("/", "~")) or (len(raw) > 1 and raw[1] == ":"):
        raise ValueError(f"{text!r} is not relative to the project: give it from the project's top folder")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{text!r} leaves the project ('..'): give it from the project's top folder")
    if not parts:
        raise ValueError(f"{text!r} names no path inside the project")
    return "/".join(parts) + ("/" if raw.endswith("/") and parts else "")


def _folder(pattern: str) -> str:
    return pattern.rstrip("/")


def overlaps(a: str, b: str) -> bool:
    """Whether two normalised patterns can name a common path: equal, one matches the other as a
    glob (either way round), or one is a folder that holds the other."""
    fa, fb = _folder(a), _folder(b)
    if fa == fb or fnmatch.fnmatchcase(fa, fb) or fnmatch.fnmatchcase(fb, fa):
        return True
    return fb.startswith(fa + "/") or fa.startswith(fb + "/") or \
        fnmatch.fnmatchcase(fb, fa + "/*") or fnmatch.fnmatchcase(fa, fb + "/*")


def literal_prefix(pattern: str) -> str:
    """A pattern's text before its first glob character: ``overlaps(a, b)`` implies that ``b``
    starts with ``literal_prefix(a)`` or ``a`` with ``literal_prefix(b)`` (a filter for the store)."""
    cut = min((i for i in (pattern.find(c) for c in "*?[") if i >= 0), default=len(pattern))
    return _folder(pattern[:cut]) if cut == len(pattern) else pattern[:cut]


def prefixes(text: str) -> list[str]:
    """Every prefix of ``text``, the empty one included: the ``literal_prefix`` values of the
    patterns that may overlap ``text`` or cover it as a path."""
    return [text[:i] for i in range(len(text) + 1)]


def covers(pattern: str, path: str) -> bool:
    """Whether a lease's pattern covers the file ``path`` (both relative to the project)."""
    p = _folder(pattern)
    return path == p or path.startswith(p + "/") or fnmatch.fnmatchcase(path, p) or \
        fnmatch.fnmatchcase(path, p + "/*")


# -- the ops' bodies ------------------------------------------------------------------------------


def _name(v: object, what: str, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if not isinstance(v, str) or not v or len(v) > MAX_NAME_CHARS:
        raise InvalidOp(f"{what} must be a non-empty string of at most {MAX_NAME_CHARS} chars")


def _ttl(v: object) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not MIN_TTL_MS <= v <= MAX_TTL_MS:
        raise InvalidOp(f"a lease's ttl must be an integer of ms from {MIN_TTL_MS} to {MAX_TTL_MS}")


def _reason(v: object) -> None:
    if not isinstance(v, str) or len(v) > MAX_REASON_CHARS:
        raise InvalidOp(f"a lease's reason must be a string of at most {MAX_REASON_CHARS} chars")


def _lease_ref(v: object) -> None:
    if not (isinstance(v, str) and len(v) == LEASE_ID_CHARS and v.startswith(LEASE_ID_PREFIX)):
        raise InvalidOp("a lease id must be fr_ and 20 hex digits")


def _check_keys(kind: str, body: Mapping[str, Any]) -> None:
    if set(body) != BODY_KEYS[kind]:
        raise InvalidOp(f"{kind} body must have exactly the keys {', '.join(sorted(BODY_KEYS[kind]))}")


def check_take(body: Mapping[str, Any]) -> None:
    _check_keys(KIND_TAKE, body)
    _name(body["p"], "project")
    _name(body["r"], "role")
    _name(body["i"], "instance", optional=True)
    try:
        if normal_pattern(body["g"]) != body["g"]:
            raise InvalidOp("a lease's path must be written normalised")
    except ValueError as exc:
        raise InvalidOp(str(exc)) from None
    if not isinstance(body["x"], bool):
        raise InvalidOp("exclusive must be a boolean")
    _ttl(body["ttl"])
    _reason(body["why"])


def check_renew(body: Mapping[str, Any]) -> None:
    _check_keys(KIND_RENEW, body)
    _lease_ref(body["l"])
    _name(body["r"], "role")
    _ttl(body["ttl"])


def check_release(body: Mapping[str, Any]) -> None:
    _check_keys(KIND_RELEASE, body)
    _lease_ref(body["l"])
    _name(body["r"], "role")


def check_force(body: Mapping[str, Any]) -> None:
    _check_keys(KIND_FORCE, body)
    _lease_ref(body["l"])
    _name(body["r"], "role")
    _reason(body["why"])


CHECKS = {KIND_TAKE: check_take, KIND_RENEW: check_renew, KIND_RELEASE: check_release, KIND_FORCE: check_force}


# -- spans and holders ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Take:
    """A lease as its take op made it (names as keys)."""

    id: str
    project: str
    pattern: str
    role: str
    exclusive: bool
    stamp: Stamp
    ttl_ms: int


@dataclass(frozen=True)
class Change:
    """A renew, release or force op on a lease."""

    lease: str
    kind: str
    role: str
    stamp: Stamp
    ttl_ms: int = 0


@dataclass(frozen=True)
class Span:
    """When a lease is live: from ``start`` (wall ms) to ``end`` (wall ms, exclusive)."""

    take: Take
    start: int
    end: int
    ended: Change | None  # the release or force that ended it early, if any

    @property
    def expires(self) -> int:
        return self.end


def wall(stamp: Stamp) -> int:
    return stamp[0] >> 16


def span(take: Take, changes: Iterable[Change]) -> Span:
    """The lease's live span given every change held for it (module docstring)."""
    start = wall(take.stamp)
    end = start + take.ttl_ms
    for c in sorted(changes, key=lambda c: c.stamp):
        at = wall(c.stamp)
        if c.stamp <= take.stamp or at >= end:
            continue  # before the lease (impossible for an honest writer) or after it ended
        if c.kind == KIND_FORCE:
            return Span(take, start, max(start, at), c)
        if c.role != take.role:
            continue
        if c.kind == KIND_RELEASE:
            return Span(take, start, max(start, at), c)
        end = max(end, at + c.ttl_ms)
    return Span(take, start, end, None)


def clash(a: Take, b: Take) -> bool:
    """Whether two leases cannot both hold (module docstring)."""
    return a.project == b.project and a.role != b.role and (a.exclusive or b.exclusive) and \
        overlaps(a.pattern, b.pattern)


def decide(spans: Sequence[Span], settled: Mapping[str, str | None] | None = None) -> dict[str, str | None]:
    """For each lease, the id of the lease it is lost to, or None when it holds (module docstring).
    ``settled`` gives leases whose outcome is already known (earlier than every one to decide)."""
    fixed = settled or {}
    out: dict[str, str | None] = {}
    winners: list[Span] = []
    for s in sorted(spans, key=lambda s: s.take.stamp):
        lid = s.take.id
        if lid in fixed:
            out[lid] = fixed[lid]
        else:
            out[lid] = next((w.take.id for w in winners
                             if w.start <= s.start < w.end and clash(w.take, s.take)), None)
        if out[lid] is None:
            winners.append(s)
    return out


def live(s: Span, now_ms: int) -> bool:
    return s.start <= now_ms < s.end or (s.ended is None and s.start > now_ms)  # a clock ahead: live early
