"""Laptops behind real NAT (iptables masquerading routers, network namespaces) get their mail in
one hop from a reachable member, over the links they keep (the return path, ``peerd.relaylink``).

The lab is ``tests/natlab.py``'s: S and P reachable, L1 and L2 each behind a router of its own,
mDNS off, laptops seeded with S and left to find out by themselves that nobody can call them
(``reachable = "auto"``: a reachable peer tries to call them back and cannot). Keepalives are
the default's (``relay_keepalive``, 4 s): after a lost NAT mapping only the laptop's next ping can
mend the path, so mail comes again within that and a relink. Probes are frequent here
(``relay_probe_interval``), so that a laptop whose port is forwarded finds out within seconds; the
figures after 20 s of quiet are ``bench/bench_nat.py``'s.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.daemons import Daemon, wait_until
from tests.natlab import NatLab, delivery, park_all, summary
from tests.netns import NetnsLab

pytest_plugins = ["tests.daemons"]
pytestmark = pytest.mark.netns

LINKED = 30.0  # first round, the probe, the link
IDLE = 2.0  # seconds of quiet before each timed send (rounds back off meanwhile)
SENDS = 3
MEDIAN_BOUND_MS = 300.0  # generous for a busy machine; a laptop that waits for its own rounds takes seconds
WORST_BOUND_MS = 1500.0
AGAIN = 5.0  # mail again after the routers forget every mapping
QUIET = 20.0  # seconds of quiet before the flush
_roles = itertools.count(1)


@pytest.fixture
def natlab(tmp_path: Path) -> Iterator[NatLab]:
    with NetnsLab.create() as lab:
        nat = NatLab.build(lab, tmp_path / "fleet", laptop_config={"relay_probe_interval": 1.0})
        try:
            nat.start()
            yield nat
        finally:
            nat.fleet.close()


def timed(nat: NatLab, sender: str, receiver: str) -> list[float]:
    daemons = {**nat.reachable, **nat.laptops}
    out = []
    for _ in range(SENDS):
        time.sleep(IDLE)  # quiet on purpose: what is measured is mail after a pause, not a sync loop
        role = f"inbox{next(_roles)}"
        out.append(delivery(nat.fleet, daemons[sender], daemons[receiver], role, f"to {role}"))
    return out


def relayed_both_ways(laptop: Daemon, relays: Sequence[Daemon]) -> bool:
    """``laptop`` holds a link up to each of ``relays``, and each of them lists ``laptop`` among those
    it relays for."""
    via = {v["node_id"] for v in laptop.status()["relay"]["via"] if v["up_for"] is not None}
    return (all(r.short_id in via for r in relays)
            and all(laptop.short_id in {x["node_id"] for x in r.status()["relay"]["relaying_for"]} for r in relays))


def test_laptops_behind_nat_get_mail_in_one_hop_again_after_mappings_are_lost_and_when_a_relay_dies(
        natlab: NatLab) -> None:
    """Both laptops learn nobody can call them and link to S and P; S -> L1 and L2 -> L1 arrive
    within a push's time; after the routers' conntrack tables are flushed, mail arrives again
    within 5 s; with S killed, mail reaches L1 through P; once L1's router forwards its port, L1
    drops its links and gets ordinary pushes."""
    nat, s, p = natlab, natlab.reachable["s"], natlab.reachable["p"]
    l1, l2 = nat.laptops["l1"], nat.laptops["l2"]
    nat.wait_linked(LINKED, want=2)
    assert nat.relays_of(l1) == {s.short_id, p.short_id}
    assert l1.status()["relay"]["reachable"] is False
    wait_until(lambda: s.status()["relay"]["reachable"] is True, LINKED, "s to learn it can be called")
    assert {r["node_id"] for r in s.status()["relay"]["relaying_for"]} == {l1.short_id, l2.short_id}
    assert [row["relay"] for row in s.peers() if row["node_id"] == l1.short_id] == ["we relay for it"]

    problems = []
    for sender in ("s", "l2"):
        median, worst = summary(timed(nat, sender, "l1"))
        print(f"{sender} -> l1: median {median:.0f} ms, worst {worst:.0f} ms")
        if median > MEDIAN_BOUND_MS or worst > WORST_BOUND_MS:
            problems.append(f"{sender} -> l1: median {median:.0f} ms, worst {worst:.0f} ms")
    assert not problems, "; ".join(problems)

    # After quiet (l1's rounds backed off, its pooled connections closed), l1 itself sends nothing
    # but its keepalives. A send right after the flush: a push to l1 meets a router that forgot the
    # mapping. Either the router resets it (the relaying member drops the link, l1's next ping meets
    # the reset and l1 links again) or l1's ping gets there first and maps the same connection anew
    # (the link lives on). Either way l1 gets the mail within 5 s, both relaying members hold a link
    # from it again, and mail comes down each of them within 5 s of the send: with a 25 s keepalive a
    # reset link stays unknown to l1 for up to 25 s, and the member that reset it does not list l1.
    time.sleep(QUIET)  # quiet on purpose, as in the issue: what is measured is recovery after a pause
    nat.flush_conntrack()
    (parked,) = park_all(nat.fleet, [l1], ["after-flush"])
    s.send("sender", "after-flush", "after the flush")
    sent = time.monotonic()
    took = parked.woke_with("after the flush") - sent
    wait_until(lambda: relayed_both_ways(l1, (s, p)), AGAIN, "l1 linked to s and p again, as both say")
    mended = time.monotonic() - sent
    down = {r.name: delivery(nat.fleet, r, l1, f"mended-{r.name}", f"down the mended link from {r.name}")
            for r in (s, p)}
    print(f"after the flush: s -> l1 {took * 1000:.0f} ms; links held again {mended * 1000:.0f} ms after the send; "
          + ", ".join(f"{n} -> l1 then {t * 1000:.0f} ms" for n, t in down.items()))
    assert took <= AGAIN, f"mail after the NAT mappings were lost took {took:.1f} s"
    over = {n: round(t, 1) for n, t in down.items() if t > AGAIN}
    assert not over, f"mail down the links after the flush took longer than {AGAIN:g} s: {over}"

    s.kill()
    wait_until(lambda: nat.relays_of(l1) == {p.short_id}, 20, "l1 relayed by p alone")
    took = delivery(nat.fleet, l2, l1, "after-kill", "with s gone")
    assert took <= AGAIN, f"mail with the relaying member gone took {took:.1f} s"

    nat.forward_port(l1)
    wait_until(lambda: l1.status()["relay"]["reachable"] is True and not nat.relays_of(l1), 20,
               "l1 to learn it can be called and drop its links")
    wait_until(lambda: [r["node_id"] for r in p.status()["relay"]["relaying_for"]] == [l2.short_id], 20,
               "p relaying for l2 alone")
    took = delivery(nat.fleet, p, l1, "forwarded", "by an ordinary push")
    assert took <= AGAIN, f"mail by an ordinary push took {took:.1f} s"
