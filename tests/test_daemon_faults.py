"""Real daemons stopped, killed with SIGKILL under load, and restarted: nothing acknowledged is lost."""

from __future__ import annotations

import http.client
import threading

from replica import open_home
from tests.daemons import ApiError, Daemon, Fleet, integrity_check, message_ids, wait_until

pytest_plugins = ["tests.daemons"]

CATCH_UP = 30.0  # seconds for a restarted daemon and the fleet to agree again
KILL_ROUNDS = 3


def peers_in_sync(d: Daemon, others: list[Daemon]) -> bool:
    """``d`` sees every other daemon live with lag 0 (it knows they hold all it holds)."""
    rows = {p["node_id"]: p for p in d.peers()}
    return all((row := rows.get(o.short_id)) is not None and row["reachable"] and row["lag"] == 0 for o in others)


def test_stopped_daemon_catches_up_both_ways(fleet: Fleet) -> None:
    """A daemon stopped while the others write, and written to directly while stopped, converges on restart."""
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.mesh()
    fleet.start()
    first = a.send("alpha", "all-hands", "before the outage")["messageId"]
    wait_until(lambda: c.has_message(first), CATCH_UP, "the first message on c")

    assert c.stop() == 0
    assert not (c.home / "daemon.json").exists()
    online = [d.send(f"writer-{d.name}", "all-hands", f"{d.name} while c is away {i}")["messageId"]
              for i in range(10) for d in (a, b)]
    a.update_profile("orch-a", dynamic="set while c is away")
    with open_home(c.home) as rep:  # c's replica written by another process while its daemon is down
        offline = [rep.send_message("gamma", "all-hands", f"c offline {i}").id for i in range(10)]
        rep.update_profile("orch-c", static="set while the daemon was down")
    c.restart()

    wanted = {first, *online, *offline}
    for d in (a, b, c):
        wait_until(lambda d=d: wanted <= message_ids(d.db), CATCH_UP, f"every message on {d.name}")
    fleet.wait_converged(timeout=CATCH_UP)
    for d in (a, b, c):
        others = [o for o in (a, b, c) if o is not d]
        wait_until(lambda d=d, others=others: peers_in_sync(d, others), CATCH_UP, f"lag 0 to every peer on {d.name}")
        assert d.status()["lag"] == 0
    assert {p["orchestratorId"] for p in c.profiles()} >= {"orch-a", "orch-c"}
    assert {p["orchestratorId"] for p in a.profiles()} >= {"orch-a", "orch-c"}


class Writer(threading.Thread):
    """Sends messages through one daemon as fast as it answers; keeps the ids it acknowledged."""

    def __init__(self, daemon: Daemon, label: str) -> None:
        super().__init__(daemon=True)
        self.daemon_ = daemon
        self.label = label
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.unexpected: list[str] = []
        self.payload = "x" * 2048

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                sent = self.daemon_.send(f"load-{self.label}", "sink", f"{self.label} {i} {self.payload}")
            except ApiError as exc:
                self.unexpected.append(str(exc))
                return
            except (OSError, http.client.HTTPException):
                return  # the daemon was killed under us: this send was never acknowledged
            self.acked.append(sent["messageId"])


def test_kill9_under_write_load_and_mid_sync_loses_nothing_acknowledged(fleet: Fleet) -> None:
    """SIGKILL of a daemon under write load, repeated: every acknowledged send survives, SQLite stays sound."""
    a, b, victim = fleet.add("a"), fleet.add("b"), fleet.add("victim")
    fleet.mesh()
    fleet.start()
    background = Writer(a, "a")  # keeps writing across kills: pushes to the victim, then a backlog to sync
    background.start()
    victim_writers: list[Writer] = []
    try:
        for round_ in range(KILL_ROUNDS):
            w = Writer(victim, f"victim{round_}")
            victim_writers.append(w)
            w.start()
            wait_until(lambda w=w, n=5 * (round_ + 1): len(w.acked) >= n, 30,  # mid-load, a longer run each round
                       f"{5 * (round_ + 1)} sends acknowledged by the victim")
            victim.kill()
            w.join(10)
            assert not w.is_alive()
            assert integrity_check(victim.db) == "ok"
            held = message_ids(victim.db)
            assert w.acked, "the victim acknowledged no send before the kill; the load is too light to test"
            assert set(w.acked) <= held, f"acknowledged but lost in round {round_}: {set(w.acked) - held}"
            victim.restart()
    finally:
        background.stop.set()
        background.join(10)

    assert not background.unexpected
    assert not [e for w in victim_writers for e in w.unexpected]
    acked = set(background.acked).union(*(w.acked for w in victim_writers))
    for d in (a, b, victim):
        wait_until(lambda d=d: acked <= message_ids(d.db), CATCH_UP, f"every acknowledged message on {d.name}")
    fleet.wait_converged(timeout=CATCH_UP)
    for d in (a, b, victim):
        assert integrity_check(d.db) == "ok"


def round_failures(d: Daemon) -> list[str]:
    """Sync rounds ``d`` logged as failed for any reason other than an unreachable peer."""
    return [line for line in d.log_text().splitlines() if "failed:" in line and "cannot reach" not in line]


def test_rejoining_daemon_pulls_a_large_backlog_from_two_peers_without_round_errors(fleet: Fleet) -> None:
    """A daemon back from an outage pulls a many-page backlog from two peers at once with no failed round."""
    a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
    fleet.mesh()
    fleet.start()
    c.stop()
    with open_home(a.home) as rep:  # ~4 MB: several 1 MiB pages
        backlog = {rep.send_message("bulk", "archive", f"{i} " + "y" * 8000).id for i in range(500)}
    wait_until(lambda: backlog <= message_ids(b.db), CATCH_UP, "the backlog on b")
    c.restart()
    wait_until(lambda: backlog <= message_ids(c.db), CATCH_UP, "the backlog on c")
    fleet.wait_converged(timeout=CATCH_UP)
    assert round_failures(c) == []
