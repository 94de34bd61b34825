"""A real network partition between two groups of daemons (network namespaces), writes on both sides, heal.

Topology: namespaces ``left`` (10.77.1.11) and ``right`` (10.77.2.11), each holding two
daemons on its own address, joined through a router namespace. The partition takes the
router's interface towards ``right`` down, so no packet crosses; healing brings it back up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, Fleet, message_ids, wait_converged, wait_until
from tests.netns import NetnsLab, Node

pytest_plugins = ["tests.daemons"]
pytestmark = pytest.mark.netns

BASE_PORT = 7801  # namespaces are fresh: fixed ports are free there
SPREAD = 20.0
SPLIT_SPREAD = 5.0  # push on write plus 1 s rounds: a side syncs within itself in about a second
HEAL = 60.0


class Partition:
    """The lab: two groups' namespaces and the router link that joins them."""

    def __init__(self, lab: NetnsLab) -> None:
        self.lab = lab
        left_lan, right_lan = lab.lan("left"), lab.lan("right")
        self.router = lab.router("router", [left_lan, right_lan])
        self.left = lab.node("left", left_lan)
        self.right = lab.node("right", right_lan)
        for node in (self.left, self.right):
            lab.route_via(node, self.router)
        self.link = self._ifname(self.router, right_lan.address(1))

    def _ifname(self, node: Node, address: str) -> str:
        out = self.lab.run(node, ["ip", "-o", "-4", "addr", "show"]).stdout
        return next(line.split()[1] for line in out.splitlines() if f" {address}/" in line)

    def cut(self) -> None:
        self.lab.run(self.router, ["ip", "link", "set", self.link, "down"])

    def heal(self) -> None:
        self.lab.run(self.router, ["ip", "link", "set", self.link, "up"])


@pytest.fixture
def partition() -> Iterator[Partition]:
    """The namespaces; removed after the test whatever happens (fails, never skips, without root)."""
    with NetnsLab.create() as lab:
        yield Partition(lab)


@pytest.fixture
def groups(partition: Partition, tmp_path: Path) -> Iterator[tuple[list[Daemon], list[Daemon]]]:
    """Two daemons per side, each seeded with all three others; stopped before the namespaces go."""
    fleet = Fleet(tmp_path / "fleet")
    try:
        sides: list[list[Daemon]] = []
        port = BASE_PORT
        for label, node in (("l", partition.left), ("r", partition.right)):
            relay = fleet.relay(node.exec_prefix())
            side = []
            for i in (1, 2):
                side.append(fleet.add(f"{label}{i}", port=port, host=node.address, exec_prefix=node.exec_prefix(),
                                      transport=relay))
                port += 1
            sides.append(side)
        fleet.mesh()
        fleet.start()
        yield sides[0], sides[1]
    finally:
        fleet.close()


def arrives(pred: Callable[[], bool], timeout: float) -> bool:
    """Whether ``pred`` comes true within ``timeout`` seconds (for checks that must not stop the test)."""
    try:
        wait_until(pred, timeout)
    except AssertionError:
        return False
    return True


def test_partitioned_groups_converge_after_heal(partition: Partition, groups: tuple[list[Daemon], list[Daemon]]) -> None:
    """Both sides of a partition keep working on their own, nothing crosses the cut; after healing all are equal.

    Problems seen while partitioned are collected and reported at the end, so that the
    heal is checked even when a side did not sync within itself.
    """
    left, right = groups
    everyone = left + right
    problems: list[str] = []
    hello = {d.name: d.send(f"hello-{d.name}", "team", "before the split")["messageId"] for d in (left[0], right[0])}
    for d in everyone:
        wait_until(lambda d=d: set(hello.values()) <= message_ids(d.db), SPREAD, f"the greetings on {d.name}")
    inbox = right[1].check("team")["messages"]

    partition.cut()
    written = {d.name: [d.send(f"writer-{d.name}", "team", f"{d.name} during the split {i}")["messageId"] for i in range(5)]
               for d in everyone}
    left[0].update_profile("orch-split", dynamic="the left side's view")
    right[0].update_profile("orch-split", dynamic="the right side's view")
    right[1].mark_read([m["receiptId"] for m in inbox])
    left_ids, right_ids = set(written["l1"] + written["l2"]), set(written["r1"] + written["r2"])
    for label, group, ids in (("left", left, left_ids), ("right", right, right_ids)):
        for d in group:
            if not arrives(lambda d=d, ids=ids: ids <= message_ids(d.db), SPLIT_SPREAD):
                problems.append(f"while partitioned, {d.name} lacked {len(ids - message_ids(d.db))} of the "
                                f"{label} side's writes after {SPLIT_SPREAD:.0f} s")
    for d in everyone:  # every daemon has tried the other side since the cut: a leak would show by now
        across = {o.addr for o in (right if d in left else left)}
        wait_until(lambda d=d, across=across: all(p["failures"] >= 1 for p in d.peers() if p["address"] in across),
                   HEAL, f"{d.name} to fail reaching the other side")
    for group, theirs in ((left, right_ids), (right, left_ids)):
        for d in group:
            assert not theirs & message_ids(d.db), f"{d.name} got writes from across the partition"

    partition.heal()
    healed_at = time.monotonic()
    every_id = set(hello.values()) | left_ids | right_ids
    for d in everyone:
        wait_until(lambda d=d: every_id <= message_ids(d.db), HEAL, f"every message on {d.name} after healing")
    wait_converged(everyone, timeout=HEAL)
    heal_time = time.monotonic() - healed_at
    profiles = [d.profiles() for d in everyone]
    assert all(p == profiles[0] for p in profiles)
    shared = next(p for p in profiles[0] if p["orchestratorId"] == "orch-split")
    assert shared["dynamic"]["currentTask"] in {"the left side's view", "the right side's view"}
    for d in everyone:
        states = d.message_status(hello["l1"])
        assert [s["readAt"] is not None for s in states if s["role"] == "team"] == [True]
    assert not problems, f"converged {heal_time:.1f} s after healing, but: " + "; ".join(problems)
