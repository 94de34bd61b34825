"""Snapshots between real daemons: a new member of a member holding more than 10,000 ops catches up by
a snapshot and then by rounds; one killed (kill -9) half-way through resumes after a restart and ends
with every op exactly once; the signatures it skipped are checked afterwards."""

from __future__ import annotations

from pathlib import Path

from replica import open_home
from tests.daemons import Daemon, Fleet, read_only, wait_until
from tests.newer import NewerNode

pytest_plugins = ["tests.daemons"]

FOREIGN = 4  # origins of the ops a source holds


def fill(home: Path, per_origin: int) -> int:
    """Sign ``per_origin`` messages for each of ``FOREIGN`` new origins into a replica (not running);
    how many ops it holds then."""
    writers = [NewerNode() for _ in range(FOREIGN)]
    with open_home(home) as rep:
        fleet = rep.fleet_view().admitted[rep.node_key].fleet_id if rep.node_key in rep.fleet_view().admitted else "0" * 16
        for w in writers:
            rep.admit_node(w.key, f"writer-{w.key.hex()[:4]}", fleet)  # the writers are members, let in by it
            ops = [w.message(f"agent{i % 5}", ("tau", "tau, phi", "broadcast")[i % 3], f"note {i} on the build")
                   for i in range(per_origin)]
            for i in range(0, len(ops), 2000):
                rep.apply(ops[i : i + 2000])
        return int(rep.stats()["ops"])


def small_pages(d: Daemon) -> None:
    """Pages of about 16 KiB (some 80 ops) on ``d``'s side, so that a snapshot takes many of them."""
    cfg = d.home / "config.toml"
    lines = [x for x in cfg.read_text().splitlines() if not x.startswith(("max_content_bytes", "page_bytes"))]
    cfg.write_text("\n".join([*lines, "max_content_bytes = 8192", "page_bytes = 16384", ""]))


def source(fleet: Fleet, per_origin: int, *, pages: bool = False) -> tuple[Daemon, int]:
    s = fleet.add("s")
    fleet.init([s])
    if pages:
        small_pages(s)
    fill(s.home, per_origin)
    fleet.start(s)
    return s, int(s.status()["totals"]["ops"])


def holds(d: Daemon, ops: int) -> bool:
    return int(d.status()["totals"]["ops"]) >= ops


def test_a_new_member_catches_up_by_a_snapshot_then_by_rounds(fleet: Fleet) -> None:
    """A new member seeded with a member of 12,000 ops takes them as a snapshot (not op by op), ends
    with the same state, gets later writes by the ordinary ways, and checks every skipped signature
    in the background."""
    s, want = source(fleet, 3000)
    n = fleet.add("n", seeds=[s])
    fleet.start(n)
    wait_until(lambda: holds(n, want), 60, "the new member holding every op")
    snap = n.status()["snapshot"]
    assert snap["taken_ops"] >= 12_000, snap
    assert "took the snapshot from" in n.log_text()
    sent = s.send("late", "tau", "written after the snapshot")
    wait_until(lambda: n.has_message(sent["messageId"]), 20, "a later message on the new member")
    fleet.wait_converged([s, n])
    done = wait_until(lambda: (st := n.status()["snapshot"])["unchecked"] == 0 and st["checked"] > 0 and st, 120,
                      "every skipped signature checked")
    assert done["forged"] == {} and done["checked"] >= 12_000
    assert "all genuine" in n.log_text()


def test_a_member_killed_half_way_through_a_snapshot_resumes_it_and_stores_every_op_once(fleet: Fleet) -> None:
    """kill -9 in the middle of a snapshot leaves whole pages only (every origin held without a
    hole, the cursor saved); after a restart the member goes on from there and ends with exactly the
    source's ops, none twice; the snapshot's ops it took after the restart are the ones it lacked."""
    s, want = source(fleet, 8000, pages=True)
    n = fleet.add("n", seeds=[s])
    fleet.start(n)

    def half_way() -> int | None:
        taking = n.status()["snapshot"]["taking"]
        return taking["done"] if taking and 1000 < taking["done"] < taking["total"] - 5000 else None

    wait_until(half_way, 60, "the snapshot half-way")
    n.kill()
    with read_only(n.db) as conn:
        held = int(conn.execute("SELECT count(*) FROM ops").fetchone()[0])
        kept = conn.execute("SELECT v FROM meta WHERE k = 'snapshot_cursor'").fetchone()
        holes = conn.execute("SELECT count(*) FROM origins o WHERE (SELECT count(*) FROM ops WHERE ops.oid = o.oid)"
                             " != o.contig AND o.node != (SELECT v FROM meta WHERE k = 'self_node')").fetchone()[0]
    assert 1000 < held < want and kept is not None and holes == 0, (held, kept, holes)
    n.restart()
    wait_until(lambda: holds(n, want), 90, "the restarted member holding every op")
    fleet.wait_converged([s, n])
    st = n.status()
    assert st["totals"]["ops"] == s.status()["totals"]["ops"]
    with read_only(s.db) as conn:  # the snapshot opens with every membership op, held or not
        fleet_ops = int(conn.execute("SELECT count(*) FROM fleet_ops").fetchone()[0])
    assert 0 < st["snapshot"]["taken_ops"] <= want - held + fleet_ops, (st["snapshot"], held, fleet_ops)
    with read_only(n.db) as conn:
        assert conn.execute("SELECT count(*) FROM meta WHERE k LIKE 'snapshot_taking'").fetchone()[0] == 0
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    after_restart = n.log_text().rsplit("---- harness: starting n", 1)[1]
    assert "resuming the snapshot from" in after_restart and "took the snapshot from" in after_restart
