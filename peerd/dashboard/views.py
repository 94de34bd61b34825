"""Read views over a replica for the operator tools (local API, dashboard): the
message log in arrival order, a role's whole inbox (read messages too),
threads with names, and search hits, each message optionally with the
delivery and read state of every recipient.

Invariants: no SQL here; the messages are ``replica.service``'s, in the one vocabulary
(``replica.wire``, the shapes ``peerd --json`` and MCP show). Only ``inbox``
writes, through the replica (it records delivery, as ``check_messages``
does). Functions are synchronous; callers on an event loop run them in a
worker thread.
"""

from __future__ import annotations

from typing import Any

from replica import Replica
from replica.api import DEFAULT_LIMIT
from replica.service import Service


def message_log(rep: Replica, *, after: int | None = None, limit: int = DEFAULT_LIMIT,
                with_recipients: bool = False) -> dict[str, Any]:
    """Messages in arrival order: the latest ``limit`` ones, or the first ``limit`` after ``after``."""
    return Service(rep).log(after, limit, with_recipients=with_recipients)


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
    return Service(rep).search(query, from_=from_, channel=channel, since=since, limit=limit,
                               with_recipients=with_recipients)
