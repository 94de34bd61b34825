"""Ids that are pure functions of names, so every replica computes the same ones.

Invariants: no I/O and nothing heavier than ``hashlib`` and ``replica.names``
imported, so the light read path (``replica.mailbox``, the prompt hook) can use them.
"""

from __future__ import annotations

import hashlib

from replica.names import name_key


def receipt_id(msg_id: str, role: str, inst: str) -> str:
    """A receipt's id: a pure function of (message, role, instance)."""
    h = hashlib.blake2b(f"{msg_id}\x1f{role}\x1f{inst}".encode(), digest_size=12, person=b"peerd-rcpt")
    return h.hexdigest()


def agent_id_for(name: str) -> str:
    """An agent's id is a pure function of its name's key (``names.name_key``: NFC, lower
    case, trimmed): every replica agrees, and ``Alice`` and ``alice`` are one agent."""
    digest = hashlib.blake2b(name_key(name).encode(), digest_size=8, person=b"peerd-agent").hexdigest()
    return "ag_" + digest
