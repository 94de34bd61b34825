"""Five real daemons as separate processes: messages, receipts and profiles reach every node; peer exchange."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from replica import open_home
from tests.daemons import Daemon, Fleet, wait_until

pytest_plugins = ["tests.daemons"]

SPREAD = 20.0  # seconds for a write to reach every node (push on write makes it well under 1 s)


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Daemon]]:
    """Five daemons, each seeded with the four others, shared by this module's fleet tests."""
    fleet = Fleet(tmp_path_factory.mktemp("five"))
    try:
        daemons = [fleet.add(f"n{i}") for i in range(5)]
        fleet.mesh()
        fleet.start()
        wait_until(lambda: all(any(p["reachable"] for p in d.peers()) for d in daemons), SPREAD,
                   "every node to have a live peer")
        yield daemons
    finally:
        fleet.close()


def test_every_seed_is_contacted(five: list[Daemon]) -> None:
    """Every daemon gets in touch with each of its four seeds soon after start (all show live in its table)."""

    def all_live() -> bool:
        return all(sorted(p["address"] for p in d.peers() if p["reachable"]) == sorted(d.seeds) for d in five)

    wait_until(all_live, 15, "every seed live in every peer table")


def test_message_written_on_any_node_is_readable_on_all(five: list[Daemon]) -> None:
    """A message sent through any one of five daemons shows up in the inbox on every daemon."""
    sent = {d.name: d.send(f"writer-{d.name}", "reader", f"hello from {d.name}")["messageId"] for d in five}

    def inbox_complete(d: Daemon) -> bool:
        got = {m["messageId"]: m["content"] for m in d.check("reader", d.name)["messages"]}
        return got == {mid: f"hello from {name}" for name, mid in sent.items()}

    for d in five:
        wait_until(lambda d=d: inbox_complete(d), SPREAD, f"all five messages in {d.name}'s inbox")


def test_read_receipt_marked_on_one_node_shows_on_all(five: list[Daemon]) -> None:
    """A message read on another node is reported read by message_status on the sender's node and on all."""
    sender, reader = five[0], five[3]
    mid = sender.send("boss", "worker", "do the thing")["messageId"]
    msgs = wait_until(lambda: reader.check("worker")["messages"], SPREAD, "the message at the reader")
    assert [m["messageId"] for m in msgs] == [mid]
    assert reader.mark_read([msgs[0]["receiptId"]]) == 1

    def read_everywhere() -> bool:
        states = [d.message_status(mid) for d in five]
        return all(len(s) == 1 and s[0]["role"] == "worker" and s[0]["readAt"] is not None for s in states)

    wait_until(read_everywhere, SPREAD, "the read receipt on every node")
    assert sender.message_status(mid)[0]["receiptId"] == msgs[0]["receiptId"]
    assert reader.check("worker")["messages"] == []


def test_concurrent_profile_updates_converge_to_one_winner(five: list[Daemon]) -> None:
    """Five nodes updating one profile field at once end with the same winner, profiles and digest everywhere."""
    barrier = threading.Barrier(len(five))
    errors: list[BaseException] = []

    def update(d: Daemon) -> None:
        try:
            barrier.wait(10)
            for round_ in range(3):
                d.update_profile("orch-shared", dynamic=f"{d.name} round {round_}", name=f"named by {d.name}")
        except BaseException as exc:  # reported below; a thread must not swallow it
            errors.append(exc)

    threads = [threading.Thread(target=update, args=(d,)) for d in five]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors

    def same_profiles() -> list[dict[str, object]] | None:
        views = [d.profiles() for d in five]
        return views[0] if all(v == views[0] for v in views) else None

    profiles = wait_until(same_profiles, SPREAD, "the same profiles on every node")
    shared = next(p for p in profiles if p["orchestratorId"] == "orch-shared")
    assert shared["dynamic"]["currentTask"] in {f"{d.name} round 2" for d in five}
    assert shared["name"] in {f"named by {d.name}" for d in five}
    digests = {d.digest() for d in five}
    assert len(digests) == 1, digests


def test_write_by_another_process_on_a_running_daemons_replica_spreads(five: list[Daemon]) -> None:
    """A message written straight into a running daemon's replica file (e.g. `peerd mcp`) reaches every node."""
    with open_home(five[1].home) as rep:
        mid = rep.send_message("offline-tool", "auditor", "written beside the daemon").id
    for d in five:
        wait_until(lambda d=d: d.has_message(mid), SPREAD, f"the side-written message on {d.name}")


def test_peer_exchange_introduces_a_peer_seen_only_by_a_seed(fleet: Fleet) -> None:
    """C, seeded only with B, learns A from B and syncs with A directly (both peer tables show it)."""
    a = fleet.add("a")
    b = fleet.add("b", seeds=[a])
    c = fleet.add("c", seeds=[b])
    fleet.start(a, b)
    wait_until(lambda: (row := b.peer(a)) is not None and row["reachable"], SPREAD, "b to reach a")
    fleet.start(c)

    # a may call c first (a hears of c from b too): c then lists a as "inbound" until b's exchange names it
    row = wait_until(lambda: (r := c.peer(a)) is not None and r["reachable"] and r["found_by"] == "exchange" and r,
                     30, "c to reach a, known by b's exchange")
    assert row["address"] == a.addr
    wait_until(lambda: a.peer(c) is not None, 30, "a's table to list c")

    # Direct sync: a message a writes reaches c, and c's table shows a fresh sync with a.
    mid = a.send("alpha", "gamma", "straight from a")["messageId"]
    wait_until(lambda: c.has_message(mid), SPREAD, "a's message on c")
    wait_until(lambda: (r := c.peer(a)) is not None and r["last_sync_ago"] is not None, 30, "c to have synced with a")
    # Liveness gossip: c knows a's name without ever having been told it directly by config.
    wait_until(lambda: (r := c.peer(a)) is not None and r["name"] == "a", 30, "c to learn a's name")
