"""Leaving no content on disk: once a message is retracted (by its sender role, or by a removal above
its node's cutoff) its text is found in none of the replica's files, the main file, the ``-wal`` file
and the search index included; SQL shell only, the daemon drives it off the write path.

Invariants:
* Every connection runs with ``secure_delete`` on (``replica.store``): a cell deleted or rewritten, and a
  page freed, holds zeros where the text was. The write that drops content (``project.settle_retraction``,
  ``fleetstore.retract_above``) also empties the op's signed bytes and marks the replica here, in its own
  transaction.
* The search index (contentless FTS5) keeps a deleted entry's terms until its segments are merged whole
  (this SQLite has no FTS5 ``secure-delete``): ``step`` merges it in bounded steps (``MERGE_PAGES`` pages
  each, its own short write transaction), then copies the WAL into the main file and truncates it.
* The checkpoint never waits (busy timeout 0): a reader of another connection or process that still
  needs older WAL frames makes it fail, the mark stays, and a later step retries (``BLOCKED``). A mark
  is cleared only by the step that saw it, so a retraction that lands meanwhile is never forgotten.
"""

from __future__ import annotations

import sqlite3

FTS_META = "scrub_search"  # a generation: set when a retraction deleted a search entry
WAL_META = "scrub_wal"  # a generation: set when a retraction dropped content the WAL may still hold
SEARCH_GONE_META = "purge_search_gone"  # ``replica.purge``'s count of deleted entries since a whole merge
MERGE_PAGES = 256  # about 40 ms of merging a step on a large index (docs/data-model.md)

DONE, MORE, BLOCKED = "done", "more", "blocked"


def mark(cur: sqlite3.Cursor, *, search: bool) -> None:
    """Note, in the transaction that dropped content, that the files are to be scrubbed (and the
    search index merged, when an entry was deleted from it)."""
    keys = (FTS_META, WAL_META) if search else (WAL_META,)
    cur.executemany("INSERT INTO meta(k, v) VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET v = v + 1",
                    [(k,) for k in keys])


def pending(cur: sqlite3.Cursor) -> tuple[int | None, int | None]:
    """(search generation, WAL generation) still to be scrubbed; None when not."""
    got = dict(cur.execute("SELECT k, v FROM meta WHERE k IN (?, ?)", (FTS_META, WAL_META)).fetchall())
    return got.get(FTS_META), got.get(WAL_META)


def merge_step(cur: sqlite3.Cursor, generation: int, pages: int = MERGE_PAGES) -> bool:
    """One bounded step of merging the search index whole; True while there is more to merge. The
    last step clears the mark it was given (and ``replica.purge``'s count of deleted entries)."""
    before = cur.connection.total_changes
    cur.execute("INSERT INTO message_fts(message_fts, rank) VALUES ('merge', ?)", (-pages,))
    if cur.connection.total_changes - before >= 2:  # FTS5's sign that the step merged something
        return True
    cur.execute("DELETE FROM meta WHERE k = ? AND v = ?", (FTS_META, generation))
    cur.execute("UPDATE meta SET v = 0 WHERE k = ? AND v > 0", (SEARCH_GONE_META,))
    return False


def clear_wal(cur: sqlite3.Cursor, generation: int) -> None:
    cur.execute("DELETE FROM meta WHERE k = ? AND v = ?", (WAL_META, generation))
