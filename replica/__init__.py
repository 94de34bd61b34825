"""The replica: CRDT core, SQLite store and Python API of peerd.

Invariants:
* This package imports nothing else of peerd and never uses asyncio (tests/test_layers.py),
  so the merge and sync rules can be tested as pure functions.
* The names below load on first use: importing a light submodule (``replica.mailbox``,
  ``replica.ids``) does not load the signing, codec and store modules, which a prompt hook
  that only reads must not pay for.
* A replica file and its node key go together (``key_path``): a key is made only for a file
  that is a replica, and a key whose database is gone is retired, never reused, so a node
  never signs a seq twice.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import TYPE_CHECKING, Any

from replica.routing import DEFAULT_BROADCAST_HISTORY_MS

if TYPE_CHECKING:
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
        RolePinned,
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
        MarkResult,
        MessageLog,
        MessagePage,
        MessageRecord,
        Page,
        Profile,
        ReadState,
        RecipientCheck,
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

REPLICA_FILE = "replica.db"
KEY_FILE = "node.key"
ORPHAN_KEY_AGE = 60.0  # seconds; a key and its database are always created moments apart

_ERRORS = ("InvalidArgument", "InvalidOp", "LocalError", "NotFound", "PeerdError", "RemoteError", "RolePinned",
           "StoreError", "Undecodable")
_MODELS = ("Agent", "ApplyResult", "FileCheck", "Inbox", "InboxMessage", "LogMessage", "MarkResult", "MessageLog",
           "MessagePage", "MessageRecord", "Page",
           "Profile", "ReadState", "RecipientCheck", "RecipientStatus", "SearchHit", "SenderSeen", "SentMessage",
           "Thread", "ThreadInfo", "ThreadMessage", "ThreadSummary", "receipt_state")
_WHERE = {
    "Replica": "replica.api", "agent_id_for": "replica.api", "check_file": "replica.store",
    **dict.fromkeys(_ERRORS, "replica.errors"), **dict.fromkeys(_MODELS, "replica.models"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:  # a submodule (``from replica import hlc``) is then imported by the import system
        raise AttributeError(f"module 'replica' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def key_path(db: Path) -> Path:
    """Where the node key of the replica file ``db`` is kept: ``node.key`` beside a home's
    ``replica.db`` (so the file is that node), else ``<file>.key`` beside the file."""
    return db.with_name(KEY_FILE) if db.name == REPLICA_FILE else db.with_name(f"{db.name}.key")


def open_file(db: Path, *, broadcast_history_ms: int = DEFAULT_BROADCAST_HISTORY_MS,
              new_identity: identity.Identity | None = None) -> Replica:
    """Open the replica file ``db`` as the node whose key is kept beside it (``key_path``),
    creating file and key if needed (``broadcast_history_ms``: see ``Replica.open``; a new key is
    ``new_identity`` when given: ``peerd join`` presents a key before it writes a home).

    A node key whose database is gone (deleted, restored without it) is retired, not
    reused: its peers still hold its old ops, so new ops under the same key would reuse
    their seqs and be ignored by every peer. The replica starts as a new node instead.
    """
    from replica import identity  # noqa: PLC0415 - loads signing: only when a replica is opened
    from replica.api import Replica  # noqa: PLC0415
    from replica.store import Store  # noqa: PLC0415

    db.parent.mkdir(parents=True, exist_ok=True)
    key = key_path(db)
    if not db.exists() and key.exists() and time.time() - key.stat().st_mtime > ORPHAN_KEY_AGE:
        import logging  # noqa: PLC0415 - only this rare path logs

        retired = key.with_name(f"{key.name}.retired-{int(time.time())}")
        os.replace(key, retired)
        logging.getLogger("replica").warning("replica database missing beside an old node key: retired the key "
                                             "as %s; this replica starts as a new node", retired.name)
    st = Store(db)  # before the key: a file that is no replica gets no key beside it
    try:
        return Replica(st, identity.load_or_create(key, new_identity), broadcast_history_ms=broadcast_history_ms)
    except BaseException:
        st.close()
        raise


def open_home(home: Path, *, broadcast_history_ms: int = DEFAULT_BROADCAST_HISTORY_MS,
              new_identity: identity.Identity | None = None) -> Replica:
    """Open the replica kept in ``home`` (creating folder, key and database if needed)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return open_file(home / REPLICA_FILE, broadcast_history_ms=broadcast_history_ms, new_identity=new_identity)


__all__ = [
    "Agent", "ApplyResult", "FileCheck", "Inbox", "InboxMessage", "InvalidArgument", "InvalidOp",
    "LocalError", "LogMessage", "MarkResult", "MessageLog", "MessagePage", "MessageRecord", "NotFound",
    "Page", "PeerdError", "Profile", "ReadState", "RecipientCheck", "RecipientStatus", "RemoteError", "Replica",
    "RolePinned",
    "SearchHit",
    "SenderSeen", "SentMessage", "StoreError", "Thread", "ThreadInfo", "ThreadMessage", "ThreadSummary",
    "Undecodable", "agent_id_for", "check_file", "key_path", "open_file", "open_home", "receipt_state",
]
