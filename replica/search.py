"""Full-text search and who sent last: projections kept off the write path.

Invariants:
* ``message_fts`` and ``senders`` hold exactly the messages with
  ``lseq <= meta.fts_upto``; a reader catches them up first (``catch_up``),
  so a query never misses a message that has landed.
* Catching up runs in short write transactions of ``step`` ops, so other
  writers interleave with a long backlog.
* A query's words are matched as plain words (``checks.fts_query``): no FTS
  operator reaches SQLite from a caller.
* A retracted message is never indexed, and retracting an indexed one removes
  its entry (``project.settle_retraction``); search never returns one.
* Filters match names by key (``names.name_key``).
* What a retraction dropped leaves the index too: ``ReplicaCore.scrub_step`` merges it whole
  (``replica.scrub``).
"""

from __future__ import annotations

from replica import hlc as hlcmod
from replica import routing
from replica.checks import DEFAULT_LIMIT, MAX_LIMIT, check_count, check_limit, check_name, check_since, fts_query
from replica.core import ReplicaCore
from replica.mailbox import NODE_COLUMNS, node_hex
from replica.messaging import check_session_day
from replica.models import SearchHit, SenderSeen
from replica.names import name_key

# ?4: messages routed to this role key; ?6: messages whose channel key is exactly this one.
_SEARCH = (
    f"SELECT m.id, m.lseq, m.sender, m.sender_inst, m.channel, m.thread, m.content, m.hlc, m.sday, m.tenant,"
    f" {NODE_COLUMNS} FROM message_fts f JOIN ops m ON m.lseq = f.rowid"
    " WHERE message_fts MATCH ?1 AND m.lseq > ?2 AND (?3 IS NULL OR m.skey = ?3)"
    " AND (?4 IS NULL OR m.ckey = ?4 OR m.ckey = 'broadcast'"
    "      OR EXISTS (SELECT 1 FROM routes r WHERE r.role = ?4 AND r.lseq = m.lseq))"
    " AND (?6 IS NULL OR m.ckey = ?6) AND (?7 IS NULL OR m.sday = ?7) AND (?8 IS NULL OR m.tenant = ?8)"
    " AND m.retracted IS NULL"
    " ORDER BY f.rank LIMIT ?5"
)
_INDEX_MESSAGES = (
    "INSERT INTO message_fts(rowid, content, sender, channel)"
    " SELECT lseq, content, sender, coalesce(channel, thread) FROM ops"
    " WHERE lseq > ? AND lseq <= ? AND id IS NOT NULL AND retracted IS NULL"
)
_INDEX_SENDERS = (
    "INSERT INTO senders(rkey, ikey, role, inst, hlc)"
    " SELECT skey, sikey, sender, sender_inst, max(hlc) FROM ops"
    " WHERE lseq > ? AND lseq <= ? AND id IS NOT NULL AND thread IS NULL"
    " GROUP BY skey, sikey"
    " ON CONFLICT(rkey, ikey) DO UPDATE SET hlc = max(hlc, excluded.hlc)"
)
_UPTO = "SELECT v FROM meta WHERE k = 'fts_upto'"
_NEWEST = "SELECT coalesce(max(lseq), 0) FROM ops"


class Search(ReplicaCore):
    def search_messages(self, query: str, *, from_: str | None = None, channel: str | None = None,
                        since: int | None = None, limit: int = DEFAULT_LIMIT, exact_channel: str | None = None,
                        session_day: int | None = None, tenant_id: str | None = None,
                        prefix: bool = False) -> list[SearchHit]:
        """Messages matching every word of ``query`` (best match first), optionally only from
        one sender, routed to one role (``channel``: direct, in a list, or broadcast), sent on
        exactly one channel (``exact_channel``), of one session day or tenant, or after local
        position ``since``. With ``prefix`` the last word also matches as a prefix."""
        match = fts_query(query, prefix_last=prefix)
        sender = _key(check_name(from_, "from", optional=True))
        role = _key(check_name(channel, "channel", optional=True))
        exact = check_name(exact_channel, "channel", optional=True)
        args = (match, check_since(since), sender, role, check_limit(limit),
                None if exact is None else routing.channel_key(exact), check_session_day(session_day),
                _key(check_name(tenant_id, "tenantId", optional=True)))
        self.catch_up()
        with self._store.read() as cur:
            rows = cur.execute(_SEARCH, args).fetchall()
        return [SearchHit(r[0], r[1], r[2], r[3], r[4], r[5], r[6], hlcmod.to_iso(r[7]), r[8], r[9], node_hex(r[10]),
                          r[11]) for r in rows]

    def recent_senders(self, limit: int = MAX_LIMIT) -> list[SenderSeen]:
        """Every (role, instance) that has sent a message, most recently active first."""
        limit = check_limit(limit)
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
            if int(cur.execute(_NEWEST).fetchone()[0]) <= int(cur.execute(_UPTO).fetchone()[0]):
                return False
        with self._store.write() as cur:
            lo = int(cur.execute(_UPTO).fetchone()[0])
            newest = int(cur.execute(_NEWEST).fetchone()[0])
            hi = min(lo + step, newest)
            cur.execute(_INDEX_MESSAGES, (lo, hi))
            cur.execute(_INDEX_SENDERS, (lo, hi))
            cur.execute("UPDATE meta SET v = ? WHERE k = 'fts_upto'", (hi,))
        return hi < newest


def _key(name: str | None) -> str | None:
    return None if name is None else name_key(name)
