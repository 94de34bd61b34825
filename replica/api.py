"""The Python API over one replica: messaging, profiles, agents, threads, sync.

Invariants:
* Every change is one signed op written in one transaction together with its
  projections; a call that raises has written nothing.
* Arguments are checked before anything is written; bad calls raise
  ``InvalidArgument`` or ``NotFound``, never a sqlite error.
* Cursors (``seq``, ``since``, ``after_seq``) are positions in this replica's
  local arrival order, so a message that arrives late is never skipped.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack

from replica import hlc as hlcmod
from replica import identity as idmod
from replica import ops as opsmod
from replica import routing, store, vector
from replica.errors import InvalidArgument, InvalidOp, NotFound
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
from replica.ops import KIND_MSG, KIND_SET, MAX_CONTENT_BYTES, MAX_NAME_CHARS, MAX_WRITES_PER_OP, Op
from replica.store import Store, receipt_id

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_COUNT = 2**63 - 1  # the largest SQLite integer
Listener = Callable[[], None]


_CONTROL = re.compile(r"[\x00-\x1f]")

# This node's own seq and clock come from its newest op (no extra row to update per write):
# own ops are always contiguous because each takes the next seq inside the write transaction.
_LAST_OWN = (
    "SELECT (SELECT seq FROM ops WHERE oid = ?1 ORDER BY seq DESC LIMIT 1),"
    " max(coalesce((SELECT hlc FROM ops WHERE oid = ?1 ORDER BY seq DESC LIMIT 1), 0), hlc)"
    " FROM origins WHERE oid = ?1"
)
_CONTIG = (
    "CASE WHEN oid = ?1 THEN max(contig, (SELECT coalesce(max(seq), 0) FROM ops WHERE ops.oid = ?1)) ELSE contig END"
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def agent_id_for(name: str) -> str:
    """An agent's id is a pure function of its name: every replica agrees."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"peerd-agent").hexdigest()
    return "ag_" + digest


def _iso(ms: int | None) -> str | None:
    return None if ms is None else hlcmod.to_iso(hlcmod.pack(ms))


# -- argument checks (pure) -------------------------------------------------------------

def _utf8(value: str, what: str) -> bytes:
    """``value`` as UTF-8; a lone surrogate (which SQLite and the wire cannot carry) is a bad argument."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode (it holds a lone surrogate)") from None


def check_name(value: object, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string")
    value = value.strip()
    _utf8(value, what)
    if len(value) > MAX_NAME_CHARS:
        raise InvalidArgument(f"{what} is longer than {MAX_NAME_CHARS} characters")
    if _CONTROL.search(value):
        raise InvalidArgument(f"{what} must not contain control characters")
    return value


def _name(value: object, what: str) -> str:
    out = check_name(value, what)
    assert out is not None
    return out


def check_content(value: object, what: str = "content") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string")
    size = len(_utf8(value, what))
    if size > MAX_CONTENT_BYTES:
        raise InvalidArgument(f"{what} is {size} bytes; the limit is {MAX_CONTENT_BYTES} bytes")
    return value


def check_count(value: object, what: str, *, low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer within [low, high]; SQLite integers are 64-bit, so ``high`` is at most 2^63 - 1."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an integer")
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {value}")
    return value


def fts_query(query: object) -> str:
    """A user's search words as an FTS5 query matching all of them (no operator injection)."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgument("query must be a non-empty string")
    _utf8(query, "query")
    if "\x00" in query:  # FTS5 ends a string at NUL: the query would be malformed
        raise InvalidArgument("query must not contain NUL characters")
    words = [w for w in re.split(r"\s+", query.strip()) if w][:32]
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _const_body(body: dict[str, Any]) -> Callable[[int, int], dict[str, Any]]:
    return lambda _seq, _hlc: body


_INBOX_QUERY = (
    "SELECT m.lseq, m.id, m.sender, m.sender_inst, m.channel, m.to_inst, m.content, m.hlc, rc.read, rc.delivered"
    " FROM {src} JOIN ops m ON m.lseq = c.lseq"
    " LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ?2"
    " WHERE (m.to_inst IS NULL OR m.to_inst = ?4)"
    " AND NOT (m.sender = ?1 AND coalesce(m.sender_inst, '') = ?2)"
    " AND rc.read IS NULL ORDER BY c.lseq LIMIT ?5"
)
_INBOX_SOURCES = (
    "(SELECT lseq FROM ops WHERE channel = ?1 AND lseq > ?3 ORDER BY lseq) c",
    "(SELECT lseq FROM ops WHERE channel = 'broadcast' AND lseq > ?3 ORDER BY lseq) c",
    "(SELECT lseq FROM routes WHERE role = ?1 AND lseq > ?3 ORDER BY lseq) c",
)


class Replica:
    """One replica: a SQLite file (or ``:memory:``) plus this node's identity."""

    def __init__(self, st: Store, ident: idmod.Identity, *, wall: Callable[[], int] = now_ms,
                 max_drift_ms: int = hlcmod.DEFAULT_MAX_DRIFT_MS) -> None:
        self._store = st
        self._ident = ident
        self._wall = wall
        self._max_drift_ms = max_drift_ms
        self._listeners: list[Listener] = []
        self._listen_lock = threading.Lock()
        self._oids: dict[bytes, int] = {}
        self._floors: dict[tuple[str, str | None], int] = {}
        with st.write() as cur:
            self._self_oid = store.origin_id(cur, ident.public_key)

    @classmethod
    def open(cls, path: str | Path = ":memory:", identity: idmod.Identity | None = None,
             *, wall: Callable[[], int] = now_ms) -> Replica:
        """Open (creating if needed) the replica at ``path`` as ``identity``."""
        return cls(Store(path), identity or idmod.generate(), wall=wall)

    # -- identity and lifecycle -------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._ident.node_id

    @property
    def node_key(self) -> bytes:
        return self._ident.public_key

    @property
    def path(self) -> str:
        return self._store.path

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener()`` (from the writing thread) after each commit of new ops."""
        with self._listen_lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with self._listen_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _notify(self) -> None:
        with self._listen_lock:
            listeners = list(self._listeners)
        for cb in listeners:
            cb()

    # -- writing ops ----------------------------------------------------------------

    def _write(self, kind: str, make_body: Callable[[int, int], dict[str, Any]]) -> tuple[int, Op]:
        """Create, sign and store one local op; ``make_body(seq, hlc)`` builds its body."""
        with self._store.write() as cur:
            top, last = cur.execute(_LAST_OWN, (self._self_oid,)).fetchone()
            seq = int(top or 0) + 1
            stamp = hlcmod.tick(int(last or 0), self._wall())
            body = make_body(seq, stamp)
            if kind != KIND_MSG:  # message bodies are built from arguments checked by the caller
                try:
                    opsmod.validate_body(kind, body)
                except InvalidOp as exc:
                    raise InvalidArgument(exc.reason) from None
            raw = opsmod.encode(self.node_key, seq, stamp, kind, body, sign=self._ident.sign)
            op = Op(self.node_key, seq, stamp, kind, body, raw)
            lseq = store.store_op(cur, self._self_oid, op)
            assert lseq is not None
        self._notify()
        return lseq, op

    def _set(self, writes: list[list[Any]]) -> None:
        for chunk in _chunks(writes, MAX_WRITES_PER_OP):
            self._write(KIND_SET, _const_body({"w": chunk}))

    # -- messaging --------------------------------------------------------------------

    def send_message(self, from_: str, channel: str, content: str, instance_id: str | None = None,
                     from_instance_id: str | None = None) -> SentMessage:
        """Send ``content`` from role ``from_`` to a role, roles, or ``broadcast``."""
        sender = _name(from_, "from")
        chan = _name(channel, "channel")
        roles = routing.parse_channel(chan)
        if not roles:
            raise InvalidArgument("channel names no role")
        body = {
            "f": sender, "fi": check_name(from_instance_id, "fromInstanceId", optional=True),
            "c": ",".join(roles), "ti": check_name(instance_id, "instanceId", optional=True),
            "t": None, "x": check_content(content),
        }
        lseq, op = self._write(KIND_MSG, _const_body(body))
        return SentMessage(opsmod.message_id(op.origin, op.seq), lseq, hlcmod.to_iso(op.hlc), op.hlc, roles)

    def check_messages(self, recipient: str, recipient_instance_id: str | None = None,
                       since: int | None = None, limit: int = DEFAULT_LIMIT) -> Inbox:
        """Unread messages for (recipient, instance), oldest first; records delivery."""
        role = _name(recipient, "recipient")
        inst = check_name(recipient_instance_id, "recipientInstanceId", optional=True)
        after = 0 if since is None else check_count(since, "since")
        limit = check_count(limit, "limit", low=1, high=MAX_LIMIT)
        rows = self._inbox_rows(role, inst, after, limit)
        now = self._wall()
        undelivered = [["rcpt", [r[1], role, routing.instance_key(inst)], "d", now] for r in rows if r[9] is None]
        if undelivered:
            self._set(undelivered)
        rows.sort(key=lambda r: (r[7], r[0]))  # creation order (HLC) within the page
        msgs = [self._inbox_message(r, role, inst, now) for r in rows]
        cursor = max((m.seq for m in msgs), default=after)
        return Inbox(msgs, cursor)

    def _inbox_rows(self, role: str, inst: str | None, after: int, limit: int) -> list[Any]:
        """The first ``limit`` unread messages for (role, inst) after ``after``, by lseq.

        Three index scans in lseq order (the role's channel, broadcasts, multi-role routes),
        each stopping at ``limit`` matches, merged. A per-caller floor remembers where the
        caller's unread messages begin: everything below it is read or not addressed to the
        caller, and stays so (reads are never undone; new arrivals get higher lseqs), so a
        long history of read messages is not scanned again.
        """
        key = (role, inst)
        floor = self._floors.get(key, 0)
        args = (role, routing.instance_key(inst), max(after, floor), inst, limit)
        with self._store.read() as cur:
            rows = [row for src in _INBOX_SOURCES for row in cur.execute(_INBOX_QUERY.format(src=src), args)]
            newest = int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
            rows.sort(key=lambda r: r[0])
            if after <= floor:
                self._floors[key] = rows[0][0] - 1 if rows else newest
        return rows[:limit]

    def _inbox_message(self, r: Any, role: str, inst: str | None, now: int) -> InboxMessage:
        key = routing.instance_key(inst)
        return InboxMessage(
            id=r[1], receipt_id=receipt_id(r[1], role, key), sender=r[2], sender_instance=r[3],
            channel=r[4], target_instance=r[5], content=r[6], created=hlcmod.to_iso(r[7]), seq=r[0],
            delivered_at=_iso(r[9] if r[9] is not None else now), read_at=_iso(r[8]),
        )

    def mark_as_read(self, receipt_ids: Sequence[str]) -> int:
        """Record *read* for each receipt; returns how many were newly read."""
        if isinstance(receipt_ids, str) or not isinstance(receipt_ids, Sequence):
            raise InvalidArgument("receiptIds must be a list of receipt ids")
        ids = [_name(r, "receipt id") for r in receipt_ids]
        if len(ids) > MAX_LIMIT:
            raise InvalidArgument(f"at most {MAX_LIMIT} receipt ids per call")
        with self._store.read() as cur:
            found = {
                row[0]: row[1:]
                for chunk in _chunks(ids, 500)
                for row in cur.execute(
                    "SELECT rid, msg_id, role, inst, delivered, read FROM receipts"
                    f" WHERE rid IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
            }
        unknown = [r for r in ids if r not in found]
        if unknown:
            raise NotFound(f"unknown receipt id(s): {', '.join(unknown[:10])}")
        now = self._wall()
        writes: list[list[Any]] = []
        for rid in dict.fromkeys(ids):
            msg_id, role, inst, delivered, read = found[rid]
            if read is None:
                writes.append(["rcpt", [msg_id, role, inst], "r", now])
                if delivered is None:
                    writes.append(["rcpt", [msg_id, role, inst], "d", now])
        if writes:
            self._set(writes)
        return sum(1 for w in writes if w[2] == "r")

    def message_status(self, message_id: str) -> list[RecipientStatus]:
        """Per recipient: receipt id, delivered at, read at (None while pending)."""
        mid = _name(message_id, "messageId")
        with self._store.read() as cur:
            msg = _message_by_id(cur, mid)
            if msg is None:
                raise NotFound(f"unknown message id {mid}")
            rows = cur.execute(
                "SELECT role, inst, rid, delivered, read FROM receipts WHERE msg_id = ? ORDER BY role, inst", (mid,)
            ).fetchall()
            expected = self._expected_roles(cur, msg)
        out = [RecipientStatus(r[0], r[1] or None, r[2], _iso(r[3]), _iso(r[4])) for r in rows]
        seen = {r[0] for r in rows}
        out += [RecipientStatus(role, msg[3], None, None, None) for role in expected if role not in seen]
        return out

    def _expected_roles(self, cur: Any, msg: Any) -> list[str]:
        sender, _inst, channel, _to, thread = msg
        if thread is not None:
            rows = cur.execute("SELECT agent FROM members WHERE thread = ? AND present = 1", (thread,))
            return [r[0] for r in rows if r[0] != sender]
        roles = routing.parse_channel(channel)
        if roles == (routing.BROADCAST,):
            return [r[0] for r in cur.execute("SELECT id FROM profiles ORDER BY id") if r[0] != sender]
        return list(roles)

    # -- full-text search ---------------------------------------------------------------

    def search_messages(self, query: str, *, from_: str | None = None, channel: str | None = None,
                        since: int | None = None, limit: int = DEFAULT_LIMIT) -> list[SearchHit]:
        """Messages matching every word of ``query`` (best match first), optionally
        only from one sender, on one channel role, or after local position ``since``."""
        match = fts_query(query)
        sender = check_name(from_, "from", optional=True)
        role = check_name(channel, "channel", optional=True)
        after = 0 if since is None else check_count(since, "since")
        limit = check_count(limit, "limit", low=1, high=MAX_LIMIT)
        self.catch_up()
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT m.id, m.lseq, m.sender, m.sender_inst, m.channel, m.thread, m.content, m.hlc"
                " FROM message_fts f JOIN ops m ON m.lseq = f.rowid"
                " WHERE message_fts MATCH ?1 AND m.lseq > ?2 AND (?3 IS NULL OR m.sender = ?3)"
                " AND (?4 IS NULL OR m.channel = ?4 OR m.channel = 'broadcast'"
                "      OR EXISTS (SELECT 1 FROM routes r WHERE r.role = ?4 AND r.lseq = m.lseq))"
                " ORDER BY f.rank LIMIT ?5",
                (match, after, sender, role, limit),
            ).fetchall()
        return [SearchHit(r[0], r[1], r[2], r[3], r[4], r[5], r[6], hlcmod.to_iso(r[7])) for r in rows]

    def recent_senders(self, limit: int = MAX_LIMIT) -> list[SenderSeen]:
        """Every (role, instance) that has sent a message, most recently active first."""
        limit = check_count(limit, "limit", low=1, high=MAX_LIMIT)
        self.catch_up()
        with self._store.read() as cur:
            rows = cur.execute("SELECT role, inst, hlc FROM senders ORDER BY hlc DESC LIMIT ?", (limit,)).fetchall()
        return [SenderSeen(r[0], r[1] or None, hlcmod.to_iso(r[2]), r[2]) for r in rows]

    def catch_up(self, step: int = 5000) -> None:
        """Bring the search index and the senders table up to the newest message
        (projections kept off the write path), ``step`` ops per short transaction."""
        while self.catch_up_step(step):
            pass

    def catch_up_step(self, step: int = 5000) -> bool:
        """Index up to ``step`` more ops; True if more remain."""
        step = check_count(step, "step", low=1)
        with self._store.read() as cur:
            upto = int(cur.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()[0])
            newest = int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])
        if newest <= upto:
            return False
        with self._store.write() as cur:
            lo = int(cur.execute("SELECT v FROM meta WHERE k = 'fts_upto'").fetchone()[0])
            hi = min(lo + step, int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0]))
            cur.execute(
                "INSERT INTO message_fts(rowid, content, sender, channel)"
                " SELECT lseq, content, sender, coalesce(channel, thread) FROM ops"
                " WHERE lseq > ? AND lseq <= ? AND id IS NOT NULL",
                (lo, hi),
            )
            cur.execute(
                "INSERT INTO senders(role, inst, hlc)"
                " SELECT sender, coalesce(sender_inst, ''), max(hlc) FROM ops"
                " WHERE lseq > ? AND lseq <= ? AND id IS NOT NULL AND thread IS NULL"
                " GROUP BY sender, coalesce(sender_inst, '')"
                " ON CONFLICT(role, inst) DO UPDATE SET hlc = max(hlc, excluded.hlc)",
                (lo, hi),
            )
            cur.execute("UPDATE meta SET v = ? WHERE k = 'fts_upto'", (hi,))
        return hi < newest

    # -- profiles ------------------------------------------------------------------

    def update_profile(self, orchestrator_id: str, name: str | None = None, static: str | None = None,
                       dynamic: str | None = None) -> Profile:
        """Set the given fields; fields left out (None) keep their value."""
        oid = _name(orchestrator_id, "orchestratorId")
        fields = {"name": name, "static": static, "dynamic": dynamic}
        writes = [["prof", [oid], f, check_content(v, f)] for f, v in fields.items() if v is not None]
        if not writes:
            raise InvalidArgument("give at least one of name, static, dynamic")
        self._set(writes)
        profile = self.get_profile(oid)
        assert profile is not None
        return profile

    def get_profile(self, orchestrator_id: str) -> Profile | None:
        oid = _name(orchestrator_id, "orchestratorId")
        with self._store.read() as cur:
            row = cur.execute("SELECT id, name, static, dynamic, updated FROM profiles WHERE id = ?", (oid,)).fetchone()
        return None if row is None else Profile(row[0], row[1], row[2], row[3], _iso(row[4]))

    def list_profiles(self) -> list[Profile]:
        with self._store.read() as cur:
            rows = cur.execute("SELECT id, name, static, dynamic, updated FROM profiles ORDER BY id").fetchall()
        return [Profile(r[0], r[1], r[2], r[3], _iso(r[4])) for r in rows]

    # -- agents ----------------------------------------------------------------------

    def get_agent(self, agent_id: str) -> Agent | None:
        aid = _name(agent_id, "agent id")
        with self._store.read() as cur:
            row = cur.execute("SELECT id, name, alive FROM agents WHERE id = ?", (aid,)).fetchone()
        return None if row is None or row[1] is None else Agent(row[0], row[1], bool(row[2]))

    def list_agents(self) -> list[Agent]:
        with self._store.read() as cur:
            rows = cur.execute("SELECT id, name, alive FROM agents WHERE alive = 1 ORDER BY name").fetchall()
        return [Agent(r[0], r[1], True) for r in rows]

    def _alive(self, agent_id: str) -> bool:
        agent = self.get_agent(agent_id)
        return agent is not None and agent.alive

    def create_agent(self, name: str) -> str:
        """Register ``name``; ``ValueError('agent name taken')`` if it exists."""
        clean = _name(name, "agent name")
        aid = agent_id_for(clean)
        if self._alive(aid):
            raise InvalidArgument("agent name taken")
        self._set([["agent", [aid], "name", clean], ["agent", [aid], "alive", True]])
        return aid

    def get_or_create_agent(self, name: str) -> str:
        clean = _name(name, "agent name")
        aid = agent_id_for(clean)
        return aid if self._alive(aid) else self.create_agent(clean)

    def delete_agent(self, agent_id: str) -> None:
        aid = _name(agent_id, "agent id")
        if not self._alive(aid):
            raise NotFound(f"unknown agent {aid}")
        self._set([["agent", [aid], "alive", False]])

    # -- threads -----------------------------------------------------------------------

    def _require_agents(self, agent_ids: Iterable[str]) -> list[str]:
        ids = list(dict.fromkeys(_name(a, "agent id") for a in agent_ids))
        for aid in ids:
            if not self._alive(aid):
                raise NotFound(f"unknown agent {aid}")
        return ids

    def create_thread(self, *agent_ids: str) -> str:
        """A new thread of these agents; ``ValueError('need >=2 participants')``."""
        ids = list(dict.fromkeys(_name(a, "agent id") for a in agent_ids))
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

    def _thread_row(self, cur: Any, tid: str) -> Any:
        return cur.execute("SELECT id, created FROM threads WHERE id = ?", (tid,)).fetchone()

    def _members(self, cur: Any, tid: str) -> list[str]:
        rows = cur.execute("SELECT agent FROM members WHERE thread = ? AND present = 1 ORDER BY agent", (tid,))
        return [r[0] for r in rows]

    def get_thread(self, thread_id: str) -> Thread | None:
        tid = _name(thread_id, "thread id")
        with self._store.read() as cur:
            row = self._thread_row(cur, tid)
            if row is None:
                return None
            return Thread(tid, self._members(cur, tid), hlcmod.to_iso(row[1]))

    def _require_thread(self, thread_id: str) -> tuple[str, list[str]]:
        tid = _name(thread_id, "thread id")
        with self._store.read() as cur:
            if self._thread_row(cur, tid) is None:
                raise NotFound(f"unknown thread {tid}")
            return tid, self._members(cur, tid)

    def find_threads(self, *agent_ids: str) -> list[str]:
        """Threads that have every one of ``agent_ids`` among their participants."""
        ids = list(dict.fromkeys(_name(a, "agent id") for a in agent_ids))
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

    def join_thread(self, thread_id: str, agent_id: str) -> None:
        tid, members = self._require_thread(thread_id)
        (aid,) = self._require_agents([agent_id])
        if aid not in members:
            self._set([["member", [tid, aid], "in", True]])

    def leave_thread(self, thread_id: str, agent_id: str) -> None:
        tid, members = self._require_thread(thread_id)
        aid = _name(agent_id, "agent id")
        if aid not in members:
            raise InvalidArgument("agent not in thread")
        self._set([["member", [tid, aid], "in", False]])

    def append(self, thread_id: str, sender: str, content: str) -> int:
        """Append to a thread; returns the message's seq. Sender must be a participant."""
        tid, members = self._require_thread(thread_id)
        aid = _name(sender, "sender")
        if aid not in members:
            raise InvalidArgument("sender not in thread")
        body = {"f": aid, "fi": None, "c": None, "ti": None, "t": tid, "x": check_content(content)}
        lseq, _op = self._write(KIND_MSG, _const_body(body))
        return lseq

    def poll(self, thread_id: str, after_seq: int = 0, limit: int = MAX_LIMIT) -> list[ThreadMessage]:
        """Thread messages with seq > ``after_seq``, in local arrival order."""
        tid, _ = self._require_thread(thread_id)
        after = check_count(after_seq, "after_seq")
        limit = check_count(limit, "limit", low=1, high=MAX_LIMIT)
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT lseq, id, sender, content, hlc FROM messages"
                " WHERE thread = ? AND lseq > ? ORDER BY lseq LIMIT ?",
                (tid, after, limit),
            ).fetchall()
        return [ThreadMessage(r[0], r[1], r[2], r[3], hlcmod.to_iso(r[4])) for r in rows]

    def mark_read(self, thread_id: str, agent_id: str, seq: int) -> None:
        """Mark every thread message with seq <= ``seq`` read for ``agent_id``."""
        tid, _ = self._require_thread(thread_id)
        aid = _name(agent_id, "agent id")
        upto = check_count(seq, "seq")
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT m.id, rc.delivered FROM messages m LEFT JOIN receipts rc"
                " ON rc.msg_id = m.id AND rc.role = ? AND rc.inst = ''"
                " WHERE m.thread = ? AND m.lseq <= ? AND rc.read IS NULL",
                (aid, tid, upto),
            ).fetchall()
        now = self._wall()
        writes: list[list[Any]] = []
        for mid, delivered in rows:
            writes.append(["rcpt", [mid, aid, ""], "r", now])
            if delivered is None:
                writes.append(["rcpt", [mid, aid, ""], "d", now])
        if writes:
            self._set(writes)

    def _read_counts(self, cur: Any, tid: str, aid: str) -> tuple[int, int, int, int, int | None]:
        row = cur.execute(
            "SELECT count(*), max(m.hlc),"
            " coalesce(max(CASE WHEN rc.read IS NOT NULL THEN m.lseq END), 0),"
            " coalesce(sum(rc.read IS NULL), 0),"
            " coalesce(sum(rc.read IS NULL AND m.sender != ?1), 0)"
            " FROM messages m LEFT JOIN receipts rc ON rc.msg_id = m.id AND rc.role = ?1 AND rc.inst = ''"
            " WHERE m.thread = ?2",
            (aid, tid),
        ).fetchone()
        return int(row[0]), int(row[2]), int(row[3]), int(row[4]), row[1]

    def has_unread(self, thread_id: str, agent_id: str) -> bool:
        """Whether the thread holds messages from others that ``agent_id`` has not read."""
        tid, _ = self._require_thread(thread_id)
        aid = _name(agent_id, "agent id")
        with self._store.read() as cur:
            return self._read_counts(cur, tid, aid)[3] > 0

    def get_thread_info(self, thread_id: str) -> ThreadInfo | None:
        tid = _name(thread_id, "thread id")
        with self._store.read() as cur:
            row = self._thread_row(cur, tid)
            if row is None:
                return None
            count, _c, _u, _o, latest = self._read_counts(cur, tid, "")
            latest_iso = hlcmod.to_iso(latest if latest is not None else row[1])
            return ThreadInfo(tid, self._members(cur, tid), count, latest_iso)

    def get_thread_read_state(self, thread_id: str, agent_id: str) -> ReadState | None:
        tid = _name(thread_id, "thread id")
        aid = _name(agent_id, "agent id")
        with self._store.read() as cur:
            if self._thread_row(cur, tid) is None:
                return None
            _count, cursor, unread, others, _l = self._read_counts(cur, tid, aid)
            return ReadState(cursor, unread, others)

    # -- sync surface ------------------------------------------------------------------

    def vector(self) -> dict[bytes, int]:
        """Origin key -> highest seq held contiguously."""
        with self._store.read() as cur:
            rows = cur.execute(f"SELECT node, {_CONTIG} AS c FROM origins WHERE c > 0", (self._self_oid,))
            return {bytes(r[0]): int(r[1]) for r in rows}

    def ops_missing(self, theirs: Mapping[bytes, int], byte_budget: int) -> Page:
        """The ops ``theirs`` lacks, in origin-seq order, paged by ``byte_budget``."""
        check_count(byte_budget, "byte_budget", low=1)
        ops: list[bytes] = []
        ranges: dict[bytes, tuple[int, int]] = {}
        used = 0
        more = False
        with self._store.read() as cur:
            rows = cur.execute(
                f"SELECT oid, node, {_CONTIG} AS c FROM origins WHERE c > 0 ORDER BY node", (self._self_oid,)
            ).fetchall()
            wanted = vector.missing_ranges({bytes(r[1]): int(r[2]) for r in rows}, theirs)
            oids = {bytes(r[1]): int(r[0]) for r in rows}
            for origin, (lo, hi) in wanted.items():
                if more:
                    break
                last = lo - 1
                for seq, blob in cur.execute(
                    "SELECT seq, blob FROM ops WHERE oid = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                    (oids[origin], lo, hi),
                ):
                    if ops and used + len(blob) > byte_budget:
                        more = True
                        break
                    ops.append(bytes(blob))
                    used += len(blob)
                    last = seq
                if last >= lo:
                    ranges[origin] = (lo, last)
                if last < hi:
                    more = True
        return Page(ops, ranges, more)

    def apply(self, raws: Sequence[bytes]) -> ApplyResult:
        """Verify every op not held yet, then store them; all-or-nothing per call.

        An op already held (same origin and seq) is skipped before its signature is
        checked: an op's identity is (origin, seq), and signature checks are most of the
        cost when two peers send the same backlog at once."""
        held = self._held(raws)
        decoded: list[Op] = []
        positions: list[int] = []
        for i, raw in enumerate(raws):
            if i in held:
                continue
            try:
                decoded.append(opsmod.decode(raw))
            except InvalidOp as exc:
                raise InvalidOp(exc.reason, index=i) from None
            positions.append(i)
        if not decoded:
            return ApplyResult(0, len(raws))
        new: list[int] = []
        new_index: list[int] = []
        new_oids: dict[bytes, int] = {}
        with self._store.write() as cur:
            touched: set[int] = set()
            for i, op in enumerate(decoded):
                oid = self._oids.get(op.origin) or new_oids.get(op.origin)
                if oid is None:
                    oid = new_oids[op.origin] = store.origin_id(cur, op.origin)
                lseq = store.store_op(cur, oid, op)
                if lseq is not None:
                    new.append(lseq)
                    new_index.append(positions[i])
                    touched.add(oid)
            for oid in touched:
                _advance(cur, oid)
            last = int(cur.execute("SELECT hlc FROM origins WHERE oid = ?", (self._self_oid,)).fetchone()[0])
            seen = max(op.hlc for op in decoded)
            cur.execute("UPDATE origins SET hlc = ? WHERE oid = ?",
                        (hlcmod.observe(last, seen, self._wall(), self._max_drift_ms), self._self_oid))
        self._oids.update(new_oids)
        if new:
            self._notify()
        return ApplyResult(len(new), len(raws) - len(new), new, new_index)

    def _held(self, raws: Sequence[bytes]) -> set[int]:
        """Positions of ops this replica already holds, judged by (origin, seq) alone."""
        ids = [opsmod.peek(raw) for raw in raws]
        wanted: dict[bytes, list[int]] = {}
        for origin_seq in ids:
            if origin_seq is not None:
                wanted.setdefault(origin_seq[0], []).append(origin_seq[1])
        have: set[tuple[bytes, int]] = set()
        with self._store.read() as cur:
            for origin, seqs in wanted.items():
                row = cur.execute("SELECT oid FROM origins WHERE node = ?", (origin,)).fetchone()
                if row is None:
                    continue
                lo, hi = min(seqs), max(seqs)
                have.update((origin, int(r[0])) for r in cur.execute(
                    "SELECT seq FROM ops WHERE oid = ? AND seq BETWEEN ? AND ?", (row[0], lo, hi)))
        return {i for i, x in enumerate(ids) if x is not None and x in have}

    def max_lseq(self) -> int:
        with self._store.read() as cur:
            return int(cur.execute("SELECT coalesce(max(lseq), 0) FROM ops").fetchone()[0])

    def ops_after(self, lseq: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        """Ops that landed here after local position ``lseq``, oldest first."""
        with self._store.read() as cur:
            rows = cur.execute("SELECT lseq, blob FROM ops WHERE lseq > ? ORDER BY lseq LIMIT ?", (lseq, limit))
            return [(int(r[0]), bytes(r[1])) for r in rows]

    def local_ops_after(self, lseq: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        """This node's own ops (written by any process on this replica) after ``lseq``."""
        with self._store.read() as cur:
            rows = cur.execute(
                "SELECT lseq, blob FROM ops WHERE lseq > ? AND oid = ? ORDER BY lseq LIMIT ?",
                (lseq, self._self_oid, limit),
            )
            return [(int(r[0]), bytes(r[1])) for r in rows]

    def clock(self) -> int:
        """The persisted HLC high-water mark."""
        with self._store.read() as cur:
            return int(cur.execute(_LAST_OWN, (self._self_oid,)).fetchone()[1] or 0)

    def state_digest(self) -> str:
        """A hash of the replicated state (messages and LWW registers), not local order."""
        h = hashlib.blake2b(digest_size=16)
        with self._store.read() as cur:
            for row in cur.execute(
                "SELECT id, sender, sender_inst, channel, to_inst, thread, content, hlc FROM messages ORDER BY id"
            ):
                h.update(msgpack.packb(list(row), use_bin_type=True))
            for row in cur.execute("SELECT tbl, k, f, v, hlc, origin FROM lww ORDER BY tbl, k, f"):
                h.update(msgpack.packb(list(row), use_bin_type=True))
        return h.hexdigest()

    def stats(self) -> dict[str, int]:
        with self._store.read() as cur:

            def one(sql: str) -> int:
                return int(cur.execute(sql).fetchone()[0])

            return {
                "ops": one("SELECT count(*) FROM ops"),
                "messages": one("SELECT count(*) FROM messages"),
                "receipts": one("SELECT count(*) FROM receipts"),
                "profiles": one("SELECT count(*) FROM profiles"),
                "origins": len(self.vector()),
                "max_lseq": one("SELECT coalesce(max(lseq), 0) FROM ops"),
            }

    def integrity_check(self) -> str:
        with self._store.read() as cur:
            return str(cur.execute("PRAGMA integrity_check").fetchone()[0])


def _message_by_id(cur: Any, mid: str) -> Any:
    """(sender, sender_inst, channel, to_inst, thread) of a message, found via its origin and seq."""
    parsed = opsmod.parse_message_id(mid)
    if parsed is None:
        return None
    prefix, seq = parsed
    return cur.execute(
        "SELECT m.sender, m.sender_inst, m.channel, m.to_inst, m.thread FROM origins o"
        " JOIN ops m ON m.oid = o.oid AND m.seq = ? WHERE substr(o.node, 1, ?) = ? AND m.id = ?",
        (seq, len(prefix), prefix, mid),
    ).fetchone()


def _advance(cur: Any, oid: int) -> None:
    """Move an origin's contiguous mark over every seq now held, and its top."""
    contig = int(cur.execute("SELECT contig FROM origins WHERE oid = ?", (oid,)).fetchone()[0])
    held = [r[0] for r in cur.execute("SELECT seq FROM ops WHERE oid = ? AND seq > ? ORDER BY seq", (oid, contig))]
    top = max(held, default=contig)
    cur.execute(
        "UPDATE origins SET contig = ?, top = max(top, ?) WHERE oid = ?",
        (vector.contiguous(contig, held), top, oid),
    )
