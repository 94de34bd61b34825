"""Messaging: send, read an inbox, mark read, delivery status, the message log.

Invariants:
* Who sees a message is ``routing.visible_to``; the inbox queries implement it
  once (``_INBOX_SOURCES`` finds what is filed under a role, ``_ADDRESSED``
  applies the instance rules, ``_IN_HISTORY`` the broadcast history) and
  ``tests/test_routing.py`` checks both queries against the pure rule.
* Reading an inbox also records when the role was first seen, if this replica
  has no time for it yet (``replica.firstseen``).
* Reading an inbox records *delivered* for what it returns unread; nothing
  else here writes except ``mark_as_read`` and sending.
* Cursors are positions in the local arrival order (``lseq``), so a message
  that arrives late is never skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replica import firstseen, routing
from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.checks import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    check_content,
    check_limit,
    check_name,
    check_since,
    chunks,
    required_name,
)
from replica.core import ReplicaCore, const_body, iso, read_writes
from replica.errors import InvalidArgument, NotFound
from replica.models import (
    Inbox,
    InboxMessage,
    LogMessage,
    MessageLog,
    RecipientCheck,
    RecipientStatus,
    SentMessage,
)
from replica.ops import KIND_MSG
from replica.store import receipt_id

# Where messages to role ?1 after lseq ?3 are filed: its channel, broadcasts, and the routes of
# multi-role messages (``routing.route_keys``; a one-role or broadcast message needs no route row).
_INBOX_SOURCES = (
    "SELECT lseq FROM ops WHERE channel = ?1 AND lseq > ?3",
    "SELECT lseq FROM ops WHERE channel = 'broadcast' AND lseq > ?3",
    "SELECT lseq FROM routes WHERE role = ?1 AND lseq > ?3",
)
# The instance rules of ``routing.visible_to`` for (role ?1, instance key ?2, instance ?4).
_ADDRESSED = "(m.to_inst IS NULL OR m.to_inst = ?4) AND NOT (m.sender = ?1 AND coalesce(m.sender_inst, '') = ?2)"
# ``routing.in_broadcast_history``: a broadcast created before the role's floor (HLC ?6) is not in its inbox.
_IN_HISTORY = "(m.channel IS NOT 'broadcast' OR m.hlc >= ?6)"


def _inbox_sql(source: str, *, unread_only: bool, order: str) -> str:
    """One index scan of ``source`` in lseq ``order``, stopping at ``limit`` (?5) matches."""
    return (
        "SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.content, m.hlc, rc.read, rc.delivered"
        f" FROM ({source} ORDER BY lseq {order}) c JOIN ops m ON m.lseq = c.lseq"
        " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ?2"
        f" WHERE {_ADDRESSED} AND {_IN_HISTORY}{' AND rc.read IS NULL' if unread_only else ''}"
        f" ORDER BY c.lseq {order} LIMIT ?5"
    )


_UNREAD = tuple(_inbox_sql(src, unread_only=True, order="ASC") for src in _INBOX_SOURCES)
_LATEST = tuple(_inbox_sql(src, unread_only=False, order="DESC") for src in _INBOX_SOURCES)

_LOG_QUERY = (
    "SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.content, m.hlc, a.name"
    " FROM ops m LEFT JOIN agents a ON m.thread IS NOT NULL AND a.id = m.sender"
)


def _merged(scans: list[Any], *, newest_first: bool) -> list[Any]:
    """Rows of several scans as one list by lseq, each message once (a role may match twice)."""
    return sorted({r[0]: r for r in scans}.values(), key=lambda r: r[0], reverse=newest_first)


def _log_message(r: Any) -> LogMessage:
    """Thread messages show their sender by agent name (its id stays in ``sender_id``)."""
    sender = r[9] if r[6] is not None and r[9] else r[2]
    return LogMessage(id=r[1], seq=r[0], sender=sender, sender_id=r[2], sender_instance=r[3], channel=r[4],
                      target_instance=r[5], thread=r[6], content=r[7], created=hlcmod.to_iso(r[8]))


class Messaging(ReplicaCore):
    def send_message(self, from_: str, channel: str, content: str, instance_id: str | None = None,
                     from_instance_id: str | None = None) -> SentMessage:
        """Send ``content`` from role ``from_`` to a role, roles, or ``broadcast``."""
        sender = required_name(from_, "from")
        roles = routing.parse_channel(required_name(channel, "channel"))
        if not roles:
            raise InvalidArgument("channel names no role")
        body = {
            "f": sender, "fi": check_name(from_instance_id, "fromInstanceId", optional=True),
            "c": ",".join(roles), "ti": check_name(instance_id, "instanceId", optional=True),
            "t": None, "x": check_content(content),
        }
        lseq, op = self._write(KIND_MSG, const_body(body))
        return SentMessage(opsmod.message_id(op.origin, op.seq), lseq, hlcmod.to_iso(op.hlc), op.hlc, roles)

    def recipient_check(self, channel: str) -> RecipientCheck:
        """Which roles ``channel`` names that this replica has never seen, to warn a sender
        (a message to them is still stored: the role may appear later, or on a peer)."""
        roles = routing.parse_channel(required_name(channel, "channel"))
        if roles == (routing.BROADCAST,):
            return RecipientCheck((), ())
        with self._store.read() as cur:
            unknown = tuple(r for r in roles if not firstseen.is_known(cur, r))
            known = firstseen.known_roles(cur) if unknown else []
        return RecipientCheck(unknown, tuple(firstseen.hint(unknown, known)))

    def check_messages(self, recipient: str, recipient_instance_id: str | None = None,
                       since: int | None = None, limit: int = DEFAULT_LIMIT) -> Inbox:
        """Unread messages for (recipient, instance), oldest first; records delivery."""
        role = required_name(recipient, "recipient")
        inst = check_name(recipient_instance_id, "recipientInstanceId", optional=True)
        after = check_since(since)
        limit = check_limit(limit)
        now = self._wall()
        first, seen = self._first_seen(role, now)
        rows = self._inbox_rows(role, inst, after, limit, self._broadcast_floor(first))
        undelivered = [["rcpt", [r[1], role, routing.instance_key(inst)], "d", now] for r in rows if r[9] is None]
        if seen or undelivered:
            self._set(seen + undelivered)
        rows.sort(key=lambda r: (r[7], r[0]))  # creation order (HLC) within the page
        msgs = [self._inbox_message(r, role, inst, now) for r in rows]
        return Inbox(msgs, max((m.seq for m in msgs), default=after))

    def inbox_all(self, recipient: str, recipient_instance_id: str | None = None,
                  since: int | None = None, limit: int = DEFAULT_LIMIT) -> Inbox:
        """The latest ``limit`` messages addressed to (recipient, instance), read ones
        included, oldest first. Records delivery as ``check_messages`` does."""
        unread = self.check_messages(recipient, recipient_instance_id, since, limit)  # checks the arguments
        role = required_name(recipient, "recipient")
        inst = check_name(recipient_instance_id, "recipientInstanceId", optional=True)
        first, _ = self._first_seen(role, self._wall())  # recorded by check_messages above
        args = (role, routing.instance_key(inst), check_since(since), inst, limit, self._broadcast_floor(first))
        with self._store.read() as cur:
            rows = _merged([r for sql in _LATEST for r in cur.execute(sql, args)], newest_first=True)[:limit]
        msgs = [self._inbox_message(r, role, inst, None) for r in reversed(rows)]
        return Inbox(msgs, max([unread.cursor, *(m.seq for m in msgs)]))

    def _inbox_rows(self, role: str, inst: str | None, after: int, limit: int, floor: int) -> list[Any]:
        """The first ``limit`` unread messages for (role, inst) after ``after``, by lseq
        (broadcasts from HLC ``floor`` on).

        Three index scans in lseq order (the role's channel, broadcasts, multi-role routes),
        each stopping at ``limit`` matches, merged. A per-caller floor remembers where the
        caller's unread messages begin: everything below it is read or not addressed to the
        caller, and stays so (reads are never undone; new arrivals get higher lseqs), so a
        long history of read messages is not scanned again. A role's broadcast floor only
        moves earlier (first-seen times learnt from peers), which can make old broadcasts
        addressed to it; so the broadcast floor is part of the key.
        """
        key = (role, inst, floor)
        start = self._floors.get(key, 0)
        args = (role, routing.instance_key(inst), max(after, start), inst, limit, floor)
        with self._store.read() as cur:
            rows = _merged([r for sql in _UNREAD for r in cur.execute(sql, args)], newest_first=False)
            newest = int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
            if after <= start:
                self._floors[key] = rows[0][0] - 1 if rows else newest
        return rows[:limit]

    def _inbox_message(self, r: Any, role: str, inst: str | None, now: int | None) -> InboxMessage:
        """An inbox row as returned; ``now`` stands in for a delivery being recorded by this call."""
        key = routing.instance_key(inst)
        delivered = r[9] if r[9] is not None else now
        return InboxMessage(
            id=r[1], receipt_id=receipt_id(r[1], role, key), sender=r[2], sender_instance=r[3],
            channel=r[4], target_instance=r[5], content=r[6], created=hlcmod.to_iso(r[7]), seq=r[0],
            delivered_at=iso(delivered), read_at=iso(r[8]),
        )

    def mark_as_read(self, receipt_ids: Sequence[str]) -> int:
        """Record *read* for each receipt; returns how many were newly read."""
        if isinstance(receipt_ids, str) or not isinstance(receipt_ids, Sequence):
            raise InvalidArgument("receiptIds must be a list of receipt ids")
        ids = [required_name(r, "receipt id") for r in receipt_ids]
        if len(ids) > MAX_LIMIT:
            raise InvalidArgument(f"at most {MAX_LIMIT} receipt ids per call")
        with self._store.read() as cur:
            found = {
                row[0]: row[1:]
                for chunk in chunks(ids, 500)
                for row in cur.execute(
                    "SELECT rid, msg_id, role, inst, delivered, read FROM receipts"
                    f" WHERE rid IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
            }
        unknown = [r for r in ids if r not in found]
        if unknown:
            raise NotFound(f"unknown receipt id(s): {', '.join(unknown[:10])}")
        now = self._wall()
        writes: list[list[Any]] = []
        for rid in dict.fromkeys(ids):
            msg_id, role, inst, delivered, read = found[rid]
            if read is None:
                writes += read_writes([msg_id, role, inst], delivered, now)
        if writes:
            self._set(writes)
        return sum(1 for w in writes if w[2] == "r")

    def message_status(self, message_id: str) -> list[RecipientStatus]:
        """Per recipient: receipt id, delivered at, read at (None while pending)."""
        mid = required_name(message_id, "messageId")
        with self._store.read() as cur:
            msg = _message_by_id(cur, mid)
            if msg is None:
                raise NotFound(f"unknown message id {mid}")
            rows = cur.execute(
                "SELECT role, inst, rid, delivered, read FROM receipts WHERE msg_id = ? ORDER BY role, inst", (mid,)
            ).fetchall()
            expected = _expected_roles(cur, msg, self._broadcast_history_ms, self._wall())
        out = [RecipientStatus(r[0], r[1] or None, r[2], iso(r[3]), iso(r[4])) for r in rows]
        seen = {r[0] for r in rows}
        out += [RecipientStatus(role, msg[3], None, None, None) for role in expected if role not in seen]
        return out

    def message_log(self, after: int | None = None, limit: int = DEFAULT_LIMIT) -> MessageLog:
        """Messages (thread messages too) in arrival order: the latest ``limit``, or the
        first ``limit`` after local position ``after``."""
        limit = check_limit(limit)
        with self._store.read() as cur:
            if after is None:
                rows = cur.execute(f"{_LOG_QUERY} WHERE m.id IS NOT NULL ORDER BY m.lseq DESC LIMIT ?",
                                   (limit,)).fetchall()
                rows.reverse()
            else:
                after = check_since(after, "after")
                rows = cur.execute(f"{_LOG_QUERY} WHERE m.id IS NOT NULL AND m.lseq > ? ORDER BY m.lseq LIMIT ?",
                                   (after, limit)).fetchall()
        msgs = [_log_message(r) for r in rows]
        return MessageLog(msgs, msgs[-1].seq if msgs else (after or 0))


def _expected_roles(cur: Any, msg: Any, history_ms: int, now: int) -> list[str]:
    sender, _inst, channel, _to, thread, created = msg
    if thread is not None:
        rows = cur.execute("SELECT agent FROM members WHERE thread = ? AND present = 1", (thread,))
        return [r[0] for r in rows if r[0] != sender]
    roles = routing.parse_channel(channel)
    if roles == (routing.BROADCAST,):
        return _broadcast_audience(cur, sender, hlcmod.wall_of(created), history_ms, now)
    return list(roles)


def _broadcast_audience(cur: Any, sender: str, created_ms: int, history_ms: int, now: int) -> list[str]:
    """Roles with a profile whose inbox holds a broadcast created at ``created_ms`` (a role with
    no first-seen time yet would be first seen now)."""
    rows = cur.execute("SELECT p.id, f.at FROM profiles p LEFT JOIN first_seen f ON f.role = p.id ORDER BY p.id")
    return [role for role, first in rows if role != sender and routing.in_broadcast_history(
        created_ms, routing.broadcast_floor(now if first is None else first, history_ms))]


def _message_by_id(cur: Any, mid: str) -> Any:
    """(sender, sender_inst, channel, to_inst, thread, hlc) of a message, found via its origin and seq."""
    parsed = opsmod.parse_message_id(mid)
    if parsed is None:
        return None
    prefix, seq = parsed
    return cur.execute(
        "SELECT m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.hlc FROM origins o"
        " JOIN ops m ON m.oid = o.oid AND m.seq = ? WHERE substr(o.node, 1, ?) = ? AND m.id = ?",
        (seq, len(prefix), prefix, mid),
    ).fetchone()
