"""The replica: CRDT core, SQLite store and Python API of peerd.

This package imports nothing else of peerd and never uses asyncio, so the merge
and sync rules can be tested as pure functions.
"""

import logging
import os
import time
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
    Undecodable,
)
from replica.models import (
    Agent,
    ApplyResult,
    FileCheck,
    Inbox,
    InboxMessage,
    LogMessage,
    MessageLog,
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
    ThreadSummary,
    receipt_state,
)
from replica.store import check_file

log = logging.getLogger("replica")

REPLICA_FILE = "replica.db"
KEY_FILE = "node.key"


ORPHAN_KEY_AGE = 60.0  # seconds; a key and its database are always created moments apart


def open_home(home: Path, new_identity: identity.Identity | None = None) -> Replica:
    """Open the replica kept in ``home`` (creating folder, key and database if needed; a new key is
    ``new_identity`` when given).

    A node key whose database is gone (deleted, restored without it) is retired, not
    reused: its peers still hold its old ops, so new ops under the same key would reuse
    their seqs and be ignored by every peer. The replica starts as a new node instead.
    """
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = home / KEY_FILE
    if not (home / REPLICA_FILE).exists() and key.exists() and time.time() - key.stat().st_mtime > ORPHAN_KEY_AGE:
        retired = key.with_name(f"{KEY_FILE}.retired-{int(time.time())}")
        os.replace(key, retired)
        log.warning("replica database missing beside an old node key: retired the key as %s; "
                    "this replica starts as a new node", retired.name)
    return Replica.open(home / REPLICA_FILE, identity.load_or_create(key, new_identity))


__all__ = [
    "Agent", "ApplyResult", "FileCheck", "Inbox", "InboxMessage", "InvalidArgument", "InvalidOp", "LocalError",
    "LogMessage", "MessageLog", "NotFound", "Page", "PeerdError", "Profile", "ReadState", "RecipientStatus",
    "RemoteError", "Replica", "SearchHit", "SenderSeen", "SentMessage", "StoreError", "Thread", "ThreadInfo",
    "ThreadMessage", "ThreadSummary", "Undecodable",
    "agent_id_for", "check_file", "open_home", "receipt_state",
]
