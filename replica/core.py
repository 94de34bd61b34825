"""The part of a replica every area shares: its store, its identity, its
listeners, and the one path by which a local change becomes a signed op.

Invariants:
* Every change is one signed op written in one transaction together with its
  projections (``_write``); a call that raises has written nothing. An op in the name of a role
  pinned to other nodes is refused there (``RolePinned``), judged as peers judge it.
* What a retraction dropped leaves the files by ``scrub`` (``replica.scrub``): short steps, the
  checkpoint never waiting for a reader; the daemon runs the steps a retraction left over.
* This node's seq and clock come from its newest op, read inside the write
  transaction, so own seqs stay contiguous across processes sharing the file;
  never below the floor a purge of own ops leaves in ``origins`` (``top``, ``hlc``).
* Listeners are called after the commit, from the writing thread, and only
  when new ops were stored. A mark listener (the change feed's) is also handed the newest local
  position when the writer knows it (a local op: the position it was stored at, the newest while
  the write lock was held), else None.
* A remembered read (``_remembered``) is answered again only while the file's version is the one
  it was read at: never an answer older than the last commit, by any process. A writer that knows
  exactly what its own commit changed in a read may remember the new answer under the version
  right after that commit (a send: its sender among the known roles).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Self, TypeVar, cast

from replica import firstseen, pins, pinstore, project, routing, scrub, store
from replica import hlc as hlcmod
from replica import identity as idmod
from replica import ops as opsmod
from replica.checks import check_count, chunks
from replica.errors import InvalidArgument, InvalidOp, RolePinned
from replica.ops import KIND_MSG, KIND_SET, MAX_WRITES_PER_OP, Op
from replica.store import Store

T = TypeVar("T")

Listener = Callable[[], None]
MarkListener = Callable[[int | None], None]
BodyMaker = Callable[[int, int], dict[str, Any]]

# This node's own seq and clock come from its newest op (no extra row to update per write):
# own ops are always contiguous because each takes the next seq inside the write transaction.
# ``top`` is the floor a purge leaves when it deletes own ops (``replica.purge``): seqs never go back.
# The third column is the last op's arrival time (``store.arrival_time``), read in the same step.
LAST_OWN = (
    "SELECT max(coalesce((SELECT seq FROM ops WHERE oid = ?1 ORDER BY seq DESC LIMIT 1), 0), top),"
    " max(coalesce((SELECT hlc FROM ops WHERE oid = ?1 ORDER BY seq DESC LIMIT 1), 0), hlc),"
    " (SELECT arrived FROM ops ORDER BY lseq DESC LIMIT 1)"
    " FROM origins WHERE oid = ?1"
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso(ms: int | None) -> str | None:
    """A wall-clock time in Unix ms as the API shows times (None stays None)."""
    return None if ms is None else hlcmod.to_iso(hlcmod.pack(ms))


def read_writes(key: list[str], delivered: int | None, now: int) -> list[list[Any]]:
    """The register writes that record a receipt read at ``now`` (and delivered, if it was not)."""
    writes: list[list[Any]] = [["rcpt", key, "r", now]]
    return writes if delivered is not None else [*writes, ["rcpt", key, "d", now]]


def const_body(body: dict[str, Any]) -> BodyMaker:
    return lambda _seq, _hlc: body


def _check_pins(cur: Any, kind: str, body: dict[str, Any], me: bytes, at: tuple[int, int]) -> None:
    """Refuse, before it is written, an op in the name of a role pinned to other nodes (``at``: its
    seq and stamp)."""
    bar = pinstore.admits(cur, kind, body, me, seq=at[0], hlc=at[1])
    if bar is not None:
        raise RolePinned(bar.role, tuple(sorted(bar.nodes)),
                         pins.refusal(bar.role, bar.nodes, pinstore.node_names(cur)))


class ReplicaCore:
    """Store, identity and the write path; the areas of ``Replica`` build on it."""

    def __init__(self, st: Store, ident: idmod.Identity, *, wall: Callable[[], int] = now_ms,
                 max_drift_ms: int = hlcmod.DEFAULT_MAX_DRIFT_MS,
                 broadcast_history_ms: int = routing.DEFAULT_BROADCAST_HISTORY_MS) -> None:
        if not isinstance(broadcast_history_ms, int) or isinstance(broadcast_history_ms, bool) \
                or broadcast_history_ms < 0:
            raise InvalidArgument("broadcast_history_ms must be an integer >= 0")
        self._store = st
        self._ident = ident
        self._wall = wall
        self._max_drift_ms = max_drift_ms
        self._broadcast_history_ms = broadcast_history_ms
        self._listeners: list[tuple[Listener | MarkListener, bool]] = []  # (listener, handed the mark)
        self._listen_lock = threading.Lock()
        self._oids: dict[bytes, int] = {}  # origin key -> row id, for apply
        self._floors: dict[tuple[str, str | None, int], int] = {}  # inbox floors, see Messaging._inbox_rows
        self._reads: dict[str, tuple[tuple[int, int], Any]] = {}  # see _remembered
        with st.write() as cur:
            self._self_oid = store.origin_id(cur, ident.public_key)

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def no_wait(self) -> AbstractContextManager[None]:
        """A block whose replica calls never wait for a lock: ``WouldWait`` instead, before anything
        is committed (``Store.no_wait``). For a caller that would rather run the call elsewhere than
        wait where it is (an event loop)."""
        return self._store.no_wait()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener()`` (from the writing thread) after each commit of new ops."""
        with self._listen_lock:
            self._listeners.append((listener, False))

    def add_mark_listener(self, listener: MarkListener) -> None:
        """``add_listener``, with ``listener(mark)`` handed the newest local position when the
        writer knows it (a local write), else None (then it is ``max_lseq()``, to be read)."""
        with self._listen_lock:
            self._listeners.append((listener, True))

    def remove_listener(self, listener: Listener | MarkListener) -> None:
        with self._listen_lock:
            for entry in self._listeners:
                if entry[0] == listener:
                    self._listeners.remove(entry)
                    return

    def _notify(self, mark: int | None = None) -> None:
        with self._listen_lock:
            listeners = list(self._listeners)
        for cb, with_mark in listeners:
            if with_mark:
                cast(MarkListener, cb)(mark)
            else:
                cast(Listener, cb)()

    def _remembered(self, name: str, read: Callable[[], T]) -> T:
        """``read()``, or what it returned last time when nothing has been committed to the file
        since (``Store.version``: by any connection). The version is taken before the read, so a
        commit during it only makes the next call read again. What is returned is shared: callers
        only read it."""
        version = self._store.version()
        hit = self._reads.get(name)
        if hit is not None and hit[0] == version:
            return cast(T, hit[1])
        value = read()
        self._reads[name] = (version, value)
        return value

    # -- writing ops ----------------------------------------------------------------

    def _write(self, kind: str, make_body: BodyMaker) -> tuple[int, Op]:
        """Create, sign and store one local op; ``make_body(seq, hlc)`` builds its body."""
        lseq, op, _after = self._write_then(kind, make_body, None)
        return lseq, op

    def _write_then(self, kind: str, make_body: BodyMaker, after: Callable[[sqlite3.Cursor, Op], T] | None,
                    before: Callable[[sqlite3.Cursor], object] | None = None) -> tuple[int, Op, T | None]:
        """``_write`` with ``before(cur)`` run first and ``after(cur, op)`` (a read-back of what the op
        stored) last, in the same transaction: one lock and one commit for a write and its answer."""
        with self._store.write() as cur:
            if before is not None:
                before(cur)
            top, last, arrived = cur.execute(LAST_OWN, (self._self_oid,)).fetchone()
            seq = int(top or 0) + 1
            now = self._wall()  # one reading: a local op arrives when it is created
            stamp = hlcmod.tick(int(last or 0), now)
            body = make_body(seq, stamp)
            _check_pins(cur, kind, body, self.node_key, (seq, stamp))
            if kind != KIND_MSG:  # message bodies are built from arguments checked by the caller
                try:
                    opsmod.validate_body(kind, body)
                except InvalidOp as exc:
                    raise InvalidArgument(exc.reason) from None
            raw = opsmod.encode(self.node_key, seq, stamp, kind, body, sign=self._ident.sign)
            if len(raw) > opsmod.MAX_OP_BYTES:  # peers would refuse it, and sync would stall on it
                raise InvalidArgument(f"the change is {len(raw)} bytes as an op; the limit is {opsmod.MAX_OP_BYTES}")
            op = opsmod.local_op(self.node_key, seq, stamp, kind, body, raw=raw)
            lseq = project.store_op(cur, self._self_oid, op, max(now, int(arrived or 0)))
            assert lseq is not None
            extra = None if after is None else after(cur, op)
        self._notify(lseq)
        return lseq, op, extra

    # -- leaving no retracted content on disk ------------------------------------------

    def scrub_step(self, pages: int = scrub.MERGE_PAGES) -> str:
        """One step of leaving no retracted content on disk (``replica.scrub``): a bounded merge of
        the search index (``MORE``), then a checkpoint that empties the WAL without waiting (``DONE``;
        ``BLOCKED`` while another connection still reads older frames: try again later)."""
        pages = check_count(pages, "pages", low=1)
        with self._store.read() as cur:
            search, wal = scrub.pending(cur)
        if search is not None:
            with self._store.write() as cur:
                scrub.merge_step(cur, search, pages)
            return scrub.MORE
        if wal is None:
            return scrub.DONE
        with self._store.write() as cur:
            scrub.clear_wal(cur, wal)
        if self._store.truncate_wal():
            return scrub.DONE
        with self._store.write() as cur:
            scrub.mark(cur, search=False)
        return scrub.BLOCKED

    def scrub(self, steps: int | None = None) -> str:
        """``scrub_step`` until it is done or blocked, or ``steps`` steps were taken; the last state."""
        taken, state = 0, scrub.MORE
        while state == scrub.MORE and (steps is None or taken < steps):
            state, taken = self.scrub_step(), taken + 1
        return state

    def _first_seen(self, role: str, now: int) -> tuple[int, list[list[Any]]]:
        """When ``role`` was first seen in the fleet (about ``now`` if never), and the write that
        records it when this is the first time (``replica.firstseen``)."""
        with self._store.read() as cur:
            first = firstseen.lookup(cur, role)
            at = now if first is not None else firstseen.new_sighting(cur, role, now)
        return (first, []) if first is not None else (at, [firstseen.write(role, at)])

    def _broadcast_floor(self, first_seen_ms: int) -> int:
        """The HLC below which broadcasts are not in the inbox of a role first seen then."""
        return hlcmod.pack(routing.broadcast_floor(first_seen_ms, self._broadcast_history_ms))

    def _set(self, writes: list[list[Any]]) -> None:
        """Write LWW registers ([table, key, field, value] each), as few ops as the size cap allows."""
        for chunk in chunks(writes, MAX_WRITES_PER_OP):
            self._write(KIND_SET, const_body({"w": chunk}))
