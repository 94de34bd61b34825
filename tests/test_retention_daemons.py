"""Retention on real daemons: three processes, a horizon of seconds, one member stopped across it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.daemons import PEERD, Daemon, Fleet, message_ids, read_only, wait_until

pytest_plugins = ["tests.daemons"]

H_S = 8  # the horizon: long enough for a receipt to reach every replica first, short enough to wait out
SPREAD = 20.0
ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def peerd(*argv: str, home: Path) -> str:
    proc = subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, env=ENV,
                          timeout=60, check=False)
    assert proc.returncode == 0, f"peerd {' '.join(argv)}: {proc.stderr}"
    return proc.stdout


def horizon_ms(d: Daemon) -> int:
    return int(d.status()["retention"]["horizon_ms"])


def database_bytes(d: Daemon) -> int:
    """What the replica's database holds, WAL included, read without writing."""
    with read_only(d.db) as conn:
        return int(conn.execute("PRAGMA page_count").fetchone()[0]) * int(conn.execute("PRAGMA page_size").fetchone()[0])


def held_upto(d: Daemon, of: Daemon) -> int:
    """``d``'s vector entry for ``of``, read from its file: how far it holds ``of``'s log contiguously (held or
    purged). A node's own entry is its newest op, or the floor a purge of its own ops left."""
    mark = "max(contig, (SELECT coalesce(max(seq), 0) FROM ops WHERE ops.oid = origins.oid))" if d is of else "contig"
    with read_only(d.db) as conn:
        row = conn.execute(f"SELECT {mark} FROM origins WHERE node = ?", (bytes.fromhex(of.node_id),)).fetchone()
    return 0 if row is None else int(row[0])


def seq_of(message_id: str) -> int:
    return int(message_id.rsplit("-", 1)[1])


def wait_for_age(seconds: float) -> None:
    """The rules are about age: let the wall clock pass ``seconds`` (this is the condition itself, not a guess)."""
    time.sleep(max(0.0, seconds))


def read_everything(d: Daemon, role: str) -> list[str]:
    got = d.check(role, limit=100)["messages"]
    if got:
        d.mark_read([m["receiptId"] for m in got])
    return [m["messageId"] for m in got]


def start_three(fleet: Fleet) -> tuple[Daemon, Daemon, Daemon]:
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.mesh()
    fleet.start()
    wait_until(lambda: all(len(d.live_ids()) == 2 for d in (a, b, c)), SPREAD, "every daemon reaches the other two")
    peerd("retention", "set", f"{H_S}s", "--force", home=a.home)  # through the file: the daemon notices
    wait_until(lambda: all(horizon_ms(d) == H_S * 1000 for d in (a, b, c)), SPREAD, "the horizon on every replica")
    return a, b, c


def test_a_fleet_purges_read_mail_keeps_unread_mail_and_gives_the_disk_back(fleet: Fleet) -> None:
    """Read mail leaves every replica after the horizon while unread mail stays, until twice the horizon; the
    database shrinks, the node goes on numbering its ops, and status and doctor say what was purged."""
    a, b, c = start_three(fleet)
    bulky = [a.send("alice", "bob", f"report {i} " + os.urandom(4000).hex())["messageId"] for i in range(60)]
    unread = a.send("alice", "carol", "nobody reads this")["messageId"]
    wait_until(lambda: all(d.has_message(bulky[-1]) and d.has_message(unread) for d in (b, c)), SPREAD,
               "the mail on b and c")
    assert sorted(read_everything(b, "bob")) == sorted(bulky)
    wait_until(lambda: all(d.message_status(bulky[-1])[0]["readAt"] for d in (a, c)), SPREAD,
               "bob's receipts on a and c")
    before = database_bytes(a)
    wait_until(lambda: not any(d.has_message(bulky[-1]) for d in (a, b, c)), 3 * H_S, "read mail purged everywhere")
    assert all(d.has_message(unread) for d in (a, b, c)), "unread mail is kept until twice the horizon"
    assert not any(m & set(bulky) for m in (message_ids(d.db) for d in (a, b, c)))
    wait_until(lambda: not any(d.has_message(unread) for d in (a, b, c)), 4 * H_S, "unread mail purged after 2h")
    assert database_bytes(a) < before / 2
    state = a.status()["retention"]
    assert state["removed_total"]["messages"] >= 61 and state["last_purge"]["bytes_after"] > 0
    assert "retain  8s" in peerd("status", home=a.home)
    assert "retention 8s" in _doctor(a)
    after = a.send("alice", "bob", "still counting")["messageId"]
    assert seq_of(after) == seq_of(unread) + 1  # the next seq after a purge of our own ops: none reused
    wait_until(lambda: b.has_message(after) and c.has_message(after), SPREAD, "a new message after the purge")
    fleet.wait_converged(timeout=4 * H_S)


def _doctor(d: Daemon) -> str:
    """``peerd doctor`` may exit 5 on this machine for reasons of its own (mDNS, ports): its text all the same."""
    return subprocess.run([str(PEERD), "doctor", "--home", str(d.home)], capture_output=True, text=True, env=ENV,
                          timeout=60, check=False).stdout


def test_a_member_offline_across_the_horizon_catches_up_and_nothing_is_resurrected(fleet: Fleet) -> None:
    """c is stopped while mail is sent, read and purged, and while it writes mail of its own; back after twice
    the horizon it catches up past the purged ops (its mark moves over the holes), receives none of them, sends
    none of its own expired ones, and every replica ends in the same state with nothing purged coming back."""
    a, b, c = start_three(fleet)
    for d, role in ((a, "alice"), (b, "bob"), (c, "carol")):  # every role seen everywhere first: first-seen
        d.send(role, "dave", f"hello from {role}")           # times (never purged) then agree on every replica
    fleet.wait_converged()
    c.stop()
    read = a.send("alice", "bob", "read while c is away")["messageId"]
    unread = a.send("alice", "carol", "never read")["messageId"]
    wait_until(lambda: b.has_message(read) and b.has_message(unread), SPREAD, "the mail on b")
    assert read_everything(b, "bob") == [read]
    peerd("send", "--from", "carol", "--to", "dave", "written offline, expired before it is sent", home=c.home)
    written = time.time()
    wait_until(lambda: not (a.has_message(read) or b.has_message(read)), 3 * H_S, "read mail purged on a and b")
    assert a.has_message(unread) and b.has_message(unread), "unread mail is kept"
    wait_until(lambda: not (a.has_message(unread) or b.has_message(unread)), 4 * H_S, "unread mail purged")
    wait_for_age(written + 2 * H_S + 1 - time.time())  # c's own offline message is past twice the horizon too
    c.restart()
    fresh = a.send("alice", "bob", "after c is back")["messageId"]
    wait_until(lambda: c.has_message(fresh), SPREAD, "c receives new mail")
    wait_until(lambda: held_upto(c, a) == seq_of(fresh), SPREAD, "c's mark for a moves over the purged holes")
    wait_until(lambda: held_upto(a, c) == held_upto(b, c) == held_upto(c, c), SPREAD,
               "a and b hold c's log as far as c does (its expired message skipped, counted as held)")
    fleet.wait_converged(timeout=4 * H_S)
    for d in (a, b, c):
        assert not message_ids(d.db) & {read, unread}, f"{d.name} holds purged mail"
        assert not any("offline" in m["content"] for m in d.api("GET", "/api/messages?limit=100")["messages"])
