"""Mail that wakes the agent, across real processes: `peerd mcp` as a Claude Code channel beside two
real daemons and with no daemon at all, and pushes on the daemon's /mcp sessions (HTTP)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from replica.ids import receipt_id
from replica.stamps import ms_of_iso
from tests.channels import data, pushed_client
from tests.daemons import PEERD, Daemon, Fleet, patience, wait_until
from tests.test_wake import mcp_pid, peerd, watchers

pytest_plugins = ["tests.daemons"]


def stdio(home: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), *extra])


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 30,
               "the two daemons to see each other")


async def test_a_message_sent_on_another_daemon_is_pushed_once_with_its_meta(fleet: Fleet) -> None:
    """Two daemons: a message for beta sent on A reaches `peerd mcp --role beta` on B's home as one
    channel event with the ids to act on it; mail for others never comes; a restarted session does
    not repeat it; replay_unread pushes it again."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)
    async with pushed_client(stdio(b.home, "--role", "beta")) as (client, pushes):
        pid = mcp_pid(b.home)
        await asyncio.to_thread(wait_until, lambda: watchers(pid) == 0, 30, "peerd mcp to follow daemon B")
        await asyncio.to_thread(a.send, "alpha", "gamma", "for gamma")
        sent = await asyncio.to_thread(a.send, "alpha", "beta", "from across the fleet", fromInstanceId="a1")
        event = await pushes.next_event()
        assert event.content == "from across the fleet"
        assert {k: event.meta[k] for k in ("message_id", "receipt_id", "from", "from_instance_id", "channel")} == {
            "message_id": sent["messageId"], "receipt_id": receipt_id(sent["messageId"], "beta", ""), "from": "alpha",
            "from_instance_id": "a1", "channel": "beta"}
        assert ms_of_iso(event.meta["created"]) == sent["createdAt"]
        await asyncio.to_thread(a.send, "alpha", "beta", "marker 1")
        assert [e.content for e in await pushes.events_until("marker 1")] == ["marker 1"]
        status = await asyncio.to_thread(b.message_status, sent["messageId"])
        assert status[0]["deliveredAt"] is not None and status[0]["readAt"] is None

    async with pushed_client(stdio(b.home, "--role", "beta")) as (client, pushes):
        await asyncio.to_thread(a.send, "alpha", "beta", "marker 2")
        assert [e.content for e in await pushes.events_until("marker 2")] == ["marker 2"]
        assert data(await client.call_tool("replay_unread", {"limit": 1})) == {"pushed": 1, "more": True}
        assert (await pushes.next_event()).meta["message_id"] == sent["messageId"]


async def test_peerd_send_wakes_a_channel_session_with_no_daemon(tmp_path: Path) -> None:
    """No daemon at all: `peerd send` in another process on the same home is pushed to the
    `peerd mcp --role beta` session; a sender outside --from is not."""
    home = tmp_path / "home"
    peerd("init", "--home", str(home), "--name", "solo")
    async with pushed_client(stdio(home, "--role", "beta", "--from", "alpha")) as (client, pushes):
        init = client.session.initialize_result
        assert init is not None and init.capabilities.experimental == {"claude/channel": {}}
        await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", "mallory", "--to", "beta", "no")
        sent = await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", "alpha", "--to", "beta", "wake")
        events = await pushes.events_until("wake")
        assert [(e.content, e.meta["message_id"]) for e in events] == [("wake", sent["messageId"])]


# -- HTTP: the daemon's /mcp --------------------------------------------------------------------------


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "X-Peerd-Role": "beta"}


def sse_data(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:") and line[5:].strip()]


@asynccontextmanager
async def raw_session(url: str, token: str | None) -> AsyncIterator[tuple[httpx2.AsyncClient, dict[str, str]]]:
    """An MCP session over plain HTTP (with the home's token): initialize and initialized, no GET stream yet."""
    async with httpx2.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
        resp = await http.post(url, json=init, headers=MCP_HEADERS)
        assert resp.status_code == 200, resp.text
        result = (sse_data(resp.text) or [resp.json()])[0]["result"]
        assert result["capabilities"]["experimental"] == {"claude/channel": {}}
        headers = {**MCP_HEADERS, "mcp-session-id": resp.headers["mcp-session-id"],
                   "mcp-protocol-version": result["protocolVersion"]}
        done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        assert done.status_code == 202, done.text
        try:
            yield http, headers
        finally:
            await http.delete(url, headers=headers)


async def test_http_session_push_waits_for_its_stream(fleet: Fleet) -> None:
    """On the daemon's /mcp, mail for a session bound by X-Peerd-Role is pushed on the session's GET
    stream; mail that lands before the stream opens is pushed (and only then recorded delivered)
    once it opens."""
    d = fleet.add("d")
    await asyncio.to_thread(fleet.start, d)
    url = d.info["mcp_url"]
    async with raw_session(url, d.token) as (http, headers):
        early = await asyncio.to_thread(d.send, "alpha", "beta", "before the stream")
        opened_ms = time.time() * 1000
        async with http.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}) as stream:
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            first = await asyncio.wait_for(anext_event(lines), 30)
            assert (first["params"]["content"], first["params"]["meta"]["message_id"]) == ("before the stream",
                                                                                         early["messageId"])
            later = await asyncio.to_thread(d.send, "alpha", "beta", "on the stream")
            second = await asyncio.wait_for(anext_event(lines), 30)
            assert second["params"]["meta"]["message_id"] == later["messageId"]
    delivered = (await asyncio.to_thread(d.message_status, early["messageId"]))[0]["deliveredAt"]
    assert delivered is not None
    assert delivered >= int(opened_ms) - 1  # recorded only once the stream was there


async def anext_event(lines: AsyncIterator[str]) -> dict[str, Any]:
    async for line in lines:
        if line.startswith("data:") and line[5:].strip():
            msg = json.loads(line[5:])
            if msg.get("method") == "notifications/claude/channel":
                return dict(msg)
    raise AssertionError("the stream ended")


async def test_sdk_client_on_http_gets_pushes_for_its_header_role(fleet: Fleet) -> None:
    """An SDK client on /mcp with X-Peerd-Role gets its role's mail pushed, and only its role's."""
    d = fleet.add("d")
    await asyncio.to_thread(fleet.start, d)
    # the first /mcp request waits for the daemon to load MCP: slow on a busy machine (httpx's default is 5 s)
    async with httpx2.AsyncClient(headers={"X-Peerd-Role": "beta", **d.auth}, timeout=patience(30)) as http, pushed_client(
            streamable_http_client(d.info["mcp_url"], http_client=http)) as (client, pushes):
        assert data(await client.call_tool("whoami", {}))["role"] == "beta"
        await asyncio.to_thread(d.send, "alpha", "gamma", "not mine")
        await asyncio.to_thread(d.send, "alpha", "beta", "mine")
        assert [e.content for e in await pushes.events_until("mine")] == ["mine"]
