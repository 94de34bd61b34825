"""Threads: conversations among agents, read by position rather than by inbox.

Invariants:
* Membership is an LWW set of (thread, agent) (``members.present``); only live
  agents join, and only present participants append: an append's check, its write and its
  read-back are one transaction.
* A thread message is an ordinary message with a thread id and no channel; its
  ``seq`` is its number within the thread in this replica's arrival order
  (1, 2, 3, ..., given as it lands: ``thread_seqs``, ``project.materialize``), so ``poll(after_seq)``
  never skips a message that arrives late and the first message is seq 1.
* Read state is the agent's receipts on the thread's messages (instance key
  ``""``), so it merges like any other receipt.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from replica import hlc as hlcmod
from replica import ops as opsmod
from replica.checks import (
    MAX_LIMIT,
    MAX_SEQ,
    check_content,
    check_count,
    check_limit,
    required_name,
    required_names,
)
from replica.core import const_body, read_writes
from replica.errors import InvalidArgument, NotFound
from replica.models import ReadState, Thread, ThreadInfo, ThreadMessage, ThreadSummary
from replica.ops import KIND_MSG, KIND_SET, Op
from replica.profiles import Profiles

# Per (thread ?2, agent ?1): message count, newest creation, highest read seq, unread, unread from others.
_READ_COUNTS = (
    "SELECT count(*), max(m.hlc),"
    " coalesce(max(CASE WHEN rc.read IS NOT NULL THEN ts.tseq END), 0),"
    " coalesce(sum(rc.read IS NULL), 0),"
    " coalesce(sum(rc.read IS NULL AND m.sender != ?1), 0)"
    " FROM thread_seqs ts JOIN ops m ON m.lseq = ts.lseq"
    " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ''"
    " WHERE ts.thread = ?2"
)


_POLL = "SELECT ts.tseq, m.id, m.sender, m.content, m.hlc, ts.thread FROM thread_seqs ts JOIN ops m ON m.lseq = ts.lseq"


def _thread_message(r: Any) -> ThreadMessage:
    return ThreadMessage(r[0], r[1], r[2], r[3], hlcmod.to_iso(r[4]), r[5])


def _thread_row(cur: Any, tid: str) -> Any:
    return cur.execute("SELECT id, created FROM threads WHERE id = ?", (tid,)).fetchone()


def _members(cur: Any, tid: str) -> list[str]:
    rows = cur.execute("SELECT agent FROM members WHERE thread = ? AND present = 1 ORDER BY agent", (tid,))
    return [r[0] for r in rows]


def _thread_members(cur: Any, tid: str) -> list[str]:
    """The present members of thread ``tid``; ``NotFound`` if there is no such thread."""
    if _thread_row(cur, tid) is None:
        raise NotFound(f"unknown thread {tid}")
    return _members(cur, tid)


def _read_counts(cur: Any, tid: str, aid: str) -> tuple[int, int, int, int, int | None]:
    row = cur.execute(_READ_COUNTS, (aid, tid)).fetchone()
    return int(row[0]), int(row[2]), int(row[3]), int(row[4]), row[1]


class Threads(Profiles):
    def _require_agents(self, agent_ids: Iterable[str]) -> list[str]:
        ids = required_names(agent_ids, "agent id")
        for aid in ids:
            if not self._alive(aid):
                raise NotFound(f"unknown agent {aid}")
        return ids

    def _require_thread(self, thread_id: str) -> tuple[str, list[str]]:
        tid = required_name(thread_id, "thread id")
        with self._store.read() as cur:
            return tid, _thread_members(cur, tid)

    def create_thread(self, *agent_ids: str) -> str:
        """A new thread of these agents; ``InvalidArgument('need >=2 participants')``."""
        ids = required_names(agent_ids, "agent id")
        if len(ids) < 2:
            raise InvalidArgument("need >=2 participants")
        self._require_agents(ids)
        made: list[str] = []

        def body(seq: int, stamp: int) -> dict[str, Any]:
            tid = opsmod.derived_id("th_", self.node_key, seq)
            made.append(tid)
            writes: list[list[Any]] = [["thread", [tid], "created", stamp]]
            return {"w": writes + [["member", [tid, a], "in", True] for a in ids]}

        self._write(KIND_SET, body)
        return made[-1]

    def get_thread(self, thread_id: str) -> Thread | None:
        tid = required_name(thread_id, "thread id")
        with self._store.read() as cur:
            row = _thread_row(cur, tid)
            if row is None:
                return None
            return Thread(tid, _members(cur, tid), hlcmod.to_iso(row[1]))

    def find_threads(self, *agent_ids: str) -> list[str]:
        """Threads that have every one of ``agent_ids`` among their participants."""
        ids = required_names(agent_ids, "agent id")
        with self._store.read() as cur:
            if not ids:
                return [r[0] for r in cur.execute("SELECT id FROM threads ORDER BY created, id")]
            marks = ",".join("?" * len(ids))
            rows = cur.execute(
                f"SELECT m.thread FROM members m JOIN threads t ON t.id = m.thread"
                f" WHERE m.agent IN ({marks}) AND m.present = 1"
                f" GROUP BY m.thread HAVING count(*) = ? ORDER BY min(t.created), m.thread",
                (*ids, len(ids)),
            ).fetchall()
        return [r[0] for r in rows]

    def list_threads(self) -> list[ThreadSummary]:
        """Every thread, oldest first: participants by agent name, message count, latest activity."""
        out: list[ThreadSummary] = []
        with self._store.read():  # one snapshot for the whole list
            for tid in self.find_threads():
                info = self.get_thread_info(tid)
                assert info is not None
                agents = [self.get_agent(aid) for aid in info.participants]
                names = [a.name if a is not None else aid for a, aid in zip(agents, info.participants, strict=True)]
                out.append(ThreadSummary(tid, names, list(info.participants), info.message_count,
                                         info.latest_activity))
        return out

    def join_thread(self, thread_id: str, agent_id: str) -> None:
        tid, members = self._require_thread(thread_id)
        (aid,) = self._require_agents([agent_id])
        if aid not in members:
            self._set([["member", [tid, aid], "in", True]])

    def leave_thread(self, thread_id: str, agent_id: str) -> None:
        tid, members = self._require_thread(thread_id)
        aid = required_name(agent_id, "agent id")
        if aid not in members:
            raise InvalidArgument("agent not in thread")
        self._set([["member", [tid, aid], "in", False]])

    def append(self, thread_id: str, sender: str, content: str) -> ThreadMessage:
        """Append to a thread; returns the message (its ``seq`` numbers it within the
        thread). Sender must be a participant."""
        tid = required_name(thread_id, "thread id")
        aid = required_name(sender, "sender")
        body = {"f": aid, "fi": None, "c": None, "ti": None, "t": tid, "x": check_content(content)}

        def check(cur: Any) -> None:
            if aid not in _thread_members(cur, tid):
                raise InvalidArgument("sender not in thread")

        def read_back(cur: Any, op: Op) -> ThreadMessage:
            row = cur.execute(f"{_POLL} WHERE m.oid = ? AND m.seq = ?", (self._self_oid, op.seq)).fetchone()
            return _thread_message(row)

        _lseq, _op, message = self._write_then(KIND_MSG, const_body(body), read_back, check)
        assert message is not None
        return message

    def poll(self, thread_id: str, after_seq: int = 0, limit: int = MAX_LIMIT) -> list[ThreadMessage]:
        """Thread messages with seq > ``after_seq``, in local arrival order."""
        tid, _ = self._require_thread(thread_id)
        after = check_count(after_seq, "after_seq", high=MAX_SEQ)
        limit = check_limit(limit)
        with self._store.read() as cur:
            rows = cur.execute(f"{_POLL} WHERE ts.thread = ? AND ts.tseq > ? ORDER BY ts.tseq LIMIT ?",
                               (tid, after, limit)).fetchall()
        return [_thread_message(r) for r in rows]

    def mark_read(self, thread_id: str, agent_id: str, seq: int) -> None:
        """Mark every thread message with seq <= ``seq`` read for ``agent_id``."""
        tid, _ = self._require_thread(thread_id)
        aid = required_name(agent_id, "agent id")
        upto = check_count(seq, "seq", high=MAX_SEQ)
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT m.id, rc.delivered FROM thread_seqs ts JOIN ops m ON m.lseq = ts.lseq"
                " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ? AND rc.inst = ''"
                " WHERE ts.thread = ? AND ts.tseq <= ? AND rc.read IS NULL",
                (aid, tid, upto),
            ).fetchall()
        now = self._wall()
        writes = [w for mid, delivered in rows for w in read_writes([mid, aid, ""], delivered, now)]
        if writes:
            self._set(writes)

    def has_unread(self, thread_id: str, agent_id: str) -> bool:
        """Whether the thread holds messages from others that ``agent_id`` has not read."""
        tid, _ = self._require_thread(thread_id)
        aid = required_name(agent_id, "agent id")
        with self._store.read() as cur:
            return _read_counts(cur, tid, aid)[3] > 0

    def get_thread_info(self, thread_id: str) -> ThreadInfo | None:
        tid = required_name(thread_id, "thread id")
        with self._store.read() as cur:
            row = _thread_row(cur, tid)
            if row is None:
                return None
            count, _c, _u, _o, latest = _read_counts(cur, tid, "")
            latest_iso = hlcmod.to_iso(latest if latest is not None else row[1])
            return ThreadInfo(tid, _members(cur, tid), count, latest_iso)

    def get_thread_read_state(self, thread_id: str, agent_id: str) -> ReadState | None:
        tid = required_name(thread_id, "thread id")
        aid = required_name(agent_id, "agent id")
        with self._store.read() as cur:
            if _thread_row(cur, tid) is None:
                return None
            _count, cursor, unread, others, _l = _read_counts(cur, tid, aid)
            return ReadState(cursor, unread, others)
