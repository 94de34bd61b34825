"""Acknowledgements, the replica's side: a message that asks for one, a recipient's acknowledgement,
and the overdue view (mcp_agent_mail's ``ack_required``, ``acknowledge_message``, ack-overdue).

Invariants:
* Asking is a register write ``["ack", [message id], "req", true]`` in an op of its own, after the
  message: the message itself stays an op every release takes, and a release that knows no ``ack``
  table holds the write for later (``replica.ops``).
* An acknowledgement is a receipt field, ``a`` (acked at, wall ms), last writer wins like ``d`` and
  ``r``, so it syncs like a receipt; it is written in its own op after the read mark, so a peer that
  knows no ``a`` still learns the message was read. Acknowledging twice writes nothing more.
* The overdue view is a function of what is held and the clock: messages that ask for an
  acknowledgement, older than the wait given, with a recipient that has not acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

from replica import project
from replica.checks import check_count, required_name
from replica.core import iso, read_writes
from replica.errors import InvalidArgument, NotFound
from replica.hlc import wall_of
from replica.messaging import Messaging
from replica.models import RecipientStatus
from replica.names import name_key
from replica.routing import instance_key

TABLE = "ack"
MAX_OVERDUE = 1000


@dataclass(frozen=True)
class AckResult:
    message_id: str
    acknowledged: bool
    acknowledged_at: str | None
    read_at: str | None


@dataclass(frozen=True)
class OverdueAck:
    message_id: str
    sender: str
    channel: str | None
    created: str
    age_seconds: int
    waiting_for: list[RecipientStatus]


class Acks(Messaging):
    def require_ack(self, message_id: str) -> None:
        """Ask the recipients of a message held here to acknowledge it."""
        mid = required_name(message_id, "messageId")
        with self._store.read() as cur:
            if project.find_message(cur, mid, "m.lseq") is None:
                raise NotFound(f"unknown message id {mid}")
        self._set([[TABLE, [mid], "req", True]])

    def ack_required(self, message_id: str) -> bool:
        with self._store.read() as cur:
            row = cur.execute("SELECT v FROM lww WHERE tbl = ? AND k = ? AND f = 'req'", (TABLE, message_id)).fetchone()
        return bool(row and row[0])

    def acknowledge(self, message_id: str, role: str, instance: str | None = None) -> AckResult:
        """Record that (role, instance) acknowledged a message addressed to it (and read it)."""
        mid, who = required_name(message_id, "message_id"), required_name(role, "agent_name")
        mine = [s for s in self.message_status(mid) if name_key(s.role) == name_key(who)
                and (instance is None or instance_key(s.instance) == instance_key(instance))]
        if not mine:
            raise InvalidArgument(f"message {mid} is not addressed to {who}: only a recipient acknowledges it")
        now = self._wall()
        key = [mid, name_key(who), instance_key(instance if instance is not None else mine[0].instance)]
        with self._store.read() as cur:
            row = cur.execute("SELECT delivered, read, acked FROM receipts WHERE msg_id = ? AND role = ? AND inst = ?",
                              key).fetchone()
        delivered, read, acked = row if row is not None else (None, None, None)
        if acked is not None:
            return AckResult(mid, True, iso(acked), iso(read))
        if read is None:
            self._set(read_writes(key, delivered, now))
        self._set([["rcpt", key, "a", now]])
        return AckResult(mid, True, iso(now), iso(read if read is not None else now))

    def overdue_acks(self, older_than_seconds: int = 3600, *, sender: str | None = None,
                     limit: int = 100) -> list[OverdueAck]:
        """Messages that ask for an acknowledgement, sent more than ``older_than_seconds`` ago, and
        the recipients that have not acknowledged them; oldest first."""
        wait_ms = check_count(older_than_seconds, "older_than_seconds") * 1000
        n = check_count(limit, "limit", low=1, high=MAX_OVERDUE)
        who = None if sender is None else name_key(required_name(sender, "sender"))
        now = self._wall()
        with self._store.read() as cur:
            asked = [k for (k,) in cur.execute("SELECT k FROM lww WHERE tbl = ? AND f = 'req' AND v = 1", (TABLE,))]
            found = [(mid, row) for mid in asked
                     if (row := project.find_message(cur, mid, "m.sender, m.channel, m.hlc, m.skey")) is not None]
        out = []
        for mid, (from_, channel, hlc, skey) in sorted(found, key=lambda f: f[1][2]):
            age = now - wall_of(int(hlc))
            if age < wait_ms or (who is not None and skey != who):
                continue
            waiting = [s for s in self.message_status(mid) if s.acked_at is None]
            if waiting:
                out.append(OverdueAck(mid, from_, channel, iso(wall_of(int(hlc))) or "", age // 1000, waiting))
            if len(out) >= n:
                break
        return out
