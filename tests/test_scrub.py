"""Retracted text leaves the disk: after a retraction, or a removal that retracts a node's messages
above its cutoff, a unique marker in the message is found in none of the replica's files (the main
file, ``-wal``, ``-shm``), the search index included; a reader holding the WAL delays the checkpoint
(the scrub says ``blocked`` and keeps its mark), and the next step once it has finished completes it.
Real SQLite files throughout."""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path

import pytest

from replica import Replica, project, scrub
from tests.conftest import pull
from tests.daemons import Fleet, read_only, wait_until

pytest_plugins = ["tests.daemons"]


def marker() -> str:
    return f"zq{uuid.uuid4().hex}"  # one token for the search index, found nowhere else


def traces(db: Path, text: str) -> dict[str, int]:
    """How often ``text`` appears in each file of the replica at ``db`` (as UTF-8 bytes)."""
    found = {}
    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db}{suffix}")
        found[suffix or "db"] = path.read_bytes().count(text.encode()) if path.exists() else 0
    return found


CLEAN = {"db": 0, "-wal": 0, "-shm": 0}


def busy(r: Replica, messages: int = 200) -> None:
    """Enough messages that the search index has several segments (merged by the scrub)."""
    for i in range(messages):
        r.send_message("alice", "bob", f"filler number {i} with some words to index")
        if i % 50 == 0:
            r.catch_up()


def test_a_retracted_message_leaves_no_trace_in_any_file(tmp_path: Path) -> None:
    db = tmp_path / "replica.db"
    r = Replica.open(db)
    busy(r)
    text = marker()
    mid = r.send_message("alice", "bob", f"the password is {text}").id
    r.catch_up()
    assert [h.id for h in r.search_messages(text)] == [mid]
    assert sum(traces(db, text).values()) > 0  # (the check can fail: the text is there before)
    r.retract_message(mid, "alice")
    assert traces(db, text) == CLEAN
    with r._store.read() as cur:
        assert scrub.pending(cur) == (None, None)
        assert cur.execute("SELECT length(blob), content FROM ops WHERE id = ?", (mid,)).fetchone() == (0, None)
    assert r.get_message(mid).retracted is not None and r.search_messages(text) == []
    r.close()
    assert traces(db, text) == CLEAN


def test_a_retraction_from_a_peer_is_scrubbed_by_the_next_step(tmp_path: Path) -> None:
    """A retraction that arrives by sync marks the replica; ``scrub`` (the daemon's indexer runs it)
    leaves no trace; a peer that never held the message gets the range, never the text."""
    a, b = Replica.open(tmp_path / "a.db"), Replica.open(tmp_path / "b.db")
    busy(a, 60)
    text = marker()
    mid = a.send_message("alice", "bob", text).id
    pull(b, a)
    b.catch_up()
    a.retract_message(mid, "alice")
    pull(b, a)
    assert b.get_message(mid).content is None
    assert b.scrub() == scrub.DONE
    assert traces(tmp_path / "b.db", text) == CLEAN
    late = Replica.open(tmp_path / "late.db")
    pull(late, a)
    assert late.vector() == a.vector()
    assert traces(tmp_path / "late.db", text) == CLEAN
    assert late.state_digest() == a.state_digest() == b.state_digest()


def test_a_removal_leaves_no_trace_of_the_removed_nodes_retracted_messages(tmp_path: Path) -> None:
    """b holds, indexed, a message x wrote after the cutoff a's removal gives it: when the removal
    reaches b the message is retracted there, and its text leaves b's files."""
    a, b, x = (Replica.open(tmp_path / f"{n}.db") for n in "abx")
    busy(b, 60)
    x.send_message("x", "team", "kept words")
    pull(a, x)
    text = marker()
    x.send_message("x", "team", f"dropped {text}")
    pull(b, x)
    b.catch_up()
    assert b.search_messages(text)
    a.remove_node(x.node_key, os.urandom(32), "0" * 16)
    pull(b, a)
    assert b.search_messages(text) == []
    assert b.scrub() == scrub.DONE
    assert traces(tmp_path / "b.db", text) == CLEAN


def test_a_reader_holding_the_wal_delays_the_checkpoint_until_it_ends(tmp_path: Path) -> None:
    """Another connection in a read transaction needs the WAL's older frames: the checkpoint cannot
    complete (``blocked``: the retraction itself is not held up), the mark stays, and the first step
    after the reader has finished empties the WAL."""
    db = tmp_path / "replica.db"
    r = Replica.open(db)
    busy(r, 60)
    text = marker()
    mid = r.send_message("alice", "bob", text).id
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM ops").fetchone()[0] > 0  # the read snapshot is taken
    r.retract_message(mid, "alice")
    assert r.scrub() == scrub.BLOCKED
    with r._store.read() as cur:
        assert scrub.pending(cur)[1] is not None
    assert traces(db, text)["-wal"] > 0  # the reader's frames still hold it
    reader.execute("COMMIT")
    reader.close()
    assert r.scrub() == scrub.DONE
    assert traces(db, text) == CLEAN


@pytest.mark.parametrize("pages", [1, 256])
def test_the_search_index_is_merged_in_bounded_steps(tmp_path: Path, pages: int) -> None:
    """However small the step, the merge ends, and the index then answers as before."""
    db = tmp_path / "replica.db"
    r = Replica.open(db)
    busy(r, 300)
    text = marker()
    mid = r.send_message("alice", "bob", text).id
    r.catch_up()
    with r._store.write() as cur:  # a retraction that arrived by sync: nothing scrubbed yet
        cur.execute("INSERT INTO retractions(msg_id, by_key, hlc) VALUES (?, 'alice', 1)", (mid,))
        project.settle_retraction(cur, mid)
    steps = 0
    while (state := r.scrub_step(pages)) == scrub.MORE:
        steps += 1
    assert state == scrub.DONE and steps >= 1
    assert traces(db, text) == CLEAN
    assert len(r.search_messages("filler", limit=500)) == 300


def _trace_free(db: Path, text: str) -> bool:
    return traces(db, text) == CLEAN


def test_on_real_daemons_a_retraction_leaves_no_trace_on_either_machine(fleet: Fleet) -> None:
    """A message with a unique marker reaches b and is indexed there; its sender retracts it on a
    (the local API, as ``peerd retract`` does): once the retraction has reached b, neither a's
    files nor b's hold the marker (b's daemon scrubs what a peer's retraction dropped)."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    text = marker()
    mid = a.send("alice", "bob", f"the key is {text}")["messageId"]
    wait_until(lambda: b.has_message(mid), 30, "the message on b")
    b.api("GET", f"/api/search?q={text}")  # indexed on b (a search catches the index up first)
    assert not _trace_free(b.db, text)  # (the check can fail: the text is on disk before)
    a.api("POST", "/api/retract", {"messageId": mid, "from": "alice"})

    def retracted_on_b() -> bool:
        with read_only(b.db) as conn:
            row = conn.execute("SELECT retracted FROM ops WHERE id = ?", (mid,)).fetchone()
        return row is not None and row[0] is not None

    wait_until(retracted_on_b, 30, "the retraction on b")
    wait_until(lambda: _trace_free(a.db, text) and _trace_free(b.db, text), 30, "no trace of the marker on disk")
