"""Role pins and the sending node on real daemons: a pin written with the CLI reaches the fleet,
refuses sends in the role's name from other nodes (CLI and MCP) and a forged op pushed over the
wire, even one stamped before the pin (counted in status and doctor, held back: never shown),
survives restarts and reaches a late joiner;
every message read carries the node that sent it (check_messages, channel meta, inbox --json)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters

from peerd import doctor, protocol
from peerd.config import decode_fleet_key
from peerd.seal import open_sealed, seal
from replica import hlc as hlcmod
from replica import identity, key_path
from replica import ops as opsmod
from tests.channels import data, pushed_client
from tests.daemons import PEERD, Daemon, Fleet, patience, post_raw, read_only, wait_until
from tests.localclient import mcp_client

pytest_plugins = ["tests.daemons"]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *args, "--home", str(home)], capture_output=True, text=True,
                          timeout=patience(60), check=False)


def pins_held(d: Daemon) -> int:
    with read_only(d.db) as conn:
        return int(conn.execute("SELECT count(*) FROM role_pins").fetchone()[0])


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 30,
               "the two daemons to see each other")


def forged(ident: identity.Identity, seq: int, sender: str, text: str, ago_ms: int = 0) -> bytes:
    """A message op signed as ``ident`` (a member's own key) at ``seq``, stamped ``ago_ms`` before now."""
    body = {"f": sender, "fi": None, "c": "bob", "ti": None, "t": None, "x": text}
    return opsmod.encode(ident.public_key, seq, hlcmod.pack(time.time_ns() // 1_000_000 - ago_ms), "msg", body,
                         sign=ident.sign)


def forged_push(fleet: Fleet, target: Daemon, raw: bytes) -> dict[str, Any]:
    """Push ``raw`` to ``target`` over the sealed wire, as a peer would; the decoded reply."""
    key = decode_fleet_key(fleet.key)
    status, reply = post_raw(target.peer_url, seal(key, protocol.encode({"t": "push", "o": [raw], "n": b"\0" * 8})))
    assert status == 200, reply
    return dict(protocol.decode(open_sealed(key, reply)))


def test_a_pin_binds_the_fleet_refuses_forgeries_and_outlives_restarts(fleet: Fleet) -> None:
    a, b, m = fleet.add("a"), fleet.add("b"), fleet.add("m")
    fleet.mesh()
    fleet.start()
    fleet.wait_converged()
    before = b.send("alice", "bob", "before the pin")
    pinned = cli(a.home, "role", "pin", "alice", "a", "--json")
    assert pinned.returncode == 0, pinned.stderr
    assert [n["id"] for n in json.loads(pinned.stdout)["nodes"]] == [a.node_id]
    wait_until(lambda: pins_held(b) == 1 and pins_held(m) == 1, 30, "the pin on b and m")

    refused = cli(b.home, "send", "--from", "alice", "--to", "bob", "in alice's name")
    assert refused.returncode == 1
    assert f"pinned to a ({a.node_id[:16]})" in refused.stderr, refused.stderr
    carol = b.send("carol", "bob", "an unpinned role is unchanged")
    ours = a.send("alice", "bob", "from the pinned node")
    wait_until(lambda: b.has_message(ours["messageId"]) and a.has_message(carol["messageId"]), 30, "both messages across")
    assert b.has_message(before["messageId"])  # sent before the pin: kept everywhere

    # m's own key signs a message in alice's name, stamped an hour before the pin (a writer chooses
    # its stamp, not its seq), pushed to a and b as m would: held back (stored, never shown), counted.
    m.stop()  # its key signs what it never wrote; it stays down, so no seq of it is used twice
    ident = identity.load_or_create(key_path(m.db))
    with read_only(a.db) as conn:
        row = conn.execute("SELECT contig FROM origins WHERE node = ?", (ident.public_key,)).fetchone()
    seq = int(row[0]) + 1  # m's next seq (the fleet converged: a holds all of m's ops)
    money = forged(ident, seq, "alice", "wire me the money", ago_ms=3_600_000)
    assert forged_push(fleet, a, money)["new"] == 1
    assert a.status()["totals"]["pin_refused"] == 1
    # a relays what it holds back (every replica judges it alike), so b may hold it already
    assert forged_push(fleet, b, money)["new"] in (0, 1)
    wait_until(lambda: b.status()["totals"]["pin_refused"] == 1, 30, "b to hold the forged op back")
    forged_id = opsmod.message_id(ident.public_key, seq)
    assert not a.has_message(forged_id) and not b.has_message(forged_id)
    assert forged_push(fleet, a, forged(ident, seq + 1, "mallory", "my own name"))["new"] == 1  # m's later ops land
    report = doctor.run_checks(a.home, timeout=patience(5))
    found = next(f for f in report.findings if f.check == "replica")
    assert found.status == doctor.WARN and "pinned to other nodes" in found.detail
    assert "pins    1 op from peers refused" in cli(a.home, "status").stdout

    a.stop()
    b.stop()
    fleet.start(a, b)
    again = cli(b.home, "send", "--from", "alice", "--to", "bob", "after the restart")
    assert again.returncode == 1 and "pinned" in again.stderr
    assert a.status()["totals"]["pin_refused"] == 1
    roles = json.loads(cli(b.home, "roles", "--json").stdout)
    alice = next(r for r in roles if r["role"] == "alice")
    assert [n["id"] for n in alice["pinned_to"]] == [a.node_id]
    assert {s["node"]["id"] for s in alice["senders"]} == {a.node_id, b.node_id}

    late = fleet.add("late", seeds=[a])
    fleet.start(late)
    wait_until(lambda: pins_held(late) == 1, 30, "the pin on the late joiner")
    assert cli(late.home, "send", "--from", "alice", "--to", "bob", "late").returncode == 1
    assert cli(a.home, "role", "unpin", "alice").returncode == 0
    wait_until(lambda: pins_held(late) == 2, 30, "the unpin on the late joiner")
    assert cli(late.home, "send", "--from", "alice", "--to", "bob", "free again").returncode == 0


def stdio(home: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), *extra])


async def test_every_message_read_says_which_node_sent_it(fleet: Fleet) -> None:
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)
    await asyncio.to_thread(fleet.wait_converged)  # the admits that name both nodes
    node_a = {"id": a.node_id, "name": "a"}
    async with pushed_client(stdio(b.home, "--role", "bob")) as (_client, pushes):
        sent = await asyncio.to_thread(a.send, "alice", "bob", "which machine?")
        event = await pushes.next_event()
        assert event.meta["message_id"] == sent["messageId"]
        assert (event.meta["from_node"], event.meta["from_node_name"]) == (a.node_id, "a")
    async with mcp_client(f"{b.info['mcp_url']}?role=bob", b.token) as cb:
        inbox = data(await cb.call_tool("check_messages", {}))
        assert [(m["messageId"], m["fromNode"]) for m in inbox["messages"]] == [(sent["messageId"], node_a)]
    shown = await asyncio.to_thread(cli, b.home, "inbox", "bob", "--all", "--json")
    (item,) = json.loads(shown.stdout)["messages"]
    assert item["fromNode"] == node_a
    text = await asyncio.to_thread(cli, b.home, "inbox", "bob", "--all")
    assert f"from node a ({a.node_id[:16]})" in text.stdout

    assert (await asyncio.to_thread(cli, a.home, "role", "pin", "alice", a.node_id[:8])).returncode == 0
    await asyncio.to_thread(wait_until, lambda: pins_held(b) == 1, 30, "the pin on b")
    async with mcp_client(f"{b.info['mcp_url']}?role=alice", b.token) as alice_on_b:
        result = await alice_on_b.call_tool("send_message", {"channel": "bob", "content": "not from b"})
        assert result.is_error
        said = " ".join(getattr(c, "text", "") for c in result.content)
        assert f"pinned to a ({a.node_id[:16]})" in said, said
