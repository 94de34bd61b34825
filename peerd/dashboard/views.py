"""Read views over a replica for the operator tools (local API, dashboard): the
message log in arrival order, a role's whole inbox (read messages too),
threads with names, and search hits, each message optionally with the
delivery and read state of every recipient.

Invariants: no SQL here; every function formats what ``Replica`` returns
into JSON-ready dicts (the shapes ``peerd --json`` prints). Only ``inbox``
writes, through the replica (it records delivery, as ``check_messages``
does). Functions are synchronous; callers on an event loop run them in a
worker thread.
"""

from __future__ import annotations

from typing import Any

from replica import Replica
from replica.api import DEFAULT_LIMIT


def recipients(rep: Replica, message_id: str) -> list[dict[str, Any]]:
    """Delivery and read state of each recipient of one message."""
    return [{**s.to_dict(), "state": s.state} for s in rep.message_status(message_id)]


def _with_recipients(rep: Replica, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "recipients": recipients(rep, m["id"])} for m in msgs]


def message_log(rep: Replica, *, after: int | None = None, limit: int = DEFAULT_LIMIT,
                with_recipients: bool = False) -> dict[str, Any]:
    """Messages in arrival order: the latest ``limit`` ones, or the first ``limit`` after ``after``."""
    out = rep.message_log(after, limit).to_dict()
    if with_recipients:
        out["messages"] = _with_recipients(rep, out["messages"])
    return out


def inbox(rep: Replica, role: str, instance: str | None = None, *, include_read: bool = False,
          since: int | None = None, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Unread messages (recording delivery, as ``check_messages`` does); with
    ``include_read``, the latest ``limit`` messages addressed to the role whatever their state."""
    read = rep.inbox_all if include_read else rep.check_messages
    return read(role, instance, since, limit).to_dict()


def threads(rep: Replica) -> list[dict[str, Any]]:
    """Every thread: participants by name, message count, latest activity."""
    return [t.to_dict() for t in rep.list_threads()]


def search(rep: Replica, query: str, *, from_: str | None = None, channel: str | None = None,
           since: int | None = None, limit: int = DEFAULT_LIMIT, with_recipients: bool = False) -> dict[str, Any]:
    """Messages matching every word of ``query``, best match first."""
    hits = [h.to_dict() for h in rep.search_messages(query, from_=from_, channel=channel, since=since, limit=limit)]
    if with_recipients:
        hits = _with_recipients(rep, hits)
    return {"query": query, "hits": hits}
