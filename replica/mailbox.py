"""A role's mail, read with nothing but sqlite3: the inbox queries, and pending mail for pushes
and prompt hooks.

Invariants:
* The inbox SQL (``INBOX_SOURCES``, ``ADDRESSED``, ``IN_HISTORY``, ``inbox_sql``,
  ``inbox_args``) is ``routing.visible_to`` written once, here; ``messaging`` reads inboxes
  with it and ``tests/test_routing.py`` checks it against the pure rule. Names match by key
  (``names.name_key``); receipts are keyed by the role's key and the instance key.
* *Mail* of a reader (role, instance) is what its inbox holds unread (broadcasts within
  the role's broadcast history, ``routing.in_broadcast_history``), plus, if an agent
  carries the role's name, the thread messages from others in that agent's threads that
  the agent has not read (thread receipts are the agent's, instance key ``""``).
  *Pending* narrows it to mail no one has delivered yet (no delivered time on its receipt).
* Reads only. Importing this module loads no signing, codec or asyncio, so a prompt hook
  with nothing to show never pays for them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from replica.hlc import pack, to_iso, wall_of
from replica.ids import agent_id_for, receipt_id
from replica.names import name_key
from replica.routing import broadcast_floor as broadcast_floor_ms
from replica.routing import instance_address, instance_key

BUSY_TIMEOUT_S = 5.0

# Where messages to role key ?1 after lseq ?3 are filed: its channel, broadcasts, the routes of
# multi-role messages (``routing.route_keys``; a one-role or broadcast message needs no route row),
# and the same two for the reader's instance address ?5 (``routing.instance_address``, or NULL).
INBOX_SOURCES = (
    "SELECT lseq FROM ops WHERE ckey = ?1 AND lseq > ?3",
    "SELECT lseq FROM ops WHERE ckey = 'broadcast' AND lseq > ?3",
    "SELECT lseq FROM routes WHERE role = ?1 AND lseq > ?3",
    "SELECT lseq FROM ops WHERE ckey = ?5 AND lseq > ?3",
    "SELECT lseq FROM routes WHERE role = ?5 AND lseq > ?3",
)
# The instance rules of ``routing.visible_to`` for (role key ?1, instance key ?2), retractions,
# and the tenant filter ?6 (NULL: any).
ADDRESSED = (
    "(m.tkey IS NULL OR m.tkey = ?2) AND NOT (m.skey = ?1 AND m.sikey = ?2) AND m.retracted IS NULL"
    " AND (?6 IS NULL OR m.tenant = ?6)"
)
# The sending node of a message row ``m`` (its op's origin) and the node's name in the membership
# (NULL if unknown): the one lookup every message view appends to its columns.
NODE_COLUMNS = (
    "(SELECT o.node FROM origins o WHERE o.oid = m.oid),"
    " (SELECT fa.name FROM origins o JOIN fleet_admits fa ON fa.node = o.node WHERE o.oid = m.oid)"
)
# ``routing.in_broadcast_history``: a broadcast created before the role's floor (HLC ?7) is not in its inbox.
IN_HISTORY = "(m.ckey IS NOT 'broadcast' OR m.hlc >= ?7)"


def inbox_sql(source: str, *, unread_only: bool, order: str, undelivered_only: bool = False) -> str:
    """One index scan of ``source`` in lseq ``order``, stopping at ``limit`` (?4) matches."""
    where = f"{ADDRESSED} AND {IN_HISTORY}" + (" AND rc.read IS NULL" if unread_only else "")
    where += " AND rc.delivered IS NULL" if undelivered_only else ""
    return (
        "SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.content, m.hlc, rc.read, rc.delivered,"
        f" {NODE_COLUMNS} FROM ({source} ORDER BY lseq {order}) c JOIN ops m ON m.lseq = c.lseq"
        " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ?2"
        f" WHERE {where} ORDER BY c.lseq {order} LIMIT ?4"
    )


def inbox_args(role: str, inst: str | None, after: int, limit: int, *, tenant: str | None,
               floor: int) -> tuple[Any, ...]:
    """The parameters of ``inbox_sql`` for reader (role, inst)."""
    return (name_key(role), instance_key(inst), after, limit, instance_address(role, inst),
            None if tenant is None else name_key(tenant), floor)


def merged(scans: Iterable[Any], *, newest_first: bool) -> list[Any]:
    """Rows of several scans as one list by lseq, each message once (a role may match twice)."""
    return sorted({r[0]: r for r in scans}.values(), key=lambda r: r[0], reverse=newest_first)


_MAIL = tuple(inbox_sql(src, unread_only=True, order="ASC") for src in INBOX_SOURCES)
_PENDING = tuple(inbox_sql(src, unread_only=True, order="ASC", undelivered_only=True) for src in INBOX_SOURCES)


def _thread_sql(*, undelivered_only: bool) -> str:
    """Unread thread messages from others in agent ?1's threads after lseq ?2, at most ?3
    (with each one's number in its thread, ``thread_seqs``), retracted ones left out."""
    return (
        f"SELECT m.lseq, m.id, m.sender, m.thread, m.content, m.hlc, rc.delivered, a.name, ts.tseq, {NODE_COLUMNS}"
        " FROM members mb JOIN ops m ON m.thread = mb.thread AND m.lseq > ?2"
        " JOIN thread_seqs ts ON ts.lseq = m.lseq"
        " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ''"
        " LEFT JOIN agents a ON a.id = m.sender"
        " WHERE mb.agent = ?1 AND mb.present = 1 AND m.sender != ?1 AND m.retracted IS NULL AND rc.read IS NULL"
        f"{' AND rc.delivered IS NULL' if undelivered_only else ''} ORDER BY m.lseq LIMIT ?3"
    )


_THREAD_MAIL = _thread_sql(undelivered_only=False)
_THREAD_PENDING = _thread_sql(undelivered_only=True)


class Mail(NamedTuple):
    """One message of a reader's mail. ``seq`` is its arrival position here; a thread message
    also has ``thread`` and ``thread_seq`` (its number in the thread, what ``mark_read`` takes).
    ``key`` is its receipt's key (message, role, instance key); ``sender`` is a role, or an
    agent's name for a thread message."""

    seq: int
    id: str
    receipt_id: str
    sender: str
    sender_instance: str | None
    channel: str | None
    target_instance: str | None
    thread: str | None
    content: str
    created: str
    delivered: int | None
    key: tuple[str, str, str]
    thread_seq: int | None = None
    created_ms: int = 0  # ``created`` as Unix ms
    from_node: str | None = None  # the sending node (its key, hex: the origin of the message's op)
    from_node_name: str | None = None  # its name in the membership, None if unknown here


def node_hex(raw: Any) -> str | None:
    """A node key column as the views show it (hex), None stays None."""
    return None if raw is None else bytes(raw).hex()


def _inbox_mail(r: Any, role: str, inst_key: str) -> Mail:
    return Mail(r[0], r[1], receipt_id(r[1], role, inst_key), r[2], r[3], r[4], r[5], None, r[6], to_iso(r[7]),
                r[9], (r[1], role, inst_key), None, wall_of(r[7]), node_hex(r[10]), r[11])


def _thread_mail(r: Any, aid: str) -> Mail:
    return Mail(r[0], r[1], receipt_id(r[1], aid, ""), r[7] or r[2], None, None, None, r[3], r[4], to_iso(r[5]),
                r[6], (r[1], aid, ""), r[8], wall_of(r[5]), node_hex(r[9]), r[10])


def schema_version(cur: sqlite3.Cursor) -> int:
    """The schema version the file is at (0 for a file that is no replica yet)."""
    try:
        row = cur.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no meta table
        return 0
    return 0 if row is None else int(row[0])


def first_seen_at(cur: sqlite3.Cursor, role: str) -> int | None:
    """When ``role`` was first seen in the fleet (wall ms; ``replica.firstseen``), or None (never,
    or only before a forget)."""
    row = cur.execute("SELECT at FROM first_seen WHERE role = ?", (name_key(role),)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def broadcast_floor(cur: sqlite3.Cursor, role: str, now_ms: int, history_ms: int) -> int:
    """The HLC below which broadcasts are not in ``role``'s inbox: ``history_ms`` before it was
    first seen, or before now if it never was (as its first ``check_messages`` would record)."""
    first = first_seen_at(cur, role)
    return pack(broadcast_floor_ms(now_ms if first is None else first, history_ms))


def mail(cur: sqlite3.Cursor, role: str, instance: str | None = None, *, floor: int, after: int = 0,
         limit: int = 50, pending_only: bool = True, threads: bool = True) -> list[Mail]:
    """The first ``limit`` messages of (role, instance)'s mail after lseq ``after``, by lseq, with
    broadcasts from HLC ``floor`` on (``broadcast_floor``); ``pending_only``: only what was never
    delivered. Names must already be checked."""
    scans = _PENDING if pending_only else _MAIL
    args = inbox_args(role, instance, after, limit, tenant=None, floor=floor)
    out = [_inbox_mail(r, args[0], args[1]) for r in merged((r for sql in scans for r in cur.execute(sql, args)),
                                                             newest_first=False)]
    if threads:
        aid = agent_id_for(role)
        sql = _THREAD_PENDING if pending_only else _THREAD_MAIL
        out += [_thread_mail(r, aid) for r in cur.execute(sql, (aid, after, limit))]
        out.sort(key=lambda m: m.seq)
    return out[:limit]


def mark(cur: sqlite3.Cursor) -> int:
    """The replica's newest arrival position (``max_lseq``)."""
    return int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection that only reads a replica file (one that exists: it is never created)."""
    conn = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S,
                           isolation_level=None)
    conn.execute("PRAGMA query_only = 1")
    return conn


def undelivered_keys(items: Sequence[Mail]) -> list[tuple[str, str, str]]:
    """The receipt keys of ``items`` that have no delivered time yet (once each)."""
    return list(dict.fromkeys(m.key for m in items if m.delivered is None))


def delivered_among(cur: sqlite3.Cursor, keys: Iterable[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    """Which of these receipt keys already have a delivered time."""
    sql = "SELECT 1 FROM receipts WHERE msg_id = ? AND role = ? AND inst = ? AND delivered IS NOT NULL"
    return {key for key in keys if cur.execute(sql, key).fetchone() is not None}

