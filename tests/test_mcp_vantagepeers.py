"""VantagePeers' own examples, run verbatim against peerd: over stdio (``python -m mcp_server``, a
process of its own) and over HTTP on a real daemon's ``/mcp``.

The payloads are VantagePeers' documentation (its French docs "Messagerie" and "Ajouter un
orchestrateur") and the fixtures of its own tests, as gathered in docs/migrating.md; where peerd's
answer differs (ids, structured results, waiting for unknown roles), the test says so.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from mcp_server import TOOLS
from peerd.local import MAX_BODY_BYTES
from replica import open_home
from replica.ops import MAX_CONTENT_BYTES, MAX_JSON_REQUEST_BYTES
from replica.stamps import iso_ms, ms_of_iso
from tests.daemons import Fleet, message_ids, read_only, wait_until
from tests.localclient import mcp_client

pytest_plugins = ["tests.daemons"]

REPO = Path(__file__).resolve().parent.parent
VP_TOOLS = {"send_message", "check_messages", "mark_as_read", "delete_message", "get_message", "list_messages",
            "list_broadcast_status", "search_messages_by_keyword", "set_summary", "list_peers", "get_profile",
            "update_profile"}


@asynccontextmanager
async def vp_client(kind: str, tmp_path: Path, fleet: Fleet) -> AsyncIterator[Client]:
    """An unbound client, as VantagePeers' agents connect: a stdio server process, or a daemon's /mcp."""
    if kind == "stdio":
        home = tmp_path / "home"
        open_home(home).close()
        uv = shutil.which("uv")
        assert uv is not None
        params = StdioServerParameters(command=uv, cwd=REPO, env={"UV_PYTHON_DOWNLOADS": "never"},
                                       args=["run", "--no-sync", "python", "-m", "mcp_server", "--home", str(home)])
        async with Client(params) as client:
            yield client
    else:
        daemon = fleet.add("a")
        await asyncio.to_thread(fleet.start)
        async with mcp_client(daemon.info["mcp_url"], daemon.token) as client:
            yield client


@pytest.fixture(params=["stdio", "daemon-http"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A successful call's result: structured content, the same as the JSON text."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


async def refused(client: Client, tool: str, args: dict[str, Any]) -> str:
    """A refused call's text: ``invalid_argument: ...`` or ``not_found: ...``."""
    result = await client.call_tool(tool, args)
    assert result.is_error and result.structured_content is None, result
    return text(result)


async def drain(client: Client, recipient: str, instance: str | None = None) -> list[str]:
    """Read and mark read everything waiting for ``recipient``; the contents, oldest first."""
    args: dict[str, Any] = {"recipient": recipient, "limit": 50}
    if instance is not None:
        args["recipientInstanceId"] = instance
    contents: list[str] = []
    while True:
        page = await call(client, "check_messages", args)
        if not page["messages"]:
            return contents
        contents += [m["content"] for m in page["messages"]]
        await call(client, "mark_as_read", {"receiptIds": [m["receiptId"] for m in page["messages"]]})


async def test_every_vantagepeers_tool_is_listed(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """The tools VantagePeers advertises are all there, beside peerd's own."""
    async with vp_client(kind, tmp_path, fleet) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names >= VP_TOOLS and names == {t.name for t in TOOLS} | {"replay_unread"}


async def test_messaging_docs_examples(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """"Messagerie": direct, broadcast, multi-target and instance-targeted sends; check and mark by receipt."""
    async with vp_client(kind, tmp_path, fleet) as client:
        direct = await call(client, "send_message", {
            "from": "alice", "channel": "bob", "content": "Phase 1 complete. Nav and Hero sections migrated."})
        assert (direct["from"], direct["channel"], len(direct["messageId"]) > 0) == ("alice", "bob", True)
        await call(client, "send_message", {
            "from": "bob", "channel": "broadcast",
            "content": "Merge freeze starts Thursday. No non-critical commits after 2026-04-03."})
        multi = await call(client, "send_message", {
            "from": "bob", "channel": "tau,phi", "content": "New mission created: landing-page-phase-2. Check your tasks."})
        assert multi["recipients"] == ["tau", "phi"]
        await call(client, "send_message", {"from": "bob", "channel": "alice", "content": "Deploy the landing page preview."})
        await call(client, "send_message", {  # instanceId: a peerd extra (VantagePeers refuses it)
            "from": "bob", "channel": "alice", "instanceId": "tau-laptop",
            "content": "This is for the laptop instance specifically."})
        await call(client, "send_message", {
            "from": "alice", "channel": "bob",
            "content": "Task task-abc123 complete. LandingNav migrated to lit-ui. Biome and tsc passing. PR #47 submitted."})

        inbox = await call(client, "check_messages", {"recipient": "alice", "recipientInstanceId": "tau-main"})
        assert [m["content"] for m in inbox["messages"]] == [
            "Merge freeze starts Thursday. No non-critical commits after 2026-04-03.", "Deploy the landing page preview."]
        first = inbox["messages"][0]
        assert {"messageId", "receiptId", "from", "fromInstanceId", "channel", "content", "createdAt", "readAt"} <= set(first)
        assert (first["from"], first["channel"], first["readAt"]) == ("bob", "broadcast", None)
        assert isinstance(first["createdAt"], int)
        again = await call(client, "check_messages", {"recipient": "alice", "recipientInstanceId": "tau-main"})
        assert [m["receiptId"] for m in again["messages"]] == [m["receiptId"] for m in inbox["messages"]]  # not read yet
        marked = await call(client, "mark_as_read", {"receiptIds": [m["receiptId"] for m in inbox["messages"]]})
        assert (marked["markedAsRead"], marked["unknown"]) == (2, [])
        assert await drain(client, "alice", "tau-main") == []
        assert await drain(client, "alice", "tau-laptop") == [
            "Merge freeze starts Thursday. No non-critical commits after 2026-04-03.", "Deploy the landing page preview.",
            "This is for the laptop instance specifically."]
        assert await drain(client, "tau") == [
            "Merge freeze starts Thursday. No non-critical commits after 2026-04-03.",
            "New mission created: landing-page-phase-2. Check your tasks."]
        assert len(await drain(client, "bob")) == 2  # alice's two reports, not bob's own broadcast


async def test_adding_an_orchestrator_example(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """"Ajouter un orchestrateur": update_profile with static/dynamic objects, a broadcast, an instance send,
    and list_peers; then updating dynamic.currentTask alone keeps the rest."""
    async with vp_client(kind, tmp_path, fleet) as client:
        now = ms_of_iso(iso_ms(1_780_000_000_000))
        made = await call(client, "update_profile", {
            "orchestratorId": "delta", "name": "Delta",
            "static": {"role": "Spécialiste des pipelines de données", "workspace": "/home/user/projects",
                       "capabilities": ["etl", "sql", "python"]},
            "dynamic": {"currentTask": "Configuration initiale", "lastSeen": now, "sessionCount": 1}})
        assert (made["orchestratorId"], made["name"], made["profileId"].startswith("pf_")) == ("delta", "Delta", True)
        await call(client, "send_message", {"from": "delta", "channel": "broadcast",
                                            "content": "Delta en ligne — connecté à VantagePeers."})
        await call(client, "send_message", {"from": "delta", "fromInstanceId": "delta-laptop", "channel": "delta",
                                            "content": "Message à toute instance delta"})
        assert await drain(client, "delta", "delta-server") == [
            "Delta en ligne — connecté à VantagePeers.", "Message à toute instance delta"]
        assert await drain(client, "delta", "delta-laptop") == ["Delta en ligne — connecté à VantagePeers."]
        assert await drain(client, "gamma") == ["Delta en ligne — connecté à VantagePeers."]

        await call(client, "update_profile", {"orchestratorId": "Delta", "dynamic": {"currentTask": "ETL nightly"}})
        got = await call(client, "get_profile", {"orchestratorId": "DELTA"})
        assert got["static"]["capabilities"] == ["etl", "sql", "python"]  # the profile itself, as VantagePeers
        assert got["dynamic"] == {"currentTask": "ETL nightly", "lastSeen": now, "sessionCount": 1}
        peers = (await call(client, "list_peers", {}))["items"]
        mine = next(p for p in peers if p["instanceId"] == "delta")
        assert (mine["id"], mine["name"], mine["role"], mine["currentTask"], mine["sessionCount"]) == (
            "delta", "Delta", "Spécialiste des pipelines de données", "ETL nightly", 1)
        assert {p["instanceId"] for p in peers} == {"delta", "delta-laptop"}  # the laptop is seen sending
        unknown = await client.call_tool("get_profile", {"orchestratorId": "nobody"})
        assert (unknown.is_error, unknown.structured_content, text(unknown)) == (False, None, "null")


async def test_check_messages_envelope_examples(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """VantagePeers' check_messages tests: instance addresses, limit and truncation, the byte budget
    (40,000 bytes, at least one message), since resuming exactly, instance + role without duplicates."""
    async with vp_client(kind, tmp_path, fleet) as client:
        async def send(channel: str, content: str, n: int = 1) -> None:
            for i in range(n):
                await call(client, "send_message", {"from": "alpha", "channel": channel, "content": content or str(i)})

        vps = {"recipient": "sigma", "recipientInstanceId": "sigma-vps"}
        await send("sigma-vps", "", 3)  # 1: an instance address
        page = await call(client, "check_messages", vps)
        assert (len(page["messages"]), page["truncated"]) == (3, False)
        await drain(client, "sigma", "sigma-vps")

        await send("sigma-vps", "", 5)  # 2: limit
        page = await call(client, "check_messages", {**vps, "limit": 2})
        assert (len(page["messages"]), page["truncated"], isinstance(page["nextSince"], int)) == (2, True, True)
        await drain(client, "sigma", "sigma-vps")

        await send("sigma-vps", "", 4)  # 3: resuming with since = nextSince
        one = await call(client, "check_messages", {**vps, "limit": 2})
        two = await call(client, "check_messages", {**vps, "limit": 2, "since": one["nextSince"]})
        assert (one["truncated"], two["truncated"], len(two["messages"])) == (True, False, 2)
        assert len({m["receiptId"] for m in one["messages"] + two["messages"]}) == 4
        await drain(client, "sigma", "sigma-vps")

        await send("sigma-vps", "x" * 20_000, 3)  # 4: the byte budget
        page = await call(client, "check_messages", {**vps, "limit": 5})
        assert (len(page["messages"]), page["truncated"]) == (2, True)
        await drain(client, "sigma", "sigma-vps")
        await send("sigma-vps", "y" * 50_000, 2)  # 5: one message even over the budget
        page = await call(client, "check_messages", {**vps, "limit": 5})
        assert (len(page["messages"]), page["truncated"]) == (1, True)
        await drain(client, "sigma", "sigma-vps")

        await send("sigma", "to the role")  # 6: role and instance, once each
        await send("sigma-vps", "to the instance")
        page = await call(client, "check_messages", vps)
        assert sorted(m["content"] for m in page["messages"]) == ["to the instance", "to the role"]
        await drain(client, "sigma", "sigma-vps")

        await drain(client, "sigma")  # receipts are per instance: the role without one still has case 6's
        await send("sigma", "", 2)  # 7: only the role's own
        await send("kappa", "", 2)
        assert len((await call(client, "check_messages", {"recipient": "sigma"}))["messages"]) == 2

        await call(client, "send_message", {"from": "pi", "channel": "omega", "content": "hello"})
        [item] = (await call(client, "check_messages", {"recipient": "omega"}))["messages"]
        assert (item["from"], item["content"], isinstance(item["createdAt"], int)) == ("pi", "hello", True)
        empty = await call(client, "check_messages", {"recipient": "nobody-at-all"})
        assert (empty["messages"], empty["truncated"]) == ([], False)


async def test_broadcast_status_set_summary_and_list_peers_examples(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """list_broadcast_status per recipient (limit truncates), set_summary's strict arguments, list_peers' item."""
    async with vp_client(kind, tmp_path, fleet) as client:
        for role in ("tau", "phi", "sigma"):
            await call(client, "update_profile", {"orchestratorId": role, "name": role})
        sent = await call(client, "send_message", {"from": "pi", "channel": "broadcast", "content": "all hands"})
        await drain(client, "tau")
        await drain(client, "sigma")
        status = await call(client, "list_broadcast_status", {"messageId": sent["messageId"]})
        assert (status["messageId"], status["from"], status["channel"], status["truncated"]) == (
            sent["messageId"], "pi", "broadcast", False)
        assert {r["recipient"]: r["read"] for r in status["receipts"]} == {"tau": True, "phi": False, "sigma": True}
        assert all(isinstance(r["readAt"], int) for r in status["receipts"] if r["read"])
        short = await call(client, "list_broadcast_status", {"messageId": sent["messageId"], "limit": 2})
        assert (len(short["receipts"]), short["truncated"]) == (2, True)

        summary = {"orchestratorId": "alpha", "instanceId": "alpha-vps", "summary": "Standardizing tool descriptions"}
        got = await call(client, "set_summary", {**summary, "endOfDayIndex": "EOD-INDEX 2026-08-14: 3 tasks closed"})
        assert {k: got[k] for k in summary} == summary
        assert {k: v for k, v in (await call(client, "set_summary", summary)).items() if k in summary} == summary
        message = await refused(client, "set_summary", {**summary, "bogusStaleParam": "should-not-vanish-silently"})
        assert message.startswith("invalid_argument: unknown argument 'bogusStaleParam'")

        await call(client, "update_profile", {
            "orchestratorId": "clio", "name": "clio",
            "static": {"role": "agent", "workspace": "/w", "capabilities": []},
            "dynamic": {"lastSeen": 1780000009000, "sessionCount": 1}})
        peers = (await call(client, "list_peers", {"limit": 20, "fields": "lite"}))["items"]
        clio = next(p for p in peers if p["id"] == "clio")
        assert clio == {"id": "clio", "instanceId": "clio", "name": "clio", "role": "agent", "workspace": "/w",
                        "currentTask": "idle", "lastSeen": "2026-05-28T20:26:49.000Z", "sessionCount": 1,
                        "reachable": False, "profileId": clio["profileId"]}
        vps = next(p for p in peers if p["instanceId"] == "alpha-vps")
        assert (vps["id"], vps["currentTask"], vps["reachable"]) == ("alpha", "Standardizing tool descriptions", True)
        page = await call(client, "list_peers", {"limit": 2})
        rest = await call(client, "list_peers", {"limit": 200, "cursor": page["nextCursor"]})
        assert [p["instanceId"] for p in page["items"] + rest["items"]] == [p["instanceId"] for p in peers]
        assert rest["nextCursor"] is None
        assert (await refused(client, "list_peers", {"cursor": "not-a-cursor"})).startswith(
            "invalid_argument: invalid cursor")


async def test_ids_messages_history_and_delete_examples(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """mark_as_read's id examples (one id; unknown ids and foreign receipts refused, as VantagePeers'
    validation and scope guard do), get_message, list_messages by day and sender, keyword search, and
    delete_message by the sender only."""
    async with vp_client(kind, tmp_path, fleet) as client:
        own = await call(client, "send_message", {"from": "alpha", "channel": "broadcast", "content": "alpha's own message"})
        got = await call(client, "get_message", {"messageId": own["messageId"]})
        assert (got["from"], got["channel"], got["content"], got["createdAt"]) == (
            "alpha", "broadcast", "alpha's own message", own["createdAt"])

        await call(client, "send_message", {"from": "pi", "channel": "omega", "content": "x"})
        [msg] = [m for m in (await call(client, "check_messages", {"recipient": "omega"}))["messages"] if m["from"] == "pi"]
        for bad in ("not-an-id", "JN70TNQNSVBZH9W5KB8VAMFJR984VHN2", "jn70tnqnsvbzh9w5kb8vamfjr984",
                    "550e8400-e29b-41d4-a716-446655440000"):
            assert (await refused(client, "mark_as_read", {"receiptIds": [bad]})).startswith("not_found")
        for bad in ("", []):
            assert (await refused(client, "mark_as_read", {"receiptIds": bad})).startswith("invalid_argument")
        foreign = await refused(client, "mark_as_read", {"receiptIds": [msg["receiptId"], "r_aaa"],
                                                         "callerOrchestrator": "pi"})
        assert foreign.startswith("invalid_argument") and "addressed to 'omega', not to 'pi'" in foreign
        assert (await call(client, "mark_as_read", {"receiptIds": msg["receiptId"]}))["markedAsRead"] == 1

        await call(client, "send_message", {"from": "eta", "channel": "beta", "content": "day 88", "sessionDay": 88})
        await call(client, "send_message", {"from": "pi", "channel": "beta", "content": "pi on day 88", "sessionDay": 88})
        await call(client, "send_message", {"from": "eta", "channel": "beta", "content": "day 89", "sessionDay": 89})
        day89 = await call(client, "list_messages", {"sessionDay": 89, "limit": 100})
        assert [m["content"] for m in day89["items"]] == ["day 89"]
        eta88 = await call(client, "list_messages", {"sessionDay": 88, "from": "eta", "limit": 100})
        assert [m["content"] for m in eta88["items"]] == ["day 88"]
        newest = await call(client, "list_messages", {"limit": 2})
        older = await call(client, "list_messages", {"limit": 200, "cursor": newest["nextCursor"]})
        assert [m["content"] for m in newest["items"]] == ["day 89", "pi on day 88"]
        assert [m["content"] for m in older["items"]][-1] == "alpha's own message"
        hits = await call(client, "search_messages_by_keyword", {"query": "da", "from": "eta", "sessionDay": 88, "limit": 10})
        assert [h["content"] for h in hits["items"]] == ["day 88"]  # the last word matches as a prefix

        secret = await call(client, "send_message", {"from": "sigma", "channel": "beta", "content": "the vault code is 1234"})
        assert (await refused(client, "delete_message", {"messageId": secret["messageId"], "callerOrchestrator": "pi"})
                ).startswith("invalid_argument: only the sender role 'sigma' may delete")
        assert (await refused(client, "delete_message", {"messageId": secret["messageId"]})).startswith(
            "invalid_argument: 'callerOrchestrator' is required")
        deleted = await call(client, "delete_message", {"messageId": secret["messageId"], "callerOrchestrator": "sigma"})
        assert deleted["deleted"] is True and isinstance(deleted["retractedAt"], int)
        gone = await call(client, "get_message", {"messageId": secret["messageId"]})
        assert (gone["content"], gone["retracted"]) == (None, True)
        assert "the vault code is 1234" not in await drain(client, "beta")
        assert (await call(client, "search_messages_by_keyword", {"query": "vault"}))["items"] == []
        assert (await call(client, "message_status", {"messageId": secret["messageId"]}))["retracted"] is True
        assert (await refused(client, "get_message", {"messageId": "k7a2x"})).startswith("not_found")


async def test_since_and_integer_arguments_over_the_wire(kind: str, tmp_path: Path, fleet: Fleet) -> None:
    """since as VantagePeers passes it (Unix ms, "the time of your last check") and as ISO-8601 works;
    values that are neither are invalid_argument (never an empty inbox or a crash); names fold case."""
    async with vp_client(kind, tmp_path, fleet) as client:
        await call(client, "send_message", {"from": "alpha", "channel": "TAU", "content": "before"})
        stamp = (await call(client, "check_messages", {"recipient": "tau"}))["messages"][0]["createdAt"]
        await asyncio.sleep(0.01)  # so the next message lands in a later millisecond than `stamp`
        await call(client, "send_message", {"from": "alpha", "channel": "tau", "content": "after"})
        for since in (stamp, iso_ms(stamp), str(stamp)):
            page = await call(client, "check_messages", {"recipient": "Tau", "since": since})
            assert [m["content"] for m in page["messages"]] == ["after"], since
        assert len((await call(client, "check_messages", {"recipient": "tau", "since": 0}))["messages"]) == 2
        bad: list[tuple[str, dict[str, Any], str]] = [
            ("check_messages", {"recipient": "tau", "since": 2**63}, "invalid_argument: since must be between"),
            ("check_messages", {"recipient": "tau", "since": -5}, "invalid_argument: since must be between"),
            ("check_messages", {"recipient": "tau", "since": 1_700_000_000}, "invalid_argument: since 1700000000 is beyond"),
            ("check_messages", {"recipient": "tau", "since": 32503680000000}, "invalid_argument: since 32503680000000 is a time"),
            ("check_messages", {"recipient": "tau", "limit": 2**64}, "invalid_argument: 'limit'"),
            ("send_message", {"from": "a", "channel": "b", "content": "x", "sessionDay": 2**63}, "invalid_argument: 'sessionDay'"),
            ("update_profile", {"orchestratorId": "a", "dynamic": {"sessionCount": 2**70}}, "invalid_argument: 'dynamic"),
            ("poll", {"thread_id": "t", "after_seq": 2**63}, "invalid_argument: 'after_seq'"),
            ("list_messages", {"cursor": "eyJiZWZvcmUiOjkyMjMzNzIwMzY4NTQ3NzU4MDh9"}, "invalid_argument: before must be between"),
        ]
        for tool, args, expected in bad:
            assert (await refused(client, tool, args)).startswith(expected), (tool, args)


# -- across two daemons ----------------------------------------------------------------------------


def content_of(db: Path, message_id: str) -> Any:
    with read_only(db) as conn:
        return conn.execute("SELECT content FROM ops WHERE id = ?", (message_id,)).fetchone()[0]


async def test_900_kb_messages_sync_between_daemons_page_by_page(fleet: Fleet) -> None:
    """VantagePeers' largest content (900,000 bytes, every byte escaped in JSON on the way in) is sent over
    MCP on one daemon and read whole over MCP on another; three of them go one page each, with no failed round."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    big = ["\x01" * MAX_CONTENT_BYTES, "é" * (MAX_CONTENT_BYTES // 2), "z" * MAX_CONTENT_BYTES]
    async with mcp_client(a.info["mcp_url"], a.token) as ca, mcp_client(b.info["mcp_url"], b.token) as cb:
        sent = [await call(ca, "send_message", {"from": "alpha", "channel": "beta", "content": c}) for c in big]
        ids = {s["messageId"] for s in sent}
        await asyncio.to_thread(wait_until, lambda: ids <= message_ids(b.db), 60, "the big messages on b")
        got: list[str] = []
        while len(got) < 3:
            page = await call(cb, "check_messages", {"recipient": "beta", "limit": 5})
            assert len(page["messages"]) == 1 and page["truncated"] == (len(got) < 2)  # over the byte budget: one each
            got.append(page["messages"][0]["content"])
            await call(cb, "mark_as_read", {"receiptIds": [page["messages"][0]["receiptId"]]})
        assert got == big
    too_big = await asyncio.to_thread(a.call, "POST", "/api/send",
                                      {"from": "alpha", "channel": "beta", "content": "x" * (MAX_CONTENT_BYTES + 1)})
    assert too_big[0] == 400 and "900000" in too_big[1]["error"]
    await asyncio.to_thread(fleet.wait_converged)


async def test_delete_message_on_one_daemon_drops_the_content_on_the_other(fleet: Fleet) -> None:
    """A retraction made on A reaches B: B's content column and search entry go, the message leaves B's
    inbox, and message_status on B shows it retracted."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    await asyncio.to_thread(fleet.start)
    async with mcp_client(a.info["mcp_url"], a.token) as ca, mcp_client(b.info["mcp_url"], b.token) as cb:
        sent = await call(ca, "send_message", {"from": "sigma", "channel": "beta", "content": "vault code 1234"})
        mid = sent["messageId"]
        await asyncio.to_thread(wait_until, lambda: mid in message_ids(b.db), 30, "the message on b")
        assert [h["messageId"] for h in (await call(cb, "search_messages_by_keyword", {"query": "vault"}))["items"]] == [mid]
        await call(ca, "delete_message", {"messageId": mid, "callerOrchestrator": "SIGMA"})
        await asyncio.to_thread(wait_until, lambda: content_of(b.db, mid) is None, 30, "the content gone on b")
        assert (await call(cb, "message_status", {"messageId": mid}))["retracted"] is True
        assert (await call(cb, "search_messages_by_keyword", {"query": "vault"}))["items"] == []
        assert (await call(cb, "check_messages", {"recipient": "beta"}))["messages"] == []
    await asyncio.to_thread(fleet.wait_converged)


def test_one_json_body_limit_holds_a_largest_message() -> None:
    """The local server's and the MCP SDK's body limits are one, and hold 900,000 escaped bytes and more."""
    assert MAX_BODY_BYTES == MAX_JSON_REQUEST_BYTES >= 6 * MAX_CONTENT_BYTES + 64 * 1024
