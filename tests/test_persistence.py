"""Persistence: close/reopen keeps everything; several processes share one replica file."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from replica import Replica, StoreError, check_file, open_home, schema
from replica.store import Store
from tests.oldfiles import downgrade


def test_reopen_keeps_messages_receipts_identity_and_clock(tmp_path: Path) -> None:
    """After close and reopen: same node id, messages, receipts, vector, and a clock that only moves on."""
    with open_home(tmp_path) as r:
        node = r.node_id
        sent = r.send_message("a", "b", "persist me")
        rid = r.check_messages("b").messages[0].receipt_id
        r.mark_as_read([rid])
        r.update_profile("p", name="P")
        digest, vec, clock = r.state_digest(), r.vector(), r.clock()
    with open_home(tmp_path) as r:
        assert r.node_id == node
        assert (r.state_digest(), r.vector()) == (digest, vec)
        assert r.message_status(sent.id)[0].read_at is not None
        r.send_message("a", "b", "after reopen")
        assert r.clock() > clock
        assert r.vector()[r.node_key] == vec[r.node_key] + 1


def test_replica_file_uses_wal(tmp_path: Path) -> None:
    """The replica runs in WAL mode so readers and writers in other processes don't block each other."""
    with open_home(tmp_path):
        mode = sqlite3.connect(tmp_path / "replica.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    """A replica written by a newer peerd is refused with a clear error instead of being damaged."""
    Replica.open(tmp_path / "r.db").close()
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute("UPDATE meta SET v = 99 WHERE k = 'schema_version'")
    con.commit()
    con.close()
    before = (tmp_path / "r.db").read_bytes()
    with pytest.raises(StoreError, match=r"written by a newer peerd \(replica schema v99; this peerd reads up to"):
        Store(tmp_path / "r.db")
    assert (tmp_path / "r.db").read_bytes() == before


def test_corrupt_key_file_is_a_clear_error(tmp_path: Path) -> None:
    """A damaged node key is reported as such, not as a crash."""
    (tmp_path / "node.key").write_text("zz-not-hex")
    with pytest.raises(StoreError, match="node key file"):
        open_home(tmp_path)


def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    """A file that is not SQLite gives StoreError, never a raw sqlite3 exception."""
    (tmp_path / "replica.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open replica"):
        open_home(tmp_path)


WRITER = """
import sys
from pathlib import Path
from replica import open_home
home, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with open_home(home) as r:
    for i in range(n):
        r.send_message(tag, "sink", f"{tag}-{i}")
        if i % 10 == 0:
            r.check_messages("sink", tag)
"""


def test_four_processes_write_one_replica(tmp_path: Path) -> None:
    """Four processes writing one file at once: every message present, seqs unique and gap-free."""
    n = 150
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), f"w{k}", str(n)])
        for k in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    with open_home(tmp_path) as r:
        contents = {m.content for m in r.check_messages("sink", "auditor", limit=1000).messages}
        assert contents == {f"w{k}-{i}" for k in range(4) for i in range(n)}
        ops = r.stats()["ops"]
        assert r.vector() == {r.node_key: ops}  # seqs 1..ops, no gap, no duplicate
        assert r.integrity_check() == "ok"
    con = sqlite3.connect(tmp_path / "replica.db")
    seqs = [row[0] for row in con.execute("SELECT seq FROM ops ORDER BY seq")]
    assert seqs == list(range(1, ops + 1))


def test_v1_replica_is_migrated_forward(tmp_path: Path) -> None:
    """A replica written at schema v1 opens with the newest schema, keeping its messages searchable."""
    db = tmp_path / "replica.db"
    con = sqlite3.connect(db)
    con.executescript(schema.SCHEMA_V1 + "INSERT INTO meta(k, v) VALUES ('schema_version', 1);")
    con.close()
    with Replica.open(db) as r:
        r.send_message("a", "b", "migrated and searchable")
        assert [h.content for h in r.search_messages("searchable")] == ["migrated and searchable"]
    version = sqlite3.connect(db).execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()[0]
    assert int(version) == schema.LATEST


def test_v3_replica_learns_first_seen_times_from_its_messages(tmp_path: Path) -> None:
    """Migrating to v4 gives every role that has sent a message the time of its first message,
    as a replica syncing the same ops would compute."""
    db = tmp_path / "replica.db"
    clock = [1_800_000_000_000]
    with Replica.open(db, wall=lambda: clock[0]) as r:
        r.send_message("lead", "broadcast", "kickoff")
        clock[0] += 10 * 86_400_000
        r.send_message("lead", "ops", "later")
        r.send_message("ops", "lead", "ok")
        expected = r.state_digest()
    downgrade(db, 3)  # what a v3 file holds: no first_seen table (and no name keys)
    with Replica.open(db, wall=lambda: clock[0] + 60 * 86_400_000) as r:
        assert r.state_digest() == expected
        assert [m.content for m in r.check_messages("lead").messages] == ["ok"]
        assert [m.content for m in r.check_messages("ops").messages] == ["later"]  # kickoff: 10 days before


OPENER = """
import sys
from pathlib import Path
from replica import open_home
with open_home(Path(sys.argv[1])) as r:
    r.send_message("opener", "sink", "hello")
    print(r.node_id)
"""


def test_many_processes_creating_one_home_at_once_agree() -> None:
    """Eight processes opening a brand-new home together all succeed and share one node key."""
    for _ in range(12):  # the race window is small: try several fresh homes
        home = Path(tempfile.mkdtemp())
        procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(home)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for _ in range(8)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 8, [e.decode()[-400:] for _, e in outs]
        assert len({o.strip() for o, _ in outs}) == 1


def test_lost_database_retires_the_old_key(tmp_path: Path) -> None:
    """A home whose replica.db is gone but whose key is old starts as a new node, so it never
    reuses seqs its peers already hold (those writes would be ignored everywhere)."""
    with open_home(tmp_path) as r:
        old = r.node_id
        r.send_message("a", "b", "before the loss")
    for name in ("replica.db", "replica.db-wal", "replica.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    stale = time.time() - 3600
    os.utime(tmp_path / "node.key", (stale, stale))
    with open_home(tmp_path) as r:
        assert r.node_id != old
    assert len(list(tmp_path.glob("node.key.retired-*"))) == 1


def test_fresh_key_without_database_is_kept(tmp_path: Path) -> None:
    """A key created moments ago (another process is creating the database) is not retired."""
    with open_home(tmp_path) as r:
        node = r.node_id
    (tmp_path / "replica.db").unlink()
    with open_home(tmp_path) as r:
        assert r.node_id == node


def test_check_file_looks_without_writing(tmp_path: Path) -> None:
    """check_file reports soundness and counts of a replica file and leaves the file as it was."""
    path = tmp_path / "replica.db"
    with Replica.open(path) as r:
        r.send_message("a", "b", "hi")
    before = path.read_bytes()
    found = check_file(path)
    assert (found.result, found.messages, found.ops) == ("ok", 1, 1)
    assert path.read_bytes() == before
    with pytest.raises(StoreError):
        check_file(tmp_path / "missing.db")
