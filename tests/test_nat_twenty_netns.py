"""Twenty members behind one NAT on one reachable server each get a broadcast within a second
(issue 23): ``tests/natlab.py``'s lab with S alone on the "internet" and twenty laptops behind one
masquerading router, every laptop setting at its default (they find out by themselves that nobody
can call them and link to S).

S holds the twenty links from one address, so its ``peer_connections_per_address`` is raised, as
docs/fleet.md says for many members behind one address. The readers are ``natlab.park_all``'s: a
parked ``check`` with ``wait`` per laptop (what ``peerd inbox ROLE --wait`` does), each through a
small relay process in the laptop's namespace, counted by the laptop's daemon before the send (an
event, not a pause); twenty ``peerd`` CLI processes would each import the whole package.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import wait_until
from tests.natlab import NatLab, park_all
from tests.netns import NetnsLab

pytest_plugins = ["tests.daemons"]
pytestmark = pytest.mark.netns

COUNT = 20
LINKED = 120.0  # twenty-one daemons starting at once, each laptop's first round, probe and link
BOUND = 1.0  # seconds from the end of the send to the last laptop's wait returning


@pytest.fixture
def twenty(tmp_path: Path) -> Iterator[NatLab]:
    with NetnsLab.create() as lab:
        nat = NatLab.build(lab, tmp_path / "fleet", reachable=("s",), homes=1, laptops_per_home=COUNT,
                           server_config={"peer_connections_per_address": 1024})
        try:
            nat.start()
            yield nat
        finally:
            nat.fleet.close()


def test_twenty_members_behind_one_nat_each_get_a_broadcast_within_a_second(twenty: NatLab) -> None:
    """Once S relays for all twenty laptops, one broadcast from S wakes a wait parked on each of
    them within 1 s of the send: S pushes down every link at once, none waits for a round."""
    nat, s = twenty, twenty.reachable["s"]
    laptops = list(nat.laptops.values())
    wait_until(lambda: len(s.status()["relay"]["relaying_for"]) == COUNT, LINKED, f"s relaying for {COUNT} laptops")
    assert {r["node_id"] for r in s.status()["relay"]["relaying_for"]} == {d.short_id for d in laptops}
    parked = park_all(nat.fleet, laptops, [f"w{i}" for i in range(COUNT)])
    s.send("sender", "broadcast", "to all")
    sent = time.monotonic()
    took = {p.receiver.name: p.woke_with("to all") - sent for p in parked}
    ordered = sorted(took.values())
    print(f"broadcast to {COUNT} NAT'd members: first {ordered[0] * 1000:.0f} ms, "
          f"median {ordered[len(ordered) // 2] * 1000:.0f} ms, last {ordered[-1] * 1000:.0f} ms")
    late = {name: round(t * 1000) for name, t in took.items() if t > BOUND}
    assert not late, f"laptops that got the broadcast later than {BOUND:g} s (ms): {late}"
