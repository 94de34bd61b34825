"""The replica: CRDT core, SQLite store and Python API of peerd.

This package imports nothing else of peerd and never uses asyncio, so the merge
and sync rules can be tested as pure functions.
"""

from pathlib import Path

from replica import identity
from replica.api import Replica, agent_id_for
from replica.errors import (
    InvalidArgument,
    InvalidOp,
    LocalError,
    NotFound,
    PeerdError,
    RemoteError,
    StoreError,
)
from replica.models import (
    Agent,
    ApplyResult,
    Inbox,
    InboxMessage,
    Page,
    Profile,
    ReadState,
    RecipientStatus,
    SearchHit,
    SenderSeen,
    SentMessage,
    Thread,
    ThreadInfo,
    ThreadMessage,
)

REPLICA_FILE = "replica.db"
KEY_FILE = "node.key"


def open_home(home: Path) -> Replica:
    """Open the replica kept in ``home`` (creating folder, key and database if needed)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Replica.open(home / REPLICA_FILE, identity.load_or_create(home / KEY_FILE))


__all__ = [
    "Agent", "ApplyResult", "Inbox", "InboxMessage", "InvalidArgument", "InvalidOp", "LocalError",
    "NotFound", "Page", "PeerdError", "Profile", "ReadState", "RecipientStatus", "RemoteError",
    "Replica", "SearchHit", "SenderSeen", "SentMessage", "StoreError", "Thread", "ThreadInfo", "ThreadMessage",
    "agent_id_for",
    "open_home",
]
