"""Ids that are pure functions of names, so every replica computes the same ones.

Invariants: no I/O and nothing heavier than BLAKE2 and ``replica.names`` imported, so the
light read path (``replica.mailbox``, the prompt hook) can use them. BLAKE2 comes from the
interpreter's own ``_blake2`` module where it has one: ``hashlib`` would load OpenSSL first.
"""

from __future__ import annotations

import functools

try:
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it: hashlib's is the same function
    from hashlib import blake2b

from replica.names import name_key


@functools.lru_cache(maxsize=8192)
def receipt_id(msg_id: str, role: str, inst: str) -> str:
    """A receipt's id: a pure function of (message, role, instance); remembered, as an inbox page is
    shown again until it is marked."""
    h = blake2b(f"{msg_id}\x1f{role}\x1f{inst}".encode(), digest_size=12, person=b"peerd-rcpt")
    return h.hexdigest()


def agent_id_for(name: str) -> str:
    """An agent's id is a pure function of its name's key (``names.name_key``: NFC, lower
    case, trimmed): every replica agrees, and ``Alice`` and ``alice`` are one agent."""
    digest = blake2b(name_key(name).encode(), digest_size=8, person=b"peerd-agent").hexdigest()
    return "ag_" + digest
