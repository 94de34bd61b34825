"""Replica files as an older peerd wrote them (schema v2), for upgrade tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from replica import ops, schema


def write_v2_file(path: Path, raws: list[bytes]) -> None:
    """A file at schema v2 holding ``raws`` in that arrival order: ops with their message columns,
    names as written, routes under the roles as written, and projections left empty or stale (a
    stale receipt and profile keyed by the names as written), which the upgrade must rebuild."""
    conn = sqlite3.connect(path, isolation_level=None)
    for script in (schema.SCHEMA_V1, schema.SCHEMA_V2):
        for stmt in script.split(";"):
            if stmt.strip():
                conn.execute(stmt)
    conn.execute("INSERT INTO meta(k, v) VALUES ('schema_version', 2)")
    oids: dict[bytes, int] = {}
    for raw in raws:
        op = ops.decode(raw)
        oid = oids.setdefault(op.origin, len(oids) + 1)
        conn.execute("INSERT OR IGNORE INTO origins(oid, node) VALUES (?, ?)", (oid, op.origin))
        conn.execute("UPDATE origins SET contig = max(contig, ?), top = max(top, ?) WHERE oid = ?",
                     (op.seq, op.seq, oid))
        if op.kind == ops.KIND_MSG:
            b = op.body
            conn.execute(
                "INSERT INTO ops(oid, seq, blob, id, sender, sender_inst, channel, to_inst, thread, content, hlc)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (oid, op.seq, raw, ops.message_id(op.origin, op.seq), b["f"], b["fi"], b["c"], b["ti"], b["t"],
                 b["x"], op.hlc))
            roles = [r.strip() for r in (b["c"] or "").split(",")]
            if len(roles) > 1:
                conn.executemany("INSERT INTO routes(role, lseq) VALUES (?, last_insert_rowid())", [(r,) for r in roles])
        else:
            conn.execute("INSERT INTO ops(oid, seq, blob, hlc) VALUES (?, ?, ?, ?)", (oid, op.seq, raw, op.hlc))
    conn.execute("INSERT INTO receipts VALUES ('0000000000000000-1', 'TAU', '', 'stale', 5, NULL)")
    conn.execute("INSERT INTO profiles VALUES ('Delta', 'stale', 'old text', NULL, 1)")
    conn.close()


def downgrade_to_v2(path: Path) -> None:
    """Rewrite the replica file at ``path`` as schema v2 with the same ops, in the same arrival order."""
    downgrade(path, 2)


def downgrade(path: Path, version: int) -> None:
    """Rewrite the replica file at ``path`` as schema ``version`` (2, 3 or 4: before name keys) with
    the same ops in the same arrival order, each later migration run as it ran then."""
    with sqlite3.connect(path) as conn:
        raws = [bytes(r[0]) for r in conn.execute("SELECT blob FROM ops ORDER BY lseq")]
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    write_v2_file(path, raws)
    with sqlite3.connect(path) as conn:
        for script in schema.MIGRATIONS[2:version]:
            conn.executescript(script)
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (version,))
    conn.close()


def undo_roles_seen(conn: sqlite3.Connection) -> None:
    """Take back schema v14 (``SCHEMA_ROLES_SEEN``) on an open file: first-seen times alone (a
    forgotten role's row goes), no standing, no read sightings."""
    conn.execute("CREATE TABLE first_seen_v13(role TEXT PRIMARY KEY, at INTEGER NOT NULL) WITHOUT ROWID")
    conn.execute("INSERT INTO first_seen_v13 SELECT role, at FROM first_seen WHERE at IS NOT NULL")
    conn.execute("DROP TABLE first_seen")
    conn.execute("ALTER TABLE first_seen_v13 RENAME TO first_seen")
    conn.execute("DROP TABLE seen_reads")


def undo_members(conn: sqlite3.Connection) -> None:
    """Take back schema v13 (``SCHEMA_MEMBERS``) on an open file: rekeys listed in ``fleet_rekeys``
    again, and no list of every membership op nor of the nodes let in."""
    conn.execute("CREATE TABLE fleet_rekeys(origin BLOB NOT NULL, seq INTEGER NOT NULL, lseq INTEGER NOT NULL,"
                 " PRIMARY KEY(origin, seq)) WITHOUT ROWID")
    conn.execute("INSERT INTO fleet_rekeys SELECT origin, seq, lseq FROM fleet_ops WHERE kind = 'rekey'")
    conn.execute("DROP TABLE fleet_ops")
    conn.execute("DROP TABLE fleet_members")
