"""Backups and restores: ``peerd backup`` beside a writing daemon, ``peerd restore`` as a new node
(no seq signed twice, nothing lost), and every bad input refused before anything is written."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from peerd import doctor, forks
from peerd.config import load_config
from replica import Replica, backup, identity, open_home, schema
from tests.daemons import PEERD, Fleet, free_ports, integrity_check, message_ids, read_only, wait_until

pytest_plugins = ["tests.daemons"]

SPREAD = 20.0
ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def peerd(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``peerd ARGV --home HOME`` as a separate process."""
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          env=ENV, check=False)


def ok_json(*argv: str, home: Path) -> Any:
    proc = peerd(*argv, "--json", home=home)
    assert proc.returncode == 0, f"peerd {' '.join(argv)} exited {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def ops_by_lseq(db: Path) -> list[tuple[int, bytes, int, bytes]]:
    """Every op of a replica file as (lseq, origin, seq, blob), in arrival order."""
    with read_only(db) as conn:
        return [(int(r[0]), bytes(r[1]), int(r[2]), bytes(r[3])) for r in conn.execute(
            "SELECT lseq, o.node, seq, blob FROM ops JOIN origins o USING (oid) ORDER BY lseq")]


def contig(db: Path, node: bytes) -> int:
    with read_only(db) as conn:
        row = conn.execute("SELECT contig FROM origins WHERE node = ?", (node,)).fetchone()
        return int(row[0]) if row else 0


def signed(dbs: Iterable[Path]) -> dict[tuple[bytes, int], set[bytes]]:
    """Per (origin, seq), every distinct op blob the replicas hold: a fork shows as two."""
    out: dict[tuple[bytes, int], set[bytes]] = {}
    for db in dbs:
        for _lseq, origin, seq, blob in ops_by_lseq(db):
            out.setdefault((origin, seq), set()).add(blob)
    return out


def fill(src: Replica, dst: Replica) -> None:
    dst.apply([raw for _, raw in src.ops_after(0, 100_000)])


def backup_of(rep: Replica, dest: Path) -> backup.BackupInfo:
    return backup.create(Path(rep.path), dest, {"config.toml": b'fleet_key = "x"\n'})


# -- the replica's side (real files, no daemon) -----------------------------------------------------


def restored(file: Path, db: Path) -> Replica:
    """The replica of ``file`` unpacked to ``db``, opened as the new node it was unpacked for."""
    ident = identity.generate()
    db.parent.mkdir(parents=True, exist_ok=True)
    backup.unpack(file, db, ident.public_key)
    return Replica.open(db, ident)


def test_restore_makes_the_old_node_an_ordinary_origin_with_its_whole_vector(tmp_path: Path) -> None:
    """The restored replica is a new node; the backup's node keeps every op, counted in its vector."""
    with open_home(tmp_path / "a") as a, Replica.open(tmp_path / "b.db") as b:
        b.send_message("bob", "alice", "from b")
        fill(b, a)
        for i in range(5):
            a.send_message("alice", "bob", f"m{i}")
        old, other, clock = a.node_key, b.node_key, a.clock()
        info = backup_of(a, tmp_path / "a.backup")
    assert (info.node, info.messages, info.ops, info.origins) == (old, 6, 6, 2)
    with restored(tmp_path / "a.backup", tmp_path / "r" / "replica.db") as r:
        assert r.node_key != old
        assert r.vector() == {old: 5, other: 1}  # the old node's own ops, whose mark it never kept
        sent = r.send_message("alice", "bob", "after restore")
        assert sent.id == f"{r.node_id[:16]}-1"  # the new node's first seq, under its own origin
        assert sent.hlc > clock  # and its clock starts after every stamp held
        assert r.vector() == {old: 5, other: 1, r.node_key: 1}
        assert [m.content for m in r.message_log(limit=100).messages] == [
            "from b", *(f"m{i}" for i in range(5)), "after restore"]


def test_a_restored_replica_of_a_removed_node_drops_its_ops_above_the_cutoff(tmp_path: Path) -> None:
    """A node never retracts its own ops; once restored as another node, its old ops past its removal go, as
    on every other replica."""
    with open_home(tmp_path / "a") as a, Replica.open(tmp_path / "b.db") as b:
        for i in range(3):
            a.send_message("alice", "bob", f"kept {i}")
        fill(a, b)
        a.send_message("alice", "bob", "past the cutoff")
        b.remove_node(a.node_key, os.urandom(32), "0" * 16)
        fill(b, a)
        assert a.stats()["messages"] == 4  # its own, kept on the removed node itself
        old = a.node_key
        backup_of(a, tmp_path / "a.backup")
    with restored(tmp_path / "a.backup", tmp_path / "r" / "replica.db") as r:
        assert [m.content for m in r.message_log(limit=100).messages] == [f"kept {i}" for i in range(3)]
        assert r.vector()[old] == 3
        assert r.search_messages("cutoff") == []


def test_backup_copies_a_point_in_time_while_another_process_writes(tmp_path: Path) -> None:
    """Backups taken while a writer commits hold exactly the ops that had landed at one moment (a prefix of
    the arrival order, byte for byte), and pass SQLite's integrity check."""
    db = tmp_path / "home" / "replica.db"
    open_home(db.parent).close()
    with subprocess.Popen([sys.executable, "-c", WRITER, str(db.parent)], stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
            copies = [backup.create(db, tmp_path / f"copy{i}", {}) for i in range(5)]
            # the writer goes on after the last copy (it may have been starved while the copies ran)
            wait_until(lambda: len(ops_by_lseq(db)) > copies[-1].ops, 30, "a write after the last copy")
        finally:
            writer.terminate()
    live = ops_by_lseq(db)
    counts = []
    for i, info in enumerate(copies):
        path = tmp_path / f"copy{i}"
        assert integrity_check(path) == "ok"
        held = ops_by_lseq(path)
        assert held == live[: len(held)], f"copy {i} is not a prefix of the live replica"
        assert info.ops == len(held) and info.messages == len(held)
        counts.append(len(held))
    assert counts == sorted(counts) and counts[0] > 0 and len(live) > counts[-1]  # taken amid the writes


WRITER = r"""
import sys
from pathlib import Path
from replica import open_home
with open_home(Path(sys.argv[1])) as rep:
    rep.send_message("w", "r", "first")
    print("writing", flush=True)
    n = 0
    while True:
        n += 1
        rep.send_message("w", "r", f"message {n}")
"""


# -- real daemons ---------------------------------------------------------------------------------


def test_a_restored_node_signs_no_seq_twice_and_loses_nothing(fleet: Fleet, tmp_path: Path) -> None:
    """The issue's test: back up a (running, writing); a writes more, which reaches b; a's machine is lost;
    its older backup restored (on a's peer address) writes at once: every (origin, seq) is one op
    everywhere, the new writes are under a new origin, every message a ever wrote is on b and on the
    restored node, and b takes the restored node's writes. The old node coming back forks nothing either."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    old = bytes.fromhex(a.node_id)
    before = [a.send("alice", "bob", f"before {i}")["messageId"] for i in range(5)]
    during: list[str] = []
    writing = threading.Thread(target=lambda: during.extend(a.send("alice", "bob", f"during {i}")["messageId"]
                                                            for i in range(20)))
    writing.start()
    made = ok_json("backup", str(tmp_path / "a.backup"), home=a.home)
    writing.join()
    after = [a.send("alice", "bob", f"after {i}")["messageId"] for i in range(5)]
    wrote = before + during + after
    wait_until(lambda: all(b.has_message(m) for m in wrote), SPREAD, "all of a's messages on b")
    assert made["node_id"] == a.node_id and 5 <= made["messages"] < len(wrote)
    a.kill()

    r = fleet.add("a-restored", port=a.port, seeds=[b])
    out = ok_json("restore", str(tmp_path / "a.backup"), home=r.home)
    assert contig(r.db, old) == made["ops"] - _others(tmp_path / "a.backup", old)  # its whole vector, at once
    r.initialised = True  # the restored home is its own: no `peerd init`
    fleet.start(r)
    assert r.node_id == out["node_id"] != a.node_id and out["previous_node_id"] == a.node_id
    new = [r.send("alice", "bob", f"restored {i}")["messageId"] for i in range(3)]
    assert all(m.startswith(f"{r.short_id}-") for m in new)
    wait_until(lambda: all(b.has_message(m) for m in new), SPREAD, "the restored node's messages on b")
    wait_until(lambda: all(r.has_message(m) for m in wrote), SPREAD, "a's later messages back on the restored node")
    fleet.wait_converged([b, r])
    assert contig(r.db, old) == contig(b.db, old) == len(wrote) + _admits(b.db, old)

    a.port = free_ports(1)[0]  # the old machine was not lost after all (its address is taken now)
    a.restart()  # it goes on under its own key
    late = a.send("alice", "bob", "the old node is back")["messageId"]
    wait_until(lambda: r.has_message(late) and b.has_message(late), SPREAD, "the old node's new message")
    assert {k: v for k, v in signed([a.db, b.db, r.db]).items() if len(v) > 1} == {}
    assert message_ids(b.db) >= {*wrote, *new, late} and message_ids(r.db) >= {*wrote, *new, late}
    assert sorted(m["content"] for m in b.check("bob", limit=100)["messages"]) == sorted(
        [*(f"before {i}" for i in range(5)), *(f"during {i}" for i in range(20)), *(f"after {i}" for i in range(5)),
         *(f"restored {i}" for i in range(3)), "the old node is back"])


def _others(db: Path, node: bytes) -> int:
    """Ops in a replica file whose origin is not ``node``."""
    return sum(1 for _l, origin, _s, _b in ops_by_lseq(db) if origin != node)


def _admits(db: Path, node: bytes) -> int:
    """Ops of ``node`` in a replica file that are not messages (its admit of itself)."""
    with read_only(db) as conn:
        return int(conn.execute("SELECT count(*) FROM ops JOIN origins o USING (oid) WHERE o.node = ? AND id IS NULL",
                                (node,)).fetchone()[0])


# -- the command line: output, exit codes, bad input ---------------------------------------------------


@pytest.fixture
def home_and_backup(tmp_path: Path) -> tuple[Path, Path]:
    """A home (no daemon) holding two messages, and a backup of it."""
    home = tmp_path / "home"
    ok_json("init", "--name", "alpha", home=home)
    for text in ("one", "two"):
        ok_json("send", "--from", "alice", "--to", "bob", text, home=home)
    ok_json("backup", str(tmp_path / "home.backup"), home=home)
    return home, tmp_path / "home.backup"


def test_backup_says_what_it_holds_and_that_it_holds_the_fleet_key(tmp_path: Path) -> None:
    """`peerd backup` with no daemon: --json names the node, the counts and the secret; the text says it too."""
    home = tmp_path / "home"
    node = ok_json("init", "--name", "alpha", home=home)
    ok_json("send", "--from", "alice", "--to", "bob", "hello", home=home)
    out = ok_json("backup", str(tmp_path / "b1"), home=home)
    assert {k: out[k] for k in ("node_id", "name", "fleet_id", "messages", "holds_fleet_key", "schema_version")} == {
        "node_id": node["node_id"], "name": "alpha", "fleet_id": node["fleet_id"], "messages": 1,
        "holds_fleet_key": True, "schema_version": schema.LATEST}
    assert out["file"] == str(tmp_path / "b1") and out["bytes"] == (tmp_path / "b1").stat().st_size
    assert (tmp_path / "b1").stat().st_mode & 0o777 == 0o600  # as private as config.toml
    text = peerd("backup", str(tmp_path / "b2"), home=home)
    assert text.returncode == 0 and "holds the fleet key" in text.stdout and "1 message, " in text.stdout
    assert backup.inspect(tmp_path / "b2").files["config.toml"] == (home / "config.toml").read_bytes()


def test_backup_never_overwrites_without_force(home_and_backup: tuple[Path, Path]) -> None:
    """An existing FILE is kept (exit 1) unless --force; the replica itself is never a target."""
    home, file = home_and_backup
    kept = file.read_bytes()
    refused = peerd("backup", str(file), home=home)
    assert refused.returncode == 1 and "exists" in refused.stderr and "--force" in refused.stderr
    assert file.read_bytes() == kept
    ok_json("send", "--from", "alice", "--to", "bob", "three", home=home)
    assert ok_json("backup", str(file), "--force", home=home)["messages"] == 3
    itself = peerd("backup", str(home / "replica.db"), "--force", home=home)
    assert itself.returncode == 1 and "the replica itself" in itself.stderr
    assert integrity_check(home / "replica.db") == "ok" and len(message_ids(home / "replica.db")) == 3


def test_backup_of_no_home_exits_4(tmp_path: Path) -> None:
    """No peerd home there: exit 4, and no file is written."""
    proc = peerd("backup", str(tmp_path / "b"), home=tmp_path / "nothing")
    assert proc.returncode == 4 and "no peerd home" in proc.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "nothing").exists()


def test_restore_makes_a_new_node_with_the_backups_config(home_and_backup: tuple[Path, Path], tmp_path: Path) -> None:
    """The restored home keeps the fleet, name and settings, holds every message, and has a new node key."""
    home, file = home_and_backup
    new = tmp_path / "new" / "deeper"
    out = ok_json("restore", str(file), home=new)
    was = ok_json("status", message_ids(home / "replica.db").pop(), home=home)["messageId"]
    assert out["previous_node_id"] == load_node(home) != out["node_id"] == load_node(new)
    assert load_config(new / "config.toml") == load_config(home / "config.toml")
    assert (new / "config.toml").stat().st_mode & 0o777 == 0o600 and new.stat().st_mode & 0o777 == 0o700
    assert message_ids(new / "replica.db") == message_ids(home / "replica.db") and was in message_ids(new / "replica.db")
    assert (out["messages"], out["name"]) == (2, "alpha")
    sent = ok_json("send", "--from", "alice", "--to", "bob", "after", home=new)
    assert sent["messageId"] == f"{out['node_id'][:16]}-1"
    renamed = ok_json("restore", str(file), "--name", "alpha-2", home=tmp_path / "renamed")
    assert renamed["name"] == load_config(tmp_path / "renamed" / "config.toml").name == "alpha-2"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ok_json("restore", str(file), home=empty)["home"] == str(empty)


def test_restore_with_the_current_fleet_key_keeps_the_backups_as_a_previous_one(
        home_and_backup: tuple[Path, Path], tmp_path: Path) -> None:
    """--fleet-key (the fleet rotated since the backup) makes it the key, the backup's one a previous key."""
    home, file = home_and_backup
    key = "peerd-fleet-HDVojIB6rqRTvXbIEeUwY2wpOWghYPsv2FtvdGXPYEQ"
    ok_json("restore", str(file), "--fleet-key", key, home=tmp_path / "new")
    cfg, was = load_config(tmp_path / "new" / "config.toml"), load_config(home / "config.toml")
    assert cfg.fleet_id != was.fleet_id and cfg.previous_fleet_keys == (was.fleet_key,) and cfg.name == was.name


def load_node(home: Path) -> str:
    return identity.load_or_create(home / "node.key").node_id


def _truncated(file: Path, out: Path) -> None:
    out.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _random(_file: Path, out: Path) -> None:
    out.write_bytes(os.urandom(40_000))


def _empty(_file: Path, out: Path) -> None:
    out.write_bytes(b"")


def _a_replica(file: Path, out: Path) -> None:
    open_home(out.parent / "other-home").close()
    os.replace(out.parent / "other-home" / "replica.db", out)


def _foreign_sqlite(_file: Path, out: Path) -> None:
    with sqlite3.connect(out) as conn:
        conn.execute("CREATE TABLE notes(text)")


def _edited(sql: str) -> Any:
    def make(file: Path, out: Path) -> None:
        out.write_bytes(file.read_bytes())
        with sqlite3.connect(out) as conn:
            conn.executescript(sql)
    return make


def _damaged(file: Path, out: Path) -> None:
    """The root page of the ops table overwritten (the file keeps its length)."""
    data = bytearray(file.read_bytes())
    with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as conn:
        root = int(conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ops'").fetchone()[0])
        size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    data[(root - 1) * size:root * size] = b"\xff" * size
    out.write_bytes(bytes(data))


BAD = {
    "truncated": (_truncated, "truncated"),
    "random bytes": (_random, "not a peerd backup"),
    "an empty file": (_empty, "not a peerd backup"),
    "a replica, not a backup": (_a_replica, "a peerd replica, not a backup"),
    "another program's database": (_foreign_sqlite, "not a peerd backup"),
    "a newer schema": (_edited(f"UPDATE meta SET v = {schema.LATEST + 1} WHERE k = 'schema_version'; "
                               f"UPDATE peerd_backup SET v = {schema.LATEST + 1} WHERE k = 'schema_version'"),
                       "newer than this peerd"),
    "a newer format": (_edited("UPDATE peerd_backup SET v = 99 WHERE k = 'format_version'"), "newer than this peerd"),
    "a damaged page": (_damaged, "is damaged"),
    "no config": (_edited("DELETE FROM peerd_backup_files"), "holds no config.toml"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_restore_refuses_a_bad_file_and_writes_nothing(home_and_backup: tuple[Path, Path], tmp_path: Path,
                                                        case: str) -> None:
    """A truncated, damaged, foreign or too new file: exit 1 with a clear message, and no home, no
    leftovers."""
    _home, file = home_and_backup
    make, says = BAD[case]
    bad = tmp_path / "bad" / "given.file"
    bad.parent.mkdir()
    make(file, bad)
    kept = bad.read_bytes()
    before = sorted(p.name for p in bad.parent.iterdir())
    target = tmp_path / "place" / "restored"
    proc = peerd("restore", str(bad), home=target)
    assert proc.returncode == 1, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "place").exists()
    assert bad.read_bytes() == kept and sorted(p.name for p in bad.parent.iterdir()) == before


def test_restore_into_a_home_that_exists_changes_nothing(home_and_backup: tuple[Path, Path]) -> None:
    """A home that exists (not empty) is never restored over: exit 1, its files as they were."""
    home, file = home_and_backup
    files = {p.name: p.read_bytes() for p in home.iterdir() if p.is_file()}
    proc = peerd("restore", str(file), home=home)
    assert proc.returncode == 1 and "not empty" in proc.stderr
    assert {p.name: p.read_bytes() for p in home.iterdir() if p.is_file()} == files
    missing = peerd("restore", str(file.with_name("no-such-file")), home=home.with_name("new"))
    assert missing.returncode == 1 and "no such file" in missing.stderr and not home.with_name("new").exists()


# -- a home copied back by hand (not `peerd restore`): told once, behaviour unchanged ---------------------


def test_own_history_ahead_is_only_a_peer_holding_more_of_our_own_ops() -> None:
    """The rule: a peer's vector beyond our own newest seq, and nothing else, is a copy running behind itself."""
    me, other = b"m" * 8, b"o" * 8
    assert forks.own_ahead(me, "p:1", {me: 5, other: 9}, {me: 4, other: 1}) == forks.OwnAhead("p:1", 5, 4)
    assert forks.own_ahead(me, "p:1", {me: 4, other: 9}, {me: 4}) is None  # others ahead of us: ordinary news
    assert forks.own_ahead(me, "p:1", None, {me: 4}) is None  # the peer's vector was the same as ours
    # our own write during the round reached the peer before its vector was read: not a fork
    assert forks.own_ahead(me, "p:1", {me: 5}, {me: 4}, {me: 5}) is None
    finding = doctor.membership_findings({"own_history_ahead": {"peer": "p:1", "theirs": 5, "ours": 4}})
    assert [(f.check, f.status) for f in finding] == [("history", doctor.FAIL)]
    assert "#5" in finding[0].detail and "peerd restore" in str(finding[0].fix)


def test_a_home_copied_back_by_hand_is_reported_once_and_by_doctor(fleet: Fleet, tmp_path: Path) -> None:
    """An old copy of a home put back by hand writes a number the fleet holds (b keeps its own op for it); the
    daemon logs it once, shows it in its status, and `peerd doctor` fails with the fix."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    first = [a.send("alice", "bob", f"first {i}")["messageId"] for i in range(3)]
    wait_until(lambda: all(b.has_message(m) for m in first), SPREAD, "a's first messages on b")
    a.stop()
    shutil.copytree(a.home, tmp_path / "copy")
    a.start()
    later = [a.send("alice", "bob", f"later {i}")["messageId"] for i in range(2)]
    wait_until(lambda: all(b.has_message(m) for m in later), SPREAD, "a's later messages on b")
    a.stop()
    shutil.rmtree(a.home)
    shutil.copytree(tmp_path / "copy", a.home)
    forked = ok_json("send", "--from", "alice", "--to", "bob", "forked", home=a.home)["messageId"]
    assert forked == later[0]  # the old copy's next number is one the fleet already holds
    a.start()
    ahead = wait_until(lambda: a.status()["own_history_ahead"], SPREAD, "the daemon noticing its own history ahead")
    assert ahead["peer"] == b.addr and ahead["theirs"] > ahead["ours"]
    rounds = a.status()["counters"]["rounds"]
    wait_until(lambda: a.status()["counters"]["rounds"] >= rounds + 3, SPREAD, "more rounds with b")
    assert a.log_text().count("is an older copy of itself") == 1
    with read_only(b.db) as conn:
        assert conn.execute("SELECT content FROM messages WHERE id = ?", (forked,)).fetchone()[0] == "later 0"
    seq = int(forked.rsplit("-", 1)[1])
    assert len(signed([a.db, b.db])[(bytes.fromhex(a.node_id), seq)]) == 2  # the fork the restore test rules out
    report = peerd("doctor", "--json", home=a.home)
    assert report.returncode == 5, report.stdout
    history = [f for f in json.loads(report.stdout)["findings"] if f["check"] == "history"]
    assert [f["status"] for f in history] == ["fail"] and "peerd backup" in history[0]["fix"]
