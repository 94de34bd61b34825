"""Messaging: send, read an inbox, mark read, delivery status, retract, the message log.

Invariants:
* Who sees a message is ``routing.visible_to``; the inbox queries implement it
  once, in ``mailbox`` (``INBOX_SOURCES`` finds what is filed under a role or
  an instance address, ``ADDRESSED`` applies the instance rules, ``IN_HISTORY``
  the broadcast history), and ``tests/test_routing.py`` checks both queries
  against the pure rule.
* Names match by key (``names.name_key``) through the key columns; what is
  shown is the name as the sender wrote it.
* Reading an inbox also records when the role was first seen, if this replica
  has no time for it yet (``replica.firstseen``).
* Reading an inbox records *delivered* for what it returns unread; nothing
  else here writes except ``mark_receipts``, sending and retracting.
* Cursors are positions in the local arrival order (``lseq``), so a message
  that arrives late is never skipped; a time is first turned into such a
  position (the last op that arrived at or before it).
* A retracted message has no content, leaves every inbox and search, and is
  shown as retracted by ``get_message``, ``list_messages`` and ``message_status``;
  its text then leaves the files (``ReplicaCore.scrub``, ``replica.scrub``): a retraction made
  here scrubs at once, for at most ``SCRUB_INLINE_STEPS`` short steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replica import firstseen, project, routing, store
from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.checks import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    check_content,
    check_count,
    check_limit,
    check_name,
    check_since,
    chunks,
    required_name,
)
from replica.core import ReplicaCore, const_body, iso, read_writes
from replica.errors import InvalidArgument, NotFound
from replica.firstseen import KnownRoles
from replica.ids import receipt_id
from replica.mailbox import INBOX_SOURCES, NODE_COLUMNS, inbox_args, inbox_sql, merged, node_hex
from replica.models import (
    Inbox,
    InboxMessage,
    LogMessage,
    MarkResult,
    MessageLog,
    MessagePage,
    MessageRecord,
    RecipientCheck,
    RecipientStatus,
    SentMessage,
)
from replica.names import name_key
from replica.ops import KIND_MSG, KIND_RETRACT, MAX_SESSION_DAY
from replica.roles import check_roles

SCRUB_INLINE_STEPS = 4  # a retraction scrubs a small replica at once; a large one's index is merged after

_KNOWN_ROLES = "known_roles"  # a remembered read (``ReplicaCore._remembered``): every known role key
_UNREAD = tuple(inbox_sql(src, unread_only=True, order="ASC") for src in INBOX_SOURCES)
_LATEST = tuple(inbox_sql(src, unread_only=False, order="DESC") for src in INBOX_SOURCES)

_LOG_QUERY = (
    f"SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.content, m.hlc, a.name,"
    f" {NODE_COLUMNS} FROM ops m LEFT JOIN agents a ON m.thread IS NOT NULL AND a.id = m.sender"
)
_RECORD = (
    "m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.content, m.hlc, m.sday,"
    f" m.tenant, m.retracted, {NODE_COLUMNS}"
)


def within_budget(sizes: Sequence[int], max_bytes: int | None) -> int:
    """How many of the first rows fit in ``max_bytes`` (always at least one row, if any)."""
    if max_bytes is None:
        return len(sizes)
    used = 0
    for i, size in enumerate(sizes):
        if i and used + size > max_bytes:
            return i
        used += size
    return len(sizes)


def _log_message(r: Any) -> LogMessage:
    """Thread messages show their sender by agent name (its id stays in ``sender_id``)."""
    sender = r[9] if r[6] is not None and r[9] else r[2]
    return LogMessage(id=r[1], seq=r[0], sender=sender, sender_id=r[2], sender_instance=r[3], channel=r[4],
                      target_instance=r[5], thread=r[6], content=r[7] or "", created=hlcmod.to_iso(r[8]),
                      from_node=node_hex(r[10]), from_node_name=r[11])


def _record(r: Any) -> MessageRecord:
    return MessageRecord(id=r[1], seq=r[0], sender=r[2], sender_instance=r[3], channel=r[4], target_instance=r[5],
                         thread=r[6], content=r[7], created=hlcmod.to_iso(r[8]), session_day=r[9], tenant=r[10],
                         retracted=None if r[11] is None else hlcmod.to_iso(r[11]), from_node=node_hex(r[12]),
                         from_node_name=r[13])


def _message_body(from_: str, channel: str, content: str, instance_id: str | None, from_instance_id: str | None, *,
                  session_day: int | None, tenant_id: str | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A message op's body from checked arguments, and the roles its channel names."""
    sender = required_name(from_, "from")
    roles = routing.parse_channel(required_name(channel, "channel"))
    if not roles:
        raise InvalidArgument("channel names no role")
    body: dict[str, Any] = {
        "f": sender, "fi": check_name(from_instance_id, "fromInstanceId", optional=True),
        "c": ",".join(roles), "ti": check_name(instance_id, "instanceId", optional=True),
        "t": None, "x": check_content(content),
    }
    day = check_session_day(session_day)
    tenant = check_name(tenant_id, "tenantId", optional=True)
    if day is not None:
        body["sd"] = day
    if tenant is not None:
        body["tn"] = tenant
    return body, roles


def check_session_day(value: object) -> int | None:
    return None if value is None else check_count(value, "sessionDay", low=1, high=MAX_SESSION_DAY)


class Messaging(ReplicaCore):
    def send_message(self, from_: str, channel: str, content: str, instance_id: str | None = None,
                     from_instance_id: str | None = None, *, session_day: int | None = None,
                     tenant_id: str | None = None) -> SentMessage:
        """Send ``content`` from role ``from_`` to a role, roles, or ``broadcast``. ``session_day``
        (VantagePeers' day number) defaults to the day of sending; ``tenant_id`` is stored as given."""
        body, roles = _message_body(from_, channel, content, instance_id, from_instance_id, session_day=session_day,
                                    tenant_id=tenant_id)
        lseq, op = self._write(KIND_MSG, const_body(body))
        return SentMessage(opsmod.message_id(op.origin, op.seq), lseq, hlcmod.to_iso(op.hlc), op.hlc, roles)

    def send_checked(self, from_: str, channel: str, content: str, instance_id: str | None = None,
                     from_instance_id: str | None = None, *, session_day: int | None = None,
                     tenant_id: str | None = None) -> tuple[SentMessage, RecipientCheck, MessageRecord]:
        """``send_message``, with ``recipient_check`` (asked before the write) and the message as
        stored (``get_message``), all in the write's one transaction."""
        body, roles = _message_body(from_, channel, content, instance_id, from_instance_id, session_day=session_day,
                                    tenant_id=tenant_id)
        checks: list[RecipientCheck] = []
        after: list[tuple[tuple[int, int], KnownRoles]] = []

        def check(cur: Any) -> None:
            version = self._store.version()
            hit = self._reads.get(_KNOWN_ROLES)
            result, seen = check_roles(cur, roles, hit[1] if hit is not None and hit[0] == version else None)
            checks.append(result)
            if seen is not None:  # what they are once this send commits: its sender is seen too
                after.append(((version[0], version[1] + 1), seen.with_role(name_key(body["f"]))))

        def read_back(cur: Any, op: opsmod.Op) -> MessageRecord:
            row = project.find_message(cur, opsmod.message_id(op.origin, op.seq), _RECORD)
            return _record(row)

        lseq, op, record = self._write_then(KIND_MSG, const_body(body), read_back, check)
        assert record is not None
        if after:  # keyed by the version right after this commit: any other commit makes it miss
            self._reads[_KNOWN_ROLES] = after[0]
        sent = SentMessage(record.id, lseq, record.created, op.hlc, roles)
        return sent, checks[0], record

    def position_at(self, arrived_ms: int) -> int:
        """The last local position that had arrived at or before ``arrived_ms`` (Unix ms)."""
        when = check_count(arrived_ms, "arrived_after_ms")
        with self._store.read() as cur:
            return store.position_at(cur, when)

    def check_messages(self, recipient: str, recipient_instance_id: str | None = None,
                       since: int | None = None, limit: int = DEFAULT_LIMIT, *,
                       arrived_after_ms: int | None = None, max_bytes: int | None = None,
                       tenant_id: str | None = None) -> Inbox:
        """Unread messages for (recipient, instance), oldest first; records delivery.

        ``since`` is a local position; ``arrived_after_ms`` keeps only messages that arrived here
        after that time (Unix ms); ``max_bytes`` caps the page's content bytes (at least one
        message); ``tenant_id`` keeps one tenant's messages. ``Inbox.truncated`` says more wait."""
        role = required_name(recipient, "recipient")
        inst = check_name(recipient_instance_id, "recipientInstanceId", optional=True)
        after = check_since(since)
        if arrived_after_ms is not None:
            after = max(after, self.position_at(arrived_after_ms))
        limit = check_limit(limit)
        budget = None if max_bytes is None else check_count(max_bytes, "max_bytes", low=1)
        tenant = check_name(tenant_id, "tenantId", optional=True)
        now = self._wall()
        first, seen = self._first_seen(role, now)
        rows = self._inbox_rows(role, inst, after, limit + 1, tenant=tenant, floor=self._broadcast_floor(first))
        keep = within_budget([len((r[6] or "").encode()) for r in rows[:limit]], budget)
        truncated = len(rows) > keep
        rows = rows[:keep]
        key = (name_key(role), routing.instance_key(inst))
        undelivered = [["rcpt", [r[1], *key], "d", now] for r in rows if r[9] is None]
        if seen or undelivered:
            self._set(seen + undelivered)
        rows.sort(key=lambda r: (r[7], r[0]))  # creation order (HLC) within the page
        msgs = [self._inbox_message(r, key, now) for r in rows]
        return Inbox(msgs, max((m.seq for m in msgs), default=after), truncated)

    def inbox_all(self, recipient: str, recipient_instance_id: str | None = None,
                  since: int | None = None, limit: int = DEFAULT_LIMIT) -> Inbox:
        """The latest ``limit`` messages addressed to (recipient, instance), read ones
        included, oldest first. Records delivery as ``check_messages`` does."""
        unread = self.check_messages(recipient, recipient_instance_id, since, limit)  # checks the arguments
        role = required_name(recipient, "recipient")
        inst = check_name(recipient_instance_id, "recipientInstanceId", optional=True)
        first, _ = self._first_seen(role, self._wall())  # recorded by check_messages above
        args = inbox_args(role, inst, check_since(since), limit, tenant=None, floor=self._broadcast_floor(first))
        with self._store.read() as cur:
            rows = merged([r for sql in _LATEST for r in cur.execute(sql, args)], newest_first=True)[:limit]
        key = (name_key(role), routing.instance_key(inst))
        msgs = [self._inbox_message(r, key, None) for r in reversed(rows)]
        return Inbox(msgs, max([unread.cursor, *(m.seq for m in msgs)]))

    def _inbox_rows(self, role: str, inst: str | None, after: int, limit: int, *, tenant: str | None,
                    floor: int) -> list[Any]:
        """The first ``limit`` unread messages for (role, inst) after ``after``, by lseq
        (broadcasts from HLC ``floor`` on).

        Index scans in lseq order (the role's channel, broadcasts, multi-role routes, and the
        same for the instance address), each stopping at ``limit`` matches, merged. A per-caller
        floor remembers where the caller's unread messages begin: everything below it is read
        or not addressed to the caller, and stays so (reads are never undone; new arrivals get
        higher lseqs), so a long history of read messages is not scanned again. A role's
        broadcast floor only moves earlier (first-seen times learnt from peers), which can make
        old broadcasts addressed to it; so the broadcast floor is part of the key. A tenant
        filter hides messages that are not "read or not addressed", so it never moves the floor.
        """
        key = (name_key(role), routing.instance_key(inst), floor)
        start = self._floors.get(key, 0)
        args = inbox_args(role, inst, max(after, start), limit, tenant=tenant, floor=floor)
        with self._store.read() as cur:
            rows = merged([r for sql in _UNREAD for r in cur.execute(sql, args)], newest_first=False)
            newest = int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
            if after <= start and tenant is None:
                self._floors[key] = rows[0][0] - 1 if rows else newest
        return rows[:limit]

    def _inbox_message(self, r: Any, key: tuple[str, str], now: int | None) -> InboxMessage:
        """An inbox row as returned to the reader ``key`` (role and instance keys); ``now`` stands
        in for a delivery being recorded by this call."""
        delivered = r[9] if r[9] is not None else now
        return InboxMessage(
            id=r[1], receipt_id=receipt_id(r[1], *key), sender=r[2],
            sender_instance=r[3], channel=r[4], target_instance=r[5], content=r[6], created=hlcmod.to_iso(r[7]),
            seq=r[0], delivered_at=iso(delivered), read_at=iso(r[8]), from_node=node_hex(r[10]), from_node_name=r[11],
        )

    def mark_receipts(self, receipt_ids: Sequence[str], caller: str | None = None) -> MarkResult:
        """Record *read* for each known receipt and report unknown ids (and which of them are
        message ids); with ``caller`` (a role), receipts of other roles are reported and then
        nothing is marked (VantagePeers' scope guard). Repeated ids count once."""
        if isinstance(receipt_ids, str) or not isinstance(receipt_ids, Sequence):
            raise InvalidArgument("receiptIds must be a list of receipt ids")
        ids = list(dict.fromkeys(required_name(r, "receipt id") for r in receipt_ids))
        if len(ids) > MAX_LIMIT:
            raise InvalidArgument(f"at most {MAX_LIMIT} receipt ids per call")
        who = None if caller is None else name_key(required_name(caller, "callerOrchestrator"))
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
            messages = {r for r in unknown[:MAX_LIMIT] if project.find_message(cur, r, "m.lseq") is not None}
        not_yours = [r for r in ids if r in found and who is not None and found[r][1] != who]
        now = self._wall()
        writes: list[list[Any]] = []
        for rid in ids:
            if rid not in found or not_yours:
                continue
            msg_id, role, inst, delivered, read = found[rid]
            if read is None:
                writes += read_writes([msg_id, role, inst], delivered, now)
        if writes:
            self._set(writes)
        return MarkResult(sum(1 for w in writes if w[2] == "r"), unknown, not_yours,
                          [r for r in unknown if r in messages], {r: found[r][1] for r in not_yours})

    def mark_as_read(self, receipt_ids: Sequence[str]) -> int:
        """Record *read* for each receipt; returns how many were newly read. All or nothing:
        ``NotFound`` if any id is unknown (``mark_receipts`` marks the known ones instead)."""
        if isinstance(receipt_ids, str) or not isinstance(receipt_ids, Sequence):
            raise InvalidArgument("receiptIds must be a list of receipt ids")
        ids = [required_name(r, "receipt id") for r in receipt_ids]
        with self._store.read() as cur:
            known = {row[0] for chunk in chunks(ids, 500) for row in cur.execute(
                f"SELECT rid FROM receipts WHERE rid IN ({','.join('?' * len(chunk))})", chunk)}
        unknown = [r for r in ids if r not in known]
        if unknown:
            raise NotFound(f"unknown receipt id(s): {', '.join(unknown[:10])}")
        return self.mark_receipts(ids).marked

    def message_status(self, message_id: str) -> list[RecipientStatus]:
        """Per recipient: receipt id, delivered at, read at (None while pending)."""
        mid = required_name(message_id, "messageId")
        with self._store.read() as cur:
            msg = project.find_message(cur, mid, "m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.hlc")
            if msg is None:
                raise NotFound(f"unknown message id {mid}")
            rows = cur.execute(  # a role forgotten since it read a broadcast no longer counts among its recipients
                "SELECT role, inst, rid, delivered, read, acked FROM receipts r WHERE msg_id = ?1"
                " AND NOT (?2 AND EXISTS (SELECT 1 FROM first_seen f WHERE f.role = r.role AND f.at IS NULL))"
                " ORDER BY role, inst",
                (mid, routing.channel_key(msg[2] or "") == routing.BROADCAST),
            ).fetchall()
            expected = _expected_roles(cur, msg, self._broadcast_history_ms, self._wall())
        out = [RecipientStatus(r[0], r[1] or None, r[2], iso(r[3]), iso(r[4]), iso(r[5])) for r in rows]
        reached = {r[0] for r in rows} | {r[1] for r in rows if r[1]}  # a role, or an instance address
        out += [RecipientStatus(role, msg[3], None, None, None) for role in expected if name_key(role) not in reached]
        return out

    def get_message(self, message_id: str) -> MessageRecord:
        """One message as stored (content None once retracted); ``NotFound`` if not held here."""
        mid = required_name(message_id, "messageId")
        with self._store.read() as cur:
            row = project.find_message(cur, mid, _RECORD)
        if row is None:
            raise NotFound(f"unknown message id {mid}")
        return _record(row)

    def list_messages(self, *, session_day: int | None = None, from_: str | None = None,
                      tenant_id: str | None = None, before: int | None = None,
                      limit: int = DEFAULT_LIMIT) -> MessagePage:
        """Channel messages (not thread messages), newest arrival first, retracted ones included;
        filters are equalities (``from_`` and ``tenant_id`` by name key); ``before`` is a seq
        from an earlier page. ``MessagePage.before`` is set when older messages remain."""
        where = ["m.id IS NOT NULL", "m.thread IS NULL"]
        args: list[Any] = []
        day = check_session_day(session_day)
        if day is not None:
            where.append("m.sday = ?")
            args.append(day)
        for col, value, what in (("m.skey", from_, "from"), ("m.tenant", tenant_id, "tenantId")):
            if value is not None:
                where.append(f"{col} = ?")
                args.append(name_key(required_name(value, what)))
        if before is not None:
            where.append("m.lseq < ?")
            args.append(check_count(before, "before", low=1))
        limit = check_limit(limit)
        with self._store.read() as cur:
            rows = cur.execute(f"SELECT {_RECORD} FROM ops m WHERE {' AND '.join(where)} ORDER BY m.lseq DESC LIMIT ?",
                               (*args, limit + 1)).fetchall()
        items = [_record(r) for r in rows[:limit]]
        return MessagePage(items, items[-1].seq if len(rows) > limit else None)

    def retract_message(self, message_id: str, caller: str) -> MessageRecord:
        """Retract a message as its sender role ``caller`` (one signed op, replicated): every
        replica drops its content and search entry, and it leaves every inbox. Retracting a
        retracted message writes nothing. Only the sender role may; thread messages cannot be."""
        mid = required_name(message_id, "messageId")
        role = required_name(caller, "callerOrchestrator")
        msg = self.get_message(mid)
        if msg.thread is not None:
            raise InvalidArgument("thread messages cannot be retracted")
        if name_key(role) != name_key(msg.sender):
            raise InvalidArgument(f"only the sender role {msg.sender!r} may delete message {mid}, not {role!r}")
        if msg.retracted is None:
            with self._store.read() as cur:  # its sighting of the sender outlives it: its op will be gone
                sent = hlcmod.wall_of(int(project.find_message(cur, mid, "m.hlc")[0]))
            self._set([firstseen.sent_write(msg.sender, sent)])
            self._write(KIND_RETRACT, const_body({"m": mid, "f": role}))
            self.scrub(SCRUB_INLINE_STEPS)  # the rest, if any, is the daemon's (``peerd.indexer``)
        return self.get_message(mid)

    def receipt_owner(self, receipt_id: str) -> tuple[str, str, str | None] | None:
        """(message id, role, instance) of a receipt id this replica knows, else None."""
        with self._store.read() as cur:
            row = cur.execute("SELECT msg_id, role, inst FROM receipts WHERE rid = ?", (receipt_id.strip(),)).fetchone()
        return None if row is None else (row[0], row[1], row[2] or None)

    def receipt_count(self, message_id: str) -> int:
        mid = required_name(message_id, "messageId")
        with self._store.read() as cur:
            return int(cur.execute("SELECT count(*) FROM receipts WHERE msg_id = ?", (mid,)).fetchone()[0])

    def message_log(self, after: int | None = None, limit: int = DEFAULT_LIMIT) -> MessageLog:
        """Messages (thread messages too) in arrival order: the latest ``limit``, or the
        first ``limit`` after local position ``after``. A retracted message shows empty content."""
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
    """Roles with a profile (by name key, spelt as first written) whose inbox holds a broadcast
    created at ``created_ms`` (a role with no first-seen time yet would be first seen now)."""
    rows = cur.execute("SELECT p.rkey, min(p.role), f.at FROM profiles p LEFT JOIN first_seen f ON f.role = p.rkey"
                       " GROUP BY p.rkey ORDER BY p.rkey")
    return [role for key, role, first in rows if key != name_key(sender) and routing.in_broadcast_history(
        created_ms, routing.broadcast_floor(now if first is None else first, history_ms))]

