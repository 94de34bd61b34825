"""Resource updates on every MCP revision, across real processes: the SDK's client of `peerd mcp`
(stdio; mail from `peerd send`, a thread from another `peerd mcp`) and of a daemon's /mcp (HTTP;
mail and thread from a peer daemon), on the handshake revision (``resources/subscribe``), with
auto negotiation and pinned to 2026-07-28 (``subscriptions/listen``); channel events on stdio on
every revision; what ``server/discover`` says; listen streams when the daemon stops.

Absence is checked by order, as in ``tests.channels``: updates go out in arrival order, so once
the update of a later marker arrives, any update a write before it caused has arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.subscriptions import ResourceUpdated
from mcp.types import EmptyResult, SubscribeRequest, SubscribeRequestParams, TextResourceContents
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_server.server import INSTRUCTIONS
from tests.channels import EVENT_WITHIN, Pushes, data, pushed_client
from tests.daemons import PEERD, Daemon, Fleet, wait_until
from tests.localclient import mcp_client
from tests.test_wake import peerd
from tests.waiting import patience

pytest_plugins = ["tests.daemons"]

MODES = ["legacy", "auto", "2026-07-28"]
Updates = asyncio.Queue[str]


def stdio(home: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), *extra])


@asynccontextmanager
async def updates_of(client: Client, pushes: Pushes, uris: Sequence[str]) -> AsyncIterator[Updates]:
    """The URIs of the updates ``client`` hears for ``uris``, in order, as its revision has them:
    ``resources/subscribe`` on the handshake revision (the updates come as notifications), one
    ``subscriptions/listen`` stream at 2026-07-28."""
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        for uri in uris:
            await client.session.send_request(SubscribeRequest(params=SubscribeRequestParams(uri=uri)), EmptyResult)
        yield pushes.updates
        return
    heard: Updates = asyncio.Queue()
    async with client.listen(resource_subscriptions=uris) as stream:
        assert stream.honored.resource_subscriptions == list(uris)

        async def pump() -> None:
            async for event in stream:
                if isinstance(event, ResourceUpdated):
                    await heard.put(event.uri)

        task = asyncio.create_task(pump())
        try:
            yield heard
        finally:
            task.cancel()


async def updates_until(updates: Updates, marker: str) -> list[str]:
    """Every update up to and including the first one of ``marker``."""
    out: list[str] = []
    while not out or out[-1] != marker:
        out.append(await asyncio.wait_for(updates.get(), patience(EVENT_WITHIN)))
    return out


async def shown(client: Client, updates: Updates, uri: str, text: str) -> None:
    """Wait for updates of ``uri`` until reading it shows ``text`` (an update says "read again")."""
    while True:
        await updates_until(updates, uri)
        [content] = (await client.read_resource(uri, cache_mode="bypass")).contents
        if isinstance(content, TextResourceContents) and text in content.text:
            return


@dataclass
class Writer:
    """Another process writing: mail (``send(sender, channel, text)``) and thread tools (``tools``)."""

    send: Callable[[str, str, str], Awaitable[object]]
    tools: Client


async def updates_arrive_and_only_for_what_changed(watcher: Client, pushes: Pushes, writer: Writer) -> None:
    """The one story every transport and revision is held to: mail for another role updates nothing
    of beta's; mail for beta updates beta's inbox; a post in a thread updates the thread."""
    for name in ("alpha", "gamma"):
        await writer.tools.call_tool("create_agent", {"name": name})
    made = data(await writer.tools.call_tool("create_thread", {"participant_names": ["alpha", "gamma"]}))
    beta, delta, thread = "peerd://inbox/beta", "peerd://inbox/delta", f"peerd://thread/{made['thread_id']}"
    async with updates_of(watcher, pushes, [beta, delta, thread]) as updates:
        await writer.send("alpha", "gamma", "not for beta")
        await writer.send("alpha", "delta", "the marker")
        assert beta not in await updates_until(updates, delta)
        await writer.send("alpha", "beta", "for beta")
        await shown(watcher, updates, beta, "for beta")
        await writer.tools.call_tool("append", {"thread_id": made["thread_id"], "sender_name": "gamma",
                                                "content": "in the thread"})
        await shown(watcher, updates, thread, "in the thread")


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_updates_on_every_revision(tmp_path: Path, mode: str) -> None:
    """`peerd mcp --role beta` with no daemon: `peerd send` and another `peerd mcp` (other processes)
    write; the client hears the updates of beta's inbox and of the thread, and none for mail of
    other roles, whichever revision it speaks."""
    home = tmp_path / "home"
    peerd("init", "--home", str(home), "--name", "solo")

    async def send(sender: str, channel: str, text: str) -> object:
        return await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", sender, "--to", channel, text)

    async with pushed_client(stdio(home, "--role", "beta"), mode=mode) as (watcher, pushes), \
            pushed_client(stdio(home)) as (other, _):
        assert (watcher.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode != "legacy")
        await updates_arrive_and_only_for_what_changed(watcher, pushes, Writer(send, other))


@pytest.mark.parametrize("mode", MODES)
async def test_stdio_channel_events_on_every_revision(tmp_path: Path, mode: str) -> None:
    """`peerd mcp --role beta`, no daemon: whichever revision its client speaks, mail for beta from
    `peerd send` arrives as a channel event (on 2026-07-28 too: the pipe carries it from the
    client's first request on); mail for another role does not."""
    home = tmp_path / "home"
    peerd("init", "--home", str(home), "--name", "solo")
    async with pushed_client(stdio(home, "--role", "beta"), mode=mode) as (client, pushes):
        await client.call_tool("whoami", {})
        for to, text in (("gamma", "not for beta"), ("beta", "wake")):
            await asyncio.to_thread(peerd, "send", "--home", str(home), "--from", "alpha", "--to", to, text)
        assert [e.content for e in await pushes.events_until("wake")] == ["wake"]


def live_with(a: Daemon, b: Daemon) -> None:
    wait_until(lambda: (a.peer(b) or {}).get("reachable") and (b.peer(a) or {}).get("reachable"), 30,
               "the two daemons to see each other")


@pytest.mark.parametrize("mode", MODES)
async def test_http_updates_on_every_revision_for_mail_from_a_peer(fleet: Fleet, mode: str) -> None:
    """A client of daemon B's /mcp (bound to beta by header) hears the updates of writes made on
    daemon A (its API and its /mcp), whichever revision it speaks."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    await asyncio.to_thread(live_with, a, b)

    async def send(sender: str, channel: str, text: str) -> object:
        return await asyncio.to_thread(a.send, sender, channel, text)

    pushes = Pushes()
    async with mcp_client(b.info["mcp_url"], b.token, headers={"X-Peerd-Role": "beta"}, mode=mode,
                          extensions=[pushes], message_handler=pushes.on_message) as watcher, \
            mcp_client(a.info["mcp_url"], a.token) as other:
        assert (watcher.protocol_version in MODERN_PROTOCOL_VERSIONS) == (mode != "legacy")
        await updates_arrive_and_only_for_what_changed(watcher, pushes, Writer(send, other))


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_discover_describes_peerd(fleet: Fleet, transport: str) -> None:
    """`server/discover` (auto negotiation) names peerd and its version and offers resources with
    subscribe and tools, no prompts and no list changes; a stdio session bound to a role is a
    channel (claude/channel, the role's instructions), an HTTP request, which has no standing
    stream, is not; `--no-push` is no channel either."""
    version = metadata.version("peerd")
    d = fleet.add("d")
    await asyncio.to_thread(fleet.start, d)
    clients: list[tuple[Callable[[], Any], bool]] = (
        [(lambda: Client(stdio(d.home, "--role", "beta")), True),
         (lambda: Client(stdio(d.home, "--role", "beta", "--no-push")), False)] if transport == "stdio" else
        [(lambda: mcp_client(d.info["mcp_url"], d.token, headers={"X-Peerd-Role": "beta"}), False)])
    for make, channel in clients:
        async with make() as client:
            found = client.session.discover_result
            assert found is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS
            info = client.server_info
            assert info is not None and (info.name, info.version) == ("peerd", version)
            caps = found.capabilities
            assert caps.resources is not None and (caps.resources.subscribe, caps.resources.list_changed) == (True,
                                                                                                            False)
            assert caps.tools is not None and caps.tools.list_changed is False and caps.prompts is None
            if channel:
                assert caps.experimental == {"claude/channel": {}}
                assert "you are the agent 'beta'" in (found.instructions or "")
            else:
                assert not caps.experimental and found.instructions == INSTRUCTIONS


async def test_listen_streams_end_gracefully_when_the_daemon_stops(fleet: Fleet) -> None:
    """2026-07-28 listen streams on a daemon's /mcp, one for a resource and one for list changes
    only, end with the server's graceful close when the daemon stops (no lost stream, no traceback
    in the daemon's log), and do not hold the stop up."""
    d = fleet.add("d")
    await asyncio.to_thread(fleet.start, d)
    async with mcp_client(d.info["mcp_url"], d.token, mode="2026-07-28") as client, \
            client.listen(resource_subscriptions=["peerd://inbox/beta"]) as inbox, \
            client.listen(tools_list_changed=True) as tools:
        stopping = asyncio.create_task(asyncio.to_thread(d.stop))
        for stream in (inbox, tools):
            assert [event async for event in stream] == []  # SubscriptionLost if the stream just dropped
        assert await asyncio.wait_for(stopping, patience(EVENT_WITHIN)) == 0
