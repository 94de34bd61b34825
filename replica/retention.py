"""Retention: a fleet-wide horizon past which messages, and the ops that carried them, leave every
replica (pure rules; ``replica.purge`` holds the SQL, ``replica.horizon`` the API).

The op: kind ``ret``, body ``{h: horizon in ms}``, 0 meaning keep everything (the default, with
no op at all). Any member may write one; the one with the highest stamp (hlc, origin) is in force
on every replica (last writer wins, ``in_force``). A removed node's op above its cutoff is refused
like all its ops (``membership.barred``).

Ages are the wall clock now minus the HLC creation time. With a horizon ``h > 0``:

* A message leaves when it is older than ``h`` and read (``is_read``), or older than ``2h`` read
  or not; with it go its receipts, search entry, routes, thread number and retraction rows.
* A ``set`` op whose every write is a receipt, a ``rtr`` op, and a ``ret`` op that is not in
  force leave once older than ``2h``: the messages they name are older still (a receipt or a
  retraction is written by a replica that holds its message, and its clock has seen the
  message's), so those are gone by then on every replica, read or not.
* A receipt or retraction that lands after its message was purged here files nothing for long:
  the next pass drops the rows it made (its op leaves at ``2h`` like the others), so what a
  replica holds after a pass does not depend on whether it purged before or after it landed.
* Nothing else ever leaves: ``admit`` and ``rekey`` ops, the ``ret`` op in force, a ``set`` op
  with any write other than a receipt (profiles, agents, threads, members, first-seen times),
  an op of a kind this version does not know.

Read, precisely (a message is read when it is in nobody's unread mail):

* retracted: read (it is in no inbox);
* to one role or a list of roles, with or without a target instance: every entry of the channel
  (a role, or an instance address such as ``sigma-vps``) has at least one receipt, and every
  receipt of that entry has a read time;
* to ``broadcast``: it has at least one receipt, and every receipt has a read time (its audience
  is open-ended: roles that appear later get it too, so the readers it reached decide);
* in a thread: every present participant but the sender has a read receipt (a thread with no
  other participant has nobody to read it: read).

Invariants:

* Every rule is a function of the ops held and the clock, never of arrival order, and applying
  a rule twice removes nothing more (``tests/test_retention_rules.py``).
* Only an op at or below its origin's contiguous mark leaves (``within_mark``): the vector means
  "every seq up to here is held here or was purged", so a hole is never purged.
* ``purgeable_on_arrival`` is the part of the rules that needs nothing but the op and the clock:
  sync may drop such an op instead of storing it, and no replica would keep it anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from replica.errors import InvalidOp

KIND_RET = "ret"
REGISTER = "ret"  # the ``lww`` table the horizon is filed under, with key "" and field "h"
SECOND_MS = 1000
DAY_MS = 86_400_000
MAX_HORIZON_MS = 100 * 365 * DAY_MS  # twice it still fits every clock and counter
UNFORCED_MS = DAY_MS  # a shorter horizon purges a lot: the CLI wants --force below it
MIN_GRANULE_MS = 1000
MAX_GRANULE_MS = 600_000
RECEIPTS = "rcpt"
ALWAYS_KEPT = frozenset({"admit", "rekey"})

_UNITS = {"s": SECOND_MS, "m": 60 * SECOND_MS, "h": 3600 * SECOND_MS, "d": DAY_MS}
_HORIZON = re.compile(r"(\d{1,15})\s*([smhd])")
KEEP_EVERYTHING = ("forever", "never", "none", "off")


# -- the op -----------------------------------------------------------------------------------------


def ret_body(horizon_ms: int) -> dict[str, Any]:
    return {"h": horizon_ms}


def check_ret(body: Mapping[str, Any]) -> None:
    if set(body) != {"h"}:
        raise InvalidOp("ret body must have exactly the key h")
    h = body["h"]
    if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h <= MAX_HORIZON_MS:
        raise InvalidOp(f"retention horizon must be an integer of ms from 0 to {MAX_HORIZON_MS}")


CHECKS = {KIND_RET: check_ret}
BODY_KEYS = {KIND_RET: frozenset({"h"})}


def parse_horizon(text: str) -> int:
    """Milliseconds from ``30d``, ``12h``, ``90m``, ``45s`` (0 from ``forever``); ValueError saying why not."""
    raw = text.strip().lower()
    if raw in KEEP_EVERYTHING:
        return 0
    found = _HORIZON.fullmatch(raw)
    if found is None:
        raise ValueError(f"not a horizon: {text!r} (say 30d, 12h, 90m, 45s, or forever)")
    ms = int(found[1]) * _UNITS[found[2]]
    if not 0 < ms <= MAX_HORIZON_MS:
        raise ValueError(f"a horizon is from 1s to {MAX_HORIZON_MS // DAY_MS}d (or forever), not {text!r}")
    return ms


def format_horizon(ms: int) -> str:
    """``30d``, ``36h``, ``90m``, ``45s`` (the largest unit that divides it), ``forever`` for 0."""
    if ms <= 0:
        return "forever"
    for unit in "dhm":
        if ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms / SECOND_MS:g}s"


def spoken(ms: int) -> str:
    """A horizon for sentences: ``30 days``, ``1 hour``, ``10 seconds``."""
    text = format_horizon(ms)
    number, unit = text[:-1], {"d": "day", "h": "hour", "m": "minute", "s": "second"}[text[-1]]
    return f"{number} {unit}{'' if number == '1' else 's'}"


@dataclass(frozen=True)
class Setting:
    """One ``ret`` op as the rules see it."""

    horizon_ms: int
    hlc: int
    origin: bytes

    @property
    def stamp(self) -> tuple[int, bytes]:
        return (self.hlc, self.origin)


def in_force(settings: Iterable[Setting]) -> Setting | None:
    """The setting with the highest stamp (last writer wins), or None: keep everything."""
    return max(settings, key=lambda s: s.stamp, default=None)


# -- what leaves ------------------------------------------------------------------------------------


def cutoffs(horizon_ms: int, now_ms: int) -> tuple[int, int]:
    """(soft, hard) wall times: read messages created before ``soft`` leave, everything
    purgeable created before ``hard`` leaves."""
    return now_ms - horizon_ms, now_ms - 2 * horizon_ms


def within_mark(seq: int, contig: int) -> bool:
    """Only ops at or below their origin's contiguous mark leave: a hole stays a hole."""
    return 0 < seq <= contig


@dataclass(frozen=True)
class Mail:
    """A message as the read rule sees it: names by their keys (``names.name_key``)."""

    created_ms: int
    channel: str | None  # the channel key: ``tau``, ``tau,phi`` or ``broadcast``; None in a thread
    thread: str | None = None
    sender: str = ""
    target: str | None = None  # the target instance key
    retracted: bool = False


@dataclass(frozen=True)
class Receipt:
    role: str  # role key (an agent id in a thread)
    inst: str  # instance key, "" for none
    read: bool


def _entry_read(entry: str, receipts: Sequence[Receipt]) -> bool:
    """Receipts filed under a channel entry: the role's, or those of the instance it addresses."""
    mine = [r for r in receipts if entry in (r.role, r.inst)]
    return bool(mine) and all(r.read for r in mine)


def is_read(mail: Mail, receipts: Iterable[Receipt], members: Iterable[str] = ()) -> bool:
    """Whether ``mail`` is in nobody's unread mail any more (the module docstring says when)."""
    if mail.retracted:
        return True
    got = list(receipts)
    if mail.thread is not None:
        readers = set(members) - {mail.sender}
        return all(any(r.role == who and r.read for r in got) for who in readers)
    if mail.channel == "broadcast":
        return bool(got) and all(r.read for r in got)
    entries = [e for e in (mail.channel or "").split(",") if e]
    return bool(entries) and all(_entry_read(e, got) for e in entries)


def message_leaves(mail: Mail, read: bool, horizon_ms: int, now_ms: int) -> bool:
    """A held message leaves: older than the horizon and read, or older than twice it."""
    if horizon_ms <= 0:
        return False
    soft, hard = cutoffs(horizon_ms, now_ms)
    return mail.created_ms < hard or (mail.created_ms < soft and read)


def receipts_only(body: Mapping[str, Any]) -> bool:
    """A ``set`` body whose every write is a receipt."""
    writes = body.get("w")
    return isinstance(writes, list) and bool(writes) and all(
        isinstance(w, list) and w[:1] == [RECEIPTS] for w in writes)


class OpLike(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def hlc(self) -> int: ...
    @property
    def body(self) -> Mapping[str, Any]: ...


def _wall(hlc: int) -> int:
    return hlc >> 16  # the HLC's wall-clock part (``replica.hlc``), without importing it here


def purgeable_on_arrival(op: OpLike, horizon_ms: int, now_ms: int) -> bool:
    """An op no replica keeps, judged from the op alone: a message, a receipt-only ``set`` op or a
    retraction created more than twice the horizon ago. Sync may skip storing it (and count its
    seq as held); 0 (keep everything) keeps every op."""
    if horizon_ms <= 0 or _wall(op.hlc) >= cutoffs(horizon_ms, now_ms)[1]:
        return False
    return op.kind in ("msg", "rtr") or (op.kind == "set" and receipts_only(op.body))


def op_leaves(op: OpLike, horizon_ms: int, now_ms: int, *, in_force: bool = False) -> bool:
    """A held op other than a message leaves (a message's fate is ``message_leaves``)."""
    if op.kind == KIND_RET:
        return not in_force and horizon_ms > 0 and _wall(op.hlc) < cutoffs(horizon_ms, now_ms)[1]
    return op.kind != "msg" and op.kind not in ALWAYS_KEPT and purgeable_on_arrival(op, horizon_ms, now_ms)


def granule(horizon_ms: int) -> int:
    """How long (ms) a purge may lag behind the rules: a hundredth of the horizon, 1 s to 10 min.
    A daemon purges at most once per granule after a change, so a busy fleet is not swept per op."""
    return min(max(horizon_ms // 100, MIN_GRANULE_MS), MAX_GRANULE_MS)


def next_expiry(horizon_ms: int, first_young_message_ms: int | None, first_young_op_ms: int | None) -> int | None:
    """When a purge can next remove something, with no new op: the first message not yet older
    than the horizon crosses it, or the first op (message or not) not yet older than twice it
    crosses that. None with nothing held to cross either line (or keep everything)."""
    if horizon_ms <= 0:
        return None
    times = [t + horizon_ms for t in (first_young_message_ms,) if t is not None]
    times += [t + 2 * horizon_ms for t in (first_young_op_ms,) if t is not None]
    return min(times, default=None)


# -- what a purge says --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Removed:
    """What a purge removed from this replica."""

    messages: int = 0
    receipts: int = 0  # receipt registers (one per message, role and instance)
    ops: int = 0  # op rows, messages' included

    def __add__(self, other: Removed) -> Removed:
        return Removed(self.messages + other.messages, self.receipts + other.receipts, self.ops + other.ops)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Sweep:
    """One purge pass in progress: its clock, the horizon, and where its steps have got to.
    ``phase`` ``LATE`` walks the ops that landed since the last pass (receipts and retractions of
    messages already purged), ``MESSAGES`` the messages, ``OTHERS`` the other ops; ``after`` is the
    last (hlc, lseq) looked at (lseq alone in ``LATE``), so each step picks up where the last stopped."""

    now_ms: int
    horizon_ms: int
    in_force: tuple[int, bytes] | None = None  # the stamp of the ret op in force
    phase: int = 0
    after: tuple[int, int] = (-1, 0)
    removed: Removed = field(default_factory=Removed)

    @property
    def done(self) -> bool:
        return self.phase >= DONE or self.horizon_ms <= 0


LATE, MESSAGES, OTHERS, DONE = range(4)


@dataclass(frozen=True)
class PurgeReport:
    """A finished pass: when, how long, what it removed, and the bytes on disk before and after."""

    at_ms: int
    took_ms: int
    removed: Removed
    bytes_before: int
    bytes_after: int

    def to_dict(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "took_ms": self.took_ms, **self.removed.to_dict(),
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after}


@dataclass(frozen=True)
class RetentionState:
    """The horizon in force here, who set it when, and what purging has done on this replica."""

    horizon_ms: int
    horizon: str
    set_at_ms: int | None
    set_by: str | None  # node id (hex) of the member whose op is in force
    last_purge: dict[str, Any] | None  # the last pass that removed something (``PurgeReport.to_dict``)
    checked_at_ms: int | None  # the last pass, whatever it removed
    removed_total: dict[str, int] = field(default_factory=dict)  # since the first pass here

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
