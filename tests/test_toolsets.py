"""Tool sets: `peerd mcp --tools vantage|agentmsgs|all`, and the same choice per HTTP session by the
X-Peerd-Tools header or ?tools=; the vantage list stays small; the default is every tool."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mcp_server import SessionBinding, Wiring, build_server
from mcp_server.arguments import TOOL_SET_NAMES
from mcp_server.tools import TOOLS
from mcp_server.toolsets import AGENTMSGS, TOOL_SETS, VANTAGE, VANTAGE_BUDGET
from replica import Replica, open_home
from tests.daemons import PEERD, Fleet

pytest_plugins = ["tests.daemons"]

EVERY = {spec.name for spec in TOOLS}


def size(tools: list[Any]) -> int:
    """Bytes of a tools/list result as it travels."""
    return len(json.dumps({"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]}))


@pytest.fixture
def replica(tmp_path: Path) -> Replica:
    return open_home(tmp_path / "home")


def test_the_command_line_names_every_set() -> None:
    assert set(TOOL_SET_NAMES) == set(TOOL_SETS)


async def test_each_set_lists_its_tools_and_the_default_lists_all(replica: Replica) -> None:
    wiring = Wiring.over(replica)
    try:
        for name, expected in (("all", EVERY), ("vantage", VANTAGE - {"replay_unread"}),
                               ("agentmsgs", AGENTMSGS)):
            async with Client(build_server(replica, waiter=wiring.waiter, tools=name)) as c:
                tools = (await c.list_tools()).tools
                assert {t.name for t in tools} == expected, name
                assert all((t.output_schema is not None) == (name == "all") for t in tools if t.name != "get_profile")
        async with Client(build_server(replica, waiter=wiring.waiter)) as c:
            assert {t.name for t in (await c.list_tools()).tools} == EVERY
    finally:
        wiring.close()
        replica.close()


async def test_the_vantage_list_fits_its_budget_with_the_push_tool(replica: Replica) -> None:
    """A bound stdio session (a Claude Code channel) lists replay_unread too; still within 12 KB."""
    wiring = Wiring.over(replica)
    server, hub = wiring.stdio_server(SessionBinding("alpha"), tools="vantage")
    try:
        async with Client(server) as c:
            tools = (await c.list_tools()).tools
            assert {t.name for t in tools} == VANTAGE and size(tools) <= VANTAGE_BUDGET
            async with Client(build_server(replica, waiter=wiring.waiter)) as full:
                assert size((await full.list_tools()).tools) > 2 * VANTAGE_BUDGET  # what a lean set saves
    finally:
        await hub.aclose()
        wiring.close()
        replica.close()


async def test_a_tool_outside_the_set_is_refused(replica: Replica) -> None:
    wiring = Wiring.over(replica)
    try:
        async with Client(build_server(replica, waiter=wiring.waiter, tools="vantage")) as c:
            out = await c.call_tool("create_agent", {"name": "alice"})
            assert out.is_error and "not in this session's tool set 'vantage'" in out.content[0].text  # type: ignore[union-attr]
            assert replica.find_agent("alice") is None
            sent = await c.call_tool("send_message", {"from": "a", "channel": "b", "content": "x"})
            assert not sent.is_error
    finally:
        wiring.close()
        replica.close()


async def test_peerd_mcp_tools_flag_over_stdio(tmp_path: Path) -> None:
    home = tmp_path / "home"
    await asyncio.to_thread(subprocess.run, [str(PEERD), "init", "--home", str(home)], check=True,
                            capture_output=True)
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--tools", "agentmsgs"])
    async with Client(params) as c:
        assert {t.name for t in (await c.list_tools()).tools} == AGENTMSGS


async def _names(url: str, headers: dict[str, str]) -> set[str]:
    async with (httpx2.AsyncClient(headers=headers, timeout=60) as http,
                Client(streamable_http_client(url, http_client=http)) as c):
        return {t.name for t in (await c.list_tools()).tools}


async def test_http_sessions_choose_by_header_or_query(fleet: Fleet) -> None:
    d = fleet.add("a")
    fleet.start()
    url = str(d.info["mcp_url"])
    assert await _names(url, d.auth) == EVERY | {"replay_unread"}  # HTTP sessions get pushes
    assert await _names(url, {"X-Peerd-Tools": "vantage", **d.auth}) == VANTAGE  # replay_unread too: HTTP pushes
    assert await _names(f"{url}?tools=agentmsgs", d.auth) == AGENTMSGS
