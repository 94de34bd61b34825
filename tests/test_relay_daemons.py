"""The return path's bounds and settings on real daemons (loopback): a relaying member over its
cap refuses a link cleanly and the member asking links elsewhere; ``reachable`` decides, "auto"
asks a peer; a quiet member holding a link, and the member holding it for it, use about no CPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.daemons import Daemon, Fleet, wait_until

pytest_plugins = ["tests.daemons"]

LINKED = 30.0
QUIET = 10.0  # seconds of wall time over which idle CPU is measured
IDLE_CPU_PERCENT = 2.0  # of one core: keepalives every 4 s and rounds backing off, nothing else


def via(d: object) -> set[str]:
    return {v["node_id"] for v in d.status()["relay"]["via"]}  # type: ignore[attr-defined]


def test_a_full_relay_refuses_cleanly_and_the_member_links_to_another(fleet: Fleet) -> None:
    """S holds one link per address: of two members behind "one address" (loopback) that cannot
    be called, one links to S, the other is refused with the reason, links to P only, and still
    gets S's mail; members left on "auto" learn they can be called and link to nobody."""
    s = fleet.add("s", config={"relay_links_per_address": 1})
    p = fleet.add("p", seeds=[s])
    laptops = [fleet.add(f"l{i}", seeds=[s, p], config={"reachable": False}) for i in (1, 2)]
    fleet.start()
    for d in laptops:
        wait_until(lambda d=d: p.short_id in via(d), LINKED, f"{d.name} linked to p")
    wait_until(lambda: len(s.status()["relay"]["relaying_for"]) == 1, LINKED, "s relaying for one member")
    refused = next(d for d in laptops if s.short_id not in via(d))
    wait_until(lambda: any("relay full" in (w["last_error"] or "") for w in refused.status()["relay"]["waiting"]),
               LINKED, f"{refused.name} to say s is full")
    assert "link refused: this member relays for 1 members at 127.0.0.1 already" in s.log_text()
    sent = s.send("alice", "bob", "through p")
    wait_until(lambda: refused.has_message(sent["messageId"]), 10, "s's mail on the refused member")
    for d in (s, p):
        wait_until(lambda d=d: d.status()["relay"]["reachable"] is True, LINKED, f"{d.name} to learn it can be called")
        assert d.status()["relay"]["via"] == []
    assert all(d.status()["relay"]["reachable"] is False for d in laptops)


def test_reachable_true_keeps_no_links(fleet: Fleet) -> None:
    """``reachable = true``: the member is reachable from the start, keeps no link, and gets mail
    by ordinary pushes."""
    s = fleet.add("s")
    m = fleet.add("m", seeds=[s], config={"reachable": True})
    fleet.start()
    wait_until(lambda: m.peer(s) is not None and m.peer(s)["reachable"], LINKED, "m to reach s")  # type: ignore[index]
    sent = s.send("alice", "bob", "hi")
    wait_until(lambda: m.has_message(sent["messageId"]), 10, "s's mail on m")
    assert m.status()["relay"] == {**m.status()["relay"], "reachable": True, "via": []}
    assert s.status()["relay"]["relaying_for"] == []


def cpu_seconds(d: Daemon) -> float:
    """User + system CPU time of ``d``'s process so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{d.info['pid']}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_quiet_member_holding_a_link_costs_about_no_cpu(fleet: Fleet) -> None:
    """With the default keepalive (4 s) and nothing sent, the member that cannot be called and the
    member relaying for it each use under 2 % of a core, and the link stays up throughout."""
    s = fleet.add("s")
    m = fleet.add("m", seeds=[s], config={"reachable": False})
    fleet.start()
    wait_until(lambda: s.short_id in via(m), LINKED, "m linked to s")
    before, t0 = {d.name: cpu_seconds(d) for d in (s, m)}, time.monotonic()
    time.sleep(QUIET)  # the quiet being measured, not a wait for anything: no call reaches the daemons
    wall = time.monotonic() - t0
    used = {d.name: 100 * (cpu_seconds(d) - before[d.name]) / wall for d in (s, m)}
    print(f"idle CPU over {wall:.1f} s with a link open: " + ", ".join(f"{n} {u:.2f} %" for n, u in used.items()))
    (link,) = m.status()["relay"]["via"]
    assert link["up_for"] >= QUIET, f"the link did not stay up while quiet: {link}"
    assert all(u < IDLE_CPU_PERCENT for u in used.values()), f"idle CPU (% of a core): {used}"
