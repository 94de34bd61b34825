"""Read-only views over a replica for the operator tools: the message log in
arrival order, a role's whole inbox (read messages too), threads with names,
and search hits, each message with the delivery and read state of every
recipient.

Invariants: the SQL here runs on its own connection opened ``mode=ro``, so it
can never write; anything that must write (recording delivery) goes through
the replica API. Functions are synchronous and return JSON-ready dicts;
callers on an event loop run them in a worker thread. Cursors are positions
in the replica's local arrival order (``seq``), like everywhere else.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from replica import InvalidArgument, NotFound, Replica
from replica.api import DEFAULT_LIMIT, MAX_LIMIT, check_count, check_name
from replica.hlc import pack, to_iso
from replica.routing import instance_key
from replica.store import receipt_id

BUSY_TIMEOUT_S = 30.0

_MESSAGE_COLUMNS = (
    "m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.thread, m.content, m.hlc, a.name"
)
_AGENT_JOIN = "LEFT JOIN agents a ON m.thread IS NOT NULL AND a.id = m.sender"


@contextlib.contextmanager
def read_only(db: str | Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a replica file (a daemon may be writing it)."""
    if str(db) == ":memory:":
        raise InvalidArgument("operator views need a replica file, not :memory:")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise NotFound(f"cannot open replica {db}: {exc}") from None
    try:
        yield conn
    finally:
        conn.close()


def receipt_state(delivered_at: str | None, read_at: str | None) -> str:
    """pending, delivered or read."""
    if read_at is not None:
        return "read"
    return "delivered" if delivered_at is not None else "pending"


def message_row(r: Sequence[Any]) -> dict[str, Any]:
    """A message as the operator tools show it (thread senders by agent name)."""
    return {
        "id": r[1], "seq": r[0], "sender": r[9] if r[6] is not None and r[9] else r[2], "sender_id": r[2],
        "sender_instance": r[3], "channel": r[4], "target_instance": r[5], "thread": r[6],
        "content": r[7], "created": to_iso(r[8]),
    }


def recipients(rep: Replica, message_id: str) -> list[dict[str, Any]]:
    """Delivery and read state of each recipient of one message."""
    return [
        {**s.to_dict(), "state": receipt_state(s.delivered_at, s.read_at)}
        for s in rep.message_status(message_id)
    ]


def _with_recipients(rep: Replica, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "recipients": recipients(rep, m["id"])} for m in msgs]


# -- the log --------------------------------------------------------------------------------


def message_log(rep: Replica, *, after: int | None = None, limit: int = DEFAULT_LIMIT,
                with_recipients: bool = False) -> dict[str, Any]:
    """Messages in arrival order: the latest ``limit`` ones, or the first ``limit`` after ``after``."""
    limit = check_count(limit, "limit", low=1, high=MAX_LIMIT)
    with read_only(rep.path) as conn:
        if after is None:
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM ops m {_AGENT_JOIN}"
                " WHERE m.id IS NOT NULL ORDER BY m.lseq DESC LIMIT ?", (limit,)).fetchall()
            rows.reverse()
        else:
            after = check_count(after, "after")
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM ops m {_AGENT_JOIN}"
                " WHERE m.id IS NOT NULL AND m.lseq > ? ORDER BY m.lseq LIMIT ?", (after, limit)).fetchall()
    msgs = [message_row(r) for r in rows]
    if with_recipients:
        msgs = _with_recipients(rep, msgs)
    return {"messages": msgs, "cursor": msgs[-1]["seq"] if msgs else (after or 0)}


# -- a role's inbox, read messages included --------------------------------------------------


def inbox(rep: Replica, role: str, instance: str | None = None, *, include_read: bool = False,
          since: int | None = None, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Unread messages (recording delivery, as ``check_messages`` does); with
    ``include_read``, the latest ``limit`` messages addressed to the role whatever their state."""
    unread = rep.check_messages(role, instance, since, limit)
    if not include_read:
        return unread.to_dict()
    who = check_name(role, "recipient")
    inst = check_name(instance, "recipientInstanceId", optional=True)
    assert who is not None
    after = 0 if since is None else check_count(since, "since")
    key = instance_key(inst)
    with read_only(rep.path) as conn:
        rows = conn.execute(
            "WITH cand(lseq) AS ("
            "   SELECT lseq FROM ops WHERE channel IN (?1, 'broadcast') AND lseq > ?3"
            "   UNION SELECT lseq FROM routes WHERE role = ?1 AND lseq > ?3)"
            " SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.content, m.hlc,"
            " rc.delivered, rc.read"
            " FROM cand JOIN ops m ON m.lseq = cand.lseq"
            " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ?2"
            " WHERE (m.to_inst IS NULL OR m.to_inst = ?4)"
            " AND NOT (m.sender = ?1 AND coalesce(m.sender_inst, '') = ?2)"
            " ORDER BY m.lseq DESC LIMIT ?5",
            (who, key, after, inst, limit),
        ).fetchall()
    rows.reverse()
    msgs = [
        {"id": r[1], "receipt_id": receipt_id(r[1], who, key), "sender": r[2], "sender_instance": r[3],
         "channel": r[4], "target_instance": r[5], "content": r[6], "created": to_iso(r[7]), "seq": r[0],
         "delivered_at": _ms_iso(r[8]), "read_at": _ms_iso(r[9])}
        for r in rows
    ]
    return {"messages": msgs, "cursor": max([unread.cursor, *(m["seq"] for m in msgs)])}


def _ms_iso(ms: int | None) -> str | None:
    return None if ms is None else to_iso(pack(ms))


# -- threads and search ---------------------------------------------------------------------


def threads(rep: Replica) -> list[dict[str, Any]]:
    """Every thread: participants by name, message count, latest activity."""
    out = []
    for tid in rep.find_threads():
        info = rep.get_thread_info(tid)
        if info is None:
            continue
        names = []
        for aid in info.participants:
            agent = rep.get_agent(aid)
            names.append(agent.name if agent is not None else aid)
        out.append({"thread_id": tid, "participants": names, "participant_ids": list(info.participants),
                    "message_count": info.message_count, "latest_activity": info.latest_activity})
    return out


def search(rep: Replica, query: str, *, from_: str | None = None, channel: str | None = None,
           since: int | None = None, limit: int = DEFAULT_LIMIT, with_recipients: bool = False) -> dict[str, Any]:
    """Messages matching every word of ``query``, best match first."""
    hits = [h.to_dict() for h in rep.search_messages(query, from_=from_, channel=channel, since=since, limit=limit)]
    if with_recipients:
        hits = _with_recipients(rep, hits)
    return {"query": query, "hits": hits}
