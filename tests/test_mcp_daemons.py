"""MCP against real daemons: HTTP on two nodes of a fleet, and stdio with no daemon at all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from tests.daemons import PEERD, Daemon, Fleet, patience, wait_until
from tests.localclient import mcp_client
from tests.waiting import eventually

pytest_plugins = ["tests.daemons"]


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 20,
               "the two daemons to see each other")


async def test_send_on_a_wakes_waiting_check_on_b_and_read_shows_on_a(fleet: Fleet) -> None:
    """Agent on A sends over MCP/HTTP; agent on B blocked in check_messages(wait) wakes with it;
    B marks it read; A's message_status shows it read."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    await asyncio.to_thread(live_with, a, b)
    async with (mcp_client(f"{a.info['mcp_url']}?role=alpha", a.token) as ca,
                mcp_client(f"{b.info['mcp_url']}?role=beta", b.token) as cb):
        before = (await asyncio.to_thread(b.status))["waiting"]
        waiting = asyncio.create_task(cb.call_tool("check_messages", {"wait": 20}))
        await eventually(lambda: b.status()["waiting"] > before, 10, "B's check_messages to wait", in_thread=True)
        assert not waiting.done()
        sent = data(await ca.call_tool("send_message", {"channel": "beta", "content": "across the fleet"}))
        started = asyncio.get_running_loop().time()
        inbox = data(await asyncio.wait_for(waiting, 15))
        woke_after = asyncio.get_running_loop().time() - started
        assert [m["content"] for m in inbox["messages"]] == ["across the fleet"]
        assert woke_after < patience(5), f"B woke {woke_after:.2f} s after the send"
        marked = data(await cb.call_tool("mark_as_read", {"receiptIds": [inbox["messages"][0]["receiptId"]]}))
        assert marked["markedAsRead"] == 1

        async def read_on_a() -> bool:
            status = data(await ca.call_tool("message_status", {"messageId": sent["messageId"]}))
            return any(r["role"] == "beta" and r["readAt"] for r in status["recipients"])

        await eventually(read_on_a, 10, "A to see B's read receipt", interval=0.05)


async def test_offline_stdio_send_is_delivered_once_a_daemon_starts(fleet: Fleet, tmp_path: Path) -> None:
    """With no daemon, `peerd mcp` writes the replica; a daemon started later delivers it to a peer."""
    b = fleet.add("b")
    a = fleet.add("a", seeds=[b])
    fleet.start(b)
    fleet.init([a])
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(a.home), "--role", "alpha"])
    async with Client(params) as c:
        sent = data(await c.call_tool("send_message", {"channel": "beta", "content": "written offline"}))
    assert not b.has_message(sent["messageId"])
    fleet.start(a)
    await asyncio.to_thread(wait_until, lambda: b.has_message(sent["messageId"]), 20, "B to receive the offline write")
    inbox = b.check("beta")
    assert [m["content"] for m in inbox["messages"]] == ["written offline"]
