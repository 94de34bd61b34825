"""A node of a release newer than this one, for tests: it signs ops of kinds, fields and register
tables that this release does not know, as a future peerd would.

Usage::

    future = NewerNode()
    lease = future.op("lease", {"p": "src/*.py", "ttl": 60})
    mail = future.message("planner", "coder", "hi", ak=True)   # a known kind with a new field
    replica.apply([lease, mail])
"""

from __future__ import annotations

import time
from typing import Any

from replica import hlc as hlcmod
from replica import identity
from replica.ops import encode


class NewerNode:
    """Signs ops with its own key and consecutive seqs (1, 2, 3, ...), stamped with the wall clock."""

    def __init__(self, ident: identity.Identity | None = None, *, first_seq: int = 1) -> None:
        self.ident = ident or identity.generate()
        self.seq = first_seq - 1
        self.clock = 0

    @property
    def key(self) -> bytes:
        return self.ident.public_key

    def op(self, kind: str, body: dict[str, Any]) -> bytes:
        self.seq += 1
        self.clock = hlcmod.tick(self.clock, time.time_ns() // 1_000_000)
        return encode(self.key, self.seq, self.clock, kind, body, sign=self.ident.sign)

    def message(self, sender: str, channel: str, content: str, **extra: Any) -> bytes:
        body = {"f": sender, "fi": None, "c": channel, "ti": None, "t": None, "x": content, **extra}
        return self.op("msg", body)

    def writes(self, *writes: list[Any]) -> bytes:
        return self.op("set", {"w": list(writes)})
