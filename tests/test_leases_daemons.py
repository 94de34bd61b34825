"""Leases between real daemons: a grant seen on the other daemon, and a split where both sides take
the same exclusive lease (one daemon stopped, its agent writing offline through `peerd mcp`), then
the daemons meet: one winner on both replicas, the loser listed as lost, both holders told by a
channel event in their sessions."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from replica import open_home
from tests.channels import Event, Pushes, data, pushed_client
from tests.daemons import PEERD, Daemon, Fleet, patience, read_only, wait_until
from tests.netns import NetnsLab
from tests.test_daemon_partition import Partition

pytest_plugins = ["tests.daemons"]


def stdio(home: Path, role: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--role", role])


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 60,
               "the two daemons to see each other")


async def tool(client: Client, name: str, **args: Any) -> dict[str, Any]:
    return data(await client.call_tool(name, args))


async def lease_event(pushes: Pushes) -> Event:
    """The next lease event of a session (mail events before it are passed over)."""
    while True:
        event = await pushes.next_event(60)
        if event.meta.get("kind") == "lease_conflict":
            return event


async def test_a_split_take_is_settled_alike_on_both_daemons_and_both_holders_are_told(fleet: Fleet) -> None:
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)
    async with pushed_client(stdio(a.home, "alice")) as (alice, alice_pushes), \
            pushed_client(stdio(b.home, "bob")) as (bob, bob_pushes):
        seen = await tool(alice, "file_reservation_paths", project_key="repo", paths=["docs/"], reason="warm-up")
        warm = seen["granted"][0]["id"]

        async def on_b() -> bool:
            listed = await tool(bob, "list_file_reservations", project_key="repo")
            return warm in {x["id"] for x in listed["file_reservations"]}

        deadline = time.monotonic() + patience(60)
        while not await on_b():  # the grant reaches the other daemon (pushed on write)
            assert time.monotonic() < deadline, "the grant never reached the other daemon"
            await asyncio.sleep(0.05)

        await asyncio.to_thread(b.stop)  # apart: b's agent keeps working offline on b's replica
        first = await tool(alice, "file_reservation_paths", project_key="repo", paths=["src/"],
                           reason="refactor", ttl_seconds=3600)
        second = await tool(bob, "file_reservation_paths", project_key="repo", paths=["src/api.py"],
                            reason="bugfix", ttl_seconds=3600)
        (won,), (lost,) = first["granted"], second["granted"]  # each side granted its own: neither saw the other

        await asyncio.to_thread(b.start)  # they meet again
        told_alice, told_bob = await lease_event(alice_pushes), await lease_event(bob_pushes)
        assert (told_alice.meta["outcome"], told_alice.meta["lease_id"], told_alice.meta["winner_id"]) == \
            ("won", lost["id"], won["id"])
        assert (told_bob.meta["outcome"], told_bob.meta["lease_id"], told_bob.meta["winner"]) == \
            ("lost", lost["id"], "alice")
        assert "LOST" in told_bob.content and "refactor" in told_bob.content
        for client in (alice, bob):
            listed = await tool(client, "list_file_reservations", project_key="repo")
            (conflict,) = listed["conflicts"]
            assert (conflict["lost"]["id"], conflict["winner"]["id"]) == (lost["id"], won["id"])
            status = {x["id"]: x["status"] for x in listed["file_reservations"]}
            assert (status[won["id"]], status[lost["id"]]) == ("held", "lost")
        refused = await tool(bob, "file_reservation_paths", project_key="repo", paths=["src/api.py"])
        assert refused["granted"] == [] and refused["conflicts"][0]["holders"][0]["agent"] == "alice"


async def test_an_acknowledgement_travels_back_and_the_overdue_view_names_who_is_left(fleet: Fleet) -> None:
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)
    async with pushed_client(stdio(a.home, "alice")) as (alice, _), \
            pushed_client(stdio(b.home, "bob")) as (bob, bob_pushes):
        sent = await tool(alice, "send_message", channel="bob,carol", content="merge freeze at 17:00",
                          ack_required=True)
        mid = sent["messageId"]
        while (await bob_pushes.next_event(60)).meta.get("message_id") != mid:
            pass
        acked = await tool(bob, "acknowledge_message", messageId=mid)
        assert acked["acknowledged"] and acked["acknowledged_at"] and acked["read_at"]

        def acknowledged_on_a() -> bool:
            return any(r["acknowledgedAt"] for r in a.message_status(mid) if r["role"] == "bob")

        await asyncio.to_thread(wait_until, acknowledged_on_a, 60, "bob's acknowledgement to reach a")
        status = await tool(alice, "list_broadcast_status", messageId=mid)
        acks = {r["recipient"]: r["acknowledgedAt"] is not None for r in status["receipts"]}
        assert acks == {"bob": True, "carol": False}
        overdue = await tool(alice, "overdue_acks", ttl_seconds=0)
        assert [(m["message_id"], [w["role"] for w in m["waiting_for"]]) for m in overdue["messages"]] == \
            [(mid, ["carol"])]


@pytest.mark.netns
def test_a_real_partition_between_namespaces_is_settled_alike_on_both_sides(tmp_path: Path) -> None:
    """Two daemons in network namespaces joined by a router: a grant reaches the other side in about a
    second; with the link cut both sides grant the same exclusive path; after the heal both replicas
    hold the earlier take, list the later one as lost to it, and name it among the losses they tell."""
    with NetnsLab.create() as lab:
        part = Partition(lab)
        fleet = Fleet(tmp_path / "fleet")
        try:
            left, right = (fleet.add(name, port=port, host=node.address, exec_prefix=node.exec_prefix(),
                                     transport=fleet.relay(node.exec_prefix()))
                           for name, port, node in (("l1", 7861, part.left), ("r1", 7862, part.right)))
            fleet.mesh()
            fleet.start()
            with open_home(left.home) as rep:  # as `peerd mcp` writes: the daemon notices and pushes
                warm = rep.reserve("repo", "carol", ["docs/"]).granted[0].id
            began = time.monotonic()
            wait_until(lambda: lease_on(right, warm), 30, "the grant on the other side")
            seen_after = time.monotonic() - began

            part.cut()
            with open_home(left.home) as rep:
                won = rep.reserve("repo", "alice", ["src/"], reason="refactor").granted[0].id
            with open_home(right.home) as rep:
                lost = rep.reserve("repo", "bob", ["src/api.py"], reason="bugfix").granted[0].id
            assert not lease_on(right, won) and not lease_on(left, lost)

            part.heal()
            for d in (left, right):
                wait_until(lambda d=d: lease_on(d, won) and lease_on(d, lost), 60, f"both takes on {d.name}")
                with open_home(d.home) as rep:
                    assert (rep.lease(won).status, rep.lease(lost).status, rep.lease(lost).lost_to) == \
                        ("held", "lost", won)
                    assert [(x.lost.id, x.winner and x.winner.id) for x in rep.lease_losses()] == [(lost, won)]
        finally:
            fleet.close()
    assert seen_after < patience(5), f"a grant took {seen_after:.1f} s to reach the other side"


def lease_on(d: Daemon, lid: str) -> bool:
    with read_only(d.db) as conn:
        return conn.execute("SELECT 1 FROM leases WHERE id = ?", (lid,)).fetchone() is not None
