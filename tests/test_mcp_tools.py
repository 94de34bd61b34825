"""MCP tools through the in-process SDK client, on a real replica file."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from mcp_server import FeedWaiter, SessionBinding, Wiring, build_server
from mcp_server import schemas as s
from mcp_server.server import error_code, request_binding
from mcp_server.tools import merge_peers
from replica import InvalidArgument, NotFound, Profile, Replica, SenderSeen, StoreError, open_home
from replica.stamps import iso_ms, ms_of_iso
from tests.waiting import eventually, patience

TOOL_NAMES = {
    "send_message", "check_messages", "mark_as_read", "list_peers", "update_profile", "get_profile",
    "message_status", "whoami", "create_agent", "delete_account", "create_thread", "join_thread",
    "leave_thread", "thread_info", "thread_status", "append", "poll", "has_unread", "mark_read", "search_messages",
    "delete_message", "get_message", "list_messages", "list_broadcast_status", "search_messages_by_keyword",
    "set_summary", "file_reservation_paths", "renew_file_reservations", "release_file_reservations",
    "force_release_file_reservation", "list_file_reservations", "acknowledge_message", "overdue_acks",
    "install_precommit_guard",
}


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = open_home(tmp_path / "home")
    yield r
    r.close()


class Parks:
    """The tools' waiter as a test sees it: each mark a waiting call parked beyond, in order (a
    call is parked once its mark is here: nothing runs between the two on the loop)."""

    def __init__(self, waiter: FeedWaiter) -> None:
        self.waiter = waiter
        self.beyond: list[int] = []

    async def wait_beyond(self, lseq: int) -> None:
        self.beyond.append(lseq)
        await self.waiter.wait_beyond(lseq)

    async def parked(self, replica: Replica) -> None:
        """Return once a call waits for a change past all that ``replica`` holds now (so it has
        looked at all of it): what a test waits for before it writes what should wake the call."""
        lseq = await asyncio.to_thread(replica.max_lseq)
        await eventually(lambda: self.waiter.waiting and self.beyond and self.beyond[-1] >= lseq, 10,
                         f"a call to wait beyond {lseq}")


@dataclass(frozen=True)
class Node:
    replica: Replica
    watcher: FeedWaiter
    parks: Parks


@pytest.fixture
def node(replica: Replica) -> Iterator[Node]:
    wiring = Wiring.over(replica)
    yield Node(replica, wiring.waiter, Parks(wiring.waiter))
    wiring.close()


@asynccontextmanager
async def connect(node: Node, bind: SessionBinding | None = None) -> AsyncIterator[Client]:
    """A client on a fresh server (entered and left in the test's own task, as anyio requires)."""
    server = build_server(node.replica, waiter=node.parks, bind=bind, fleet_id=lambda: "fleet-1")
    async with Client(server) as c:
        yield c


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


# -- schemas and descriptions ----------------------------------------------------------------


async def test_every_tool_is_listed_with_schemas_and_one_line_description(node: Node) -> None:
    """All tools are listed with a one-line description, a closed input schema and an output schema."""
    async with connect(node) as client:
        tools = (await client.list_tools()).tools
        assert {t.name for t in tools} == TOOL_NAMES
        for tool in tools:
            assert tool.description and "\n" not in tool.description and len(tool.description) < 160
            assert tool.input_schema["type"] == "object"
            assert tool.input_schema["additionalProperties"] is False
            assert "title" not in json.dumps({k: v for k, v in tool.input_schema.items() if k != "properties"})
            if tool.name == "get_profile":  # VantagePeers answers the profile itself, or null
                assert tool.output_schema is None
            else:
                assert tool.output_schema is not None and tool.output_schema["type"] == "object"


async def test_argument_names_are_exactly_the_established_ones(node: Node) -> None:
    """Wire names match the older tools: from, instanceId, receiptIds, orchestratorId, thread_id..."""
    async with connect(node) as client:
        schemas = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        assert set(schemas["send_message"]["properties"]) == {
            "from", "channel", "content", "instanceId", "fromInstanceId", "sessionDay", "tenantId", "ack_required"}
        assert set(schemas["send_message"]["required"]) == {"channel", "content"}
        assert set(schemas["check_messages"]["properties"]) == {
            "recipient", "recipientInstanceId", "since", "limit", "wait", "tenantId"}
        assert schemas["mark_as_read"]["required"] == ["receiptIds"]
        assert set(schemas["update_profile"]["properties"]) == {
            "orchestratorId", "instanceId", "name", "static", "dynamic"}
        assert schemas["create_thread"]["required"] == ["participant_names"]
        assert set(schemas["append"]["required"]) == {"thread_id", "sender_name", "content"}
        assert set(schemas["mark_read"]["required"]) == {"thread_id", "agent_name", "seq"}
        assert schemas["message_status"]["required"] == ["messageId"]
        assert "anyOf" not in json.dumps(schemas["send_message"])  # optional means not required, never null


# -- messaging -------------------------------------------------------------------------------


async def test_message_round_trip_send_check_mark_status(node: Node) -> None:
    """send -> check (delivered, receipt id) -> mark_as_read -> status read -> no longer returned."""
    async with connect(node) as client:
        sent = await ok(client, "send_message", **{"from": "alpha", "channel": "beta", "content": "hello"})
        assert sent["from"] == "alpha" and sent["recipients"] == ["beta"]
        status = await ok(client, "message_status", messageId=sent["messageId"])
        assert [r["state"] for r in status["recipients"]] == ["pending"]
        inbox = await ok(client, "check_messages", recipient="beta")
        [msg] = inbox["messages"]
        assert (msg["messageId"], msg["from"], msg["channel"], msg["content"]) == (
            sent["messageId"], "alpha", "beta", "hello")
        assert msg["deliveredAt"] is not None and msg["readAt"] is None and inbox["cursor"] == msg["seq"]
        assert msg["createdAt"] == sent["createdAt"] and isinstance(msg["createdAt"], int)
        status = await ok(client, "message_status", messageId=sent["messageId"])
        assert status["recipients"][0]["state"] == "delivered"
        assert (await ok(client, "mark_as_read", receiptIds=[msg["receiptId"]]))["markedAsRead"] == 1
        status = await ok(client, "message_status", messageId=sent["messageId"])
        assert status["recipients"][0]["state"] == "read" and status["recipients"][0]["readAt"] is not None
        assert (await ok(client, "check_messages", recipient="beta"))["messages"] == []


async def test_send_to_a_role_never_seen_says_so_and_still_stores_it(node: Node) -> None:
    """send_message names recipients never seen in the fleet (unknownRecipients) with the known roles,
    closest spelling first (knownRoles); the message is stored and reaches the role once it checks."""
    async with connect(node) as client:
        await ok(client, "update_profile", orchestratorId="reviewer", name="Reviewer")
        await ok(client, "send_message", **{"from": "coder", "channel": "reviewer", "content": "here"})  # confirmed
        sent = await ok(client, "send_message", **{"from": "lead", "channel": "revewer,coder", "content": "typo"})
        assert sent["unknownRecipients"] == ["revewer"]
        assert sent["knownRoles"][0] == "reviewer" and set(sent["knownRoles"]) == {"coder", "reviewer"}
        known = await ok(client, "send_message", **{"from": "lead", "channel": "coder", "content": "fine"})
        assert known["unknownRecipients"] == [] and known["knownRoles"] is None
        inbox = await ok(client, "check_messages", recipient="revewer")
        assert [m["content"] for m in inbox["messages"]] == ["typo"]


async def test_instances_and_since_cursor(node: Node) -> None:
    """instanceId targets one instance; since skips what an earlier call returned."""
    async with connect(node) as client:
        await ok(client, "send_message", **{"from": "a", "channel": "b", "content": "one", "instanceId": "b1"})
        assert (await ok(client, "check_messages", recipient="b", recipientInstanceId="b2"))["messages"] == []
        first = await ok(client, "check_messages", recipient="b", recipientInstanceId="b1")
        assert [m["content"] for m in first["messages"]] == ["one"] and first["recipientInstanceId"] == "b1"
        await ok(client, "send_message", **{"from": "a", "channel": "b", "content": "two", "instanceId": "b1"})
        later = await ok(client, "check_messages", recipient="b", recipientInstanceId="b1", since=first["cursor"])
        assert [m["content"] for m in later["messages"]] == ["two"]


async def test_receipt_ids_may_come_as_json_text(node: Node) -> None:
    """A JSON-encoded array for receiptIds (some clients send that) is accepted."""
    async with connect(node) as client:
        await ok(client, "send_message", **{"from": "a", "channel": "b", "content": "x"})
        rid = (await ok(client, "check_messages", recipient="b"))["messages"][0]["receiptId"]
        assert (await ok(client, "mark_as_read", receiptIds=json.dumps([rid])))["marked"] == 1
        await ok(client, "send_message", **{"from": "a", "channel": "b", "content": "y"})
        rid = (await ok(client, "check_messages", recipient="b"))["messages"][0]["receiptId"]
        assert (await ok(client, "mark_as_read", receiptIds=rid))["markedAsRead"] == 1  # one id, not in a list


async def test_session_binding_fills_role_and_instance_and_arguments_win(node: Node) -> None:
    """A bound session need not name itself; explicit arguments override the binding."""
    async with connect(node, SessionBinding("alpha", "a1")) as c:
        assert await ok(c, "whoami") == {
            "nodeId": node.replica.node_id, "fleetId": "fleet-1", "role": "alpha", "instanceId": "a1"}
        sent = await ok(c, "send_message", channel="beta", content="from the binding")
        assert (sent["from"], sent["fromInstanceId"]) == ("alpha", "a1")
        sent = await ok(c, "send_message", **{"from": "gamma", "channel": "alpha", "content": "explicit"})
        assert (sent["from"], sent["fromInstanceId"]) == ("gamma", None)
        inbox = await ok(c, "check_messages")
        assert (inbox["recipient"], inbox["recipientInstanceId"]) == ("alpha", "a1")
        assert [m["content"] for m in inbox["messages"]] == ["explicit"]
        assert (await ok(c, "update_profile", dynamic="busy"))["orchestratorId"] == "alpha"
        assert (await ok(c, "get_profile"))["dynamic"]["currentTask"] == "busy"


async def test_profiles_update_fieldwise_and_peers_list_them(node: Node) -> None:
    """update_profile keeps fields and keys left out; list_peers shows role, current task and lastSeen."""
    async with connect(node) as client:
        await ok(client, "update_profile", orchestratorId="alpha", name="Alpha", static={"role": "builds things"})
        got = await ok(client, "update_profile", orchestratorId="alpha", dynamic={"currentTask": "reviewing #12"})
        prof = got["profile"]
        assert (got["name"], prof["static"]["role"], prof["dynamic"]["currentTask"]) == (
            "Alpha", "builds things", "reviewing #12")
        assert await ok(client, "get_profile", orchestratorId="alpha") == got["profile"]
        peers = (await ok(client, "list_peers"))["items"]
        assert [(p["id"], p["name"], p["role"], p["currentTask"], p["reachable"]) for p in peers] == [
            ("alpha", "Alpha", "builds things", "reviewing #12", True)]
        assert ms_of_iso(peers[0]["lastSeen"]) == prof["updatedAt"]


async def test_whoami_reports_node_and_fleet(node: Node) -> None:
    """whoami names this node, the fleet (from the provider) and no binding when unbound."""
    async with connect(node) as client:
        assert await ok(client, "whoami") == {"nodeId": node.replica.node_id, "fleetId": "fleet-1", "role": None,
                                              "instanceId": None}


def test_merge_peers_adds_instances_seen_sending() -> None:
    """Every profile is an entry; an instance seen sending without a profile of its own gets one built on
    its role's profile (spelt as the profile is), and liveness is the newest of updates and messages."""
    now = 1_900_000_000_000
    old = iso_ms(now - 2 * 3600 * 1000)
    profiles = [Profile(r, r.upper(), {"role": "st"}, {}, old, None, old, f"pf_{r}") for r in ("a", "b")]
    senders = [SenderSeen("B", "b1", iso_ms(now), 0), SenderSeen("c", None, old, 0)]
    peers = [p for _k, p in merge_peers(profiles, senders, now)]
    assert [(p["id"], p["instanceId"], p["name"], p["role"], p["reachable"], p["profileId"]) for p in peers] == [
        ("a", "a", "A", "st", False, "pf_a"), ("b", "b", "B", "st", False, "pf_b"),
        ("b", "b1", "b1", "st", True, None), ("c", "c", "c", "", False, None)]


# -- threads ---------------------------------------------------------------------------------


async def test_thread_round_trip(node: Node) -> None:
    """Agents, thread creation, join/leave, append/poll, unread state, info, deletion."""
    async with connect(node) as client:
        alice = await ok(client, "create_agent", name="alice")
        assert alice["created"] is True
        await ok(client, "create_agent", name="bob")
        await ok(client, "create_agent", name="carol")
        thread = await ok(client, "create_thread", participant_names=["alice", "bob"])
        tid = thread["thread_id"]
        assert sorted(thread["participants"]) == ["alice", "bob"]
        assert "carol" in (await ok(client, "join_thread", thread_id=tid, agent_name="carol"))["participants"]
        first = await ok(client, "append", thread_id=tid, sender_name="alice", content="hi all")
        assert first["seq"] == 1
        await ok(client, "append", thread_id=tid, sender_name="bob", content="hi alice")
        polled = await ok(client, "poll", thread_id=tid)
        assert [(m["sender"], m["content"]) for m in polled["messages"]] == [("alice", "hi all"), ("bob", "hi alice")]
        assert polled["messages"][0]["sender_id"] == alice["agent_id"]
        later = await ok(client, "poll", thread_id=tid, after_seq=first["seq"])
        assert [m["content"] for m in later["messages"]] == ["hi alice"]
        assert (await ok(client, "has_unread", thread_id=tid, agent_name="carol"))["has_unread"] is True
        assert (await ok(client, "mark_read", thread_id=tid, agent_name="carol", seq=polled["cursor"]))[
            "unread_count"] == 0
        status = await ok(client, "thread_status", thread_id=tid, agent_name="carol")
        assert (status["has_unread"], status["cursor"], status["message_count"], status["is_participant"]) == (
            False, polled["cursor"], 2, True)
        info = await ok(client, "thread_info", thread_id=tid)
        assert (sorted(info["participants"]), info["message_count"]) == (["alice", "bob", "carol"], 2)
        assert (info["latest_message"]["seq"], info["latest_message"]["content"]) == (2, "hi alice")
        assert "carol" not in (await ok(client, "leave_thread", thread_id=tid, agent_name="carol"))["participants"]
        gone = await ok(client, "delete_account", agent_id=alice["agent_id"])
        assert (gone["name"], gone["deleted"]) == ("alice", True)
        again = await ok(client, "create_agent", name="alice")
        assert (again["agent_id"], again["created"]) == (alice["agent_id"], True)
        assert (await ok(client, "create_agent", name="alice"))["created"] is False


# -- bad calls change nothing ------------------------------------------------------------------


async def make_world(client: Client) -> dict[str, str]:
    """alice+bob in a thread, carol outside it, one unread message alpha -> beta."""
    for name in ("alice", "bob", "carol"):
        await ok(client, "create_agent", name=name)
    tid = (await ok(client, "create_thread", participant_names=["alice", "bob"]))["thread_id"]
    await ok(client, "append", thread_id=tid, sender_name="alice", content="x")
    mid = (await ok(client, "send_message", **{"from": "alpha", "channel": "beta", "content": "m"}))["messageId"]
    rid = (await ok(client, "check_messages", recipient="beta"))["messages"][0]["receiptId"]
    await ok(client, "update_profile", orchestratorId="alpha", name="Alpha")
    return {"tid": tid, "mid": mid, "rid": rid}


BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("send_message", {"from": "a", "content": "x"}, "invalid_argument: missing required argument 'channel'"),
    ("send_message", {"from": "a", "channel": "b", "content": 5}, "invalid_argument: 'content'"),
    ("send_message", {"from": "a", "channel": "b", "content": "x", "instance_id": "i"},
     "invalid_argument: unknown argument 'instance_id'"),
    ("send_message", {"channel": "b", "content": "x"}, "invalid_argument: 'from' is required"),
    ("send_message", {"from": " ", "channel": "b", "content": "x"}, "invalid_argument"),
    ("send_message", {"from": "a", "channel": " , ", "content": "x"}, "invalid_argument"),
    ("send_message", {"from": "a", "channel": "b", "content": "x" * (900_000 + 1)}, "invalid_argument"),
    ("check_messages", {"recipient": "beta", "limit": 0}, "invalid_argument: 'limit'"),
    ("check_messages", {"recipient": "beta", "since": -1}, "invalid_argument: since must be between 0"),
    ("check_messages", {"recipient": "beta", "wait": -1}, "invalid_argument: 'wait'"),
    ("check_messages", {}, "invalid_argument: 'recipient' is required"),
    ("mark_as_read", {"receiptIds": []}, "invalid_argument: 'receiptIds'"),
    ("mark_as_read", {"receiptIds": 5}, "invalid_argument: 'receiptIds'"),
    ("mark_as_read", {"receiptIds": ["{rid}", ""]}, "invalid_argument: receipt id must be a non-empty string"),
    ("list_peers", {"verbose": True}, "invalid_argument: unknown argument 'verbose'"),
    ("update_profile", {"orchestratorId": "alpha", "name": 3}, "invalid_argument: 'name'"),
    ("message_status", {"messageId": "nope"}, "not_found"),
    ("message_status", {}, "invalid_argument: missing required argument 'messageId'"),
    ("whoami", {"role": "x"}, "invalid_argument: unknown argument 'role'"),
    ("create_agent", {"name": "  "}, "invalid_argument"),
    ("delete_account", {"agent_id": "ag_0000"}, "not_found: unknown agent_id 'ag_0000'"),
    ("delete_account", {"agent_id": "alice"},
     "not_found: unknown agent_id 'alice'; the agent named 'alice' has agent_id 'ag_"),
    ("create_thread", {"participant_names": ["alice"]}, "invalid_argument: need >=2 participants"),
    ("create_thread", {"participant_names": ["alice", "ghost"]}, "not_found: unknown agent 'ghost'"),
    ("create_thread", {"participant_names": ["alice", "alice"]}, "invalid_argument: need >=2 participants"),
    ("join_thread", {"thread_id": "nope", "agent_name": "carol"}, "not_found: unknown thread 'nope'"),
    ("join_thread", {"thread_id": "{tid}", "agent_name": "ghost"}, "not_found: unknown agent 'ghost'"),
    ("leave_thread", {"thread_id": "{tid}", "agent_name": "carol"},
     "invalid_argument: agent not in thread: 'carol' is not a participant"),
    ("thread_info", {"thread_id": "nope"}, "not_found: unknown thread"),
    ("thread_status", {"thread_id": "{tid}", "agent_name": "ghost"}, "not_found: unknown agent 'ghost'"),
    ("append", {"thread_id": "{tid}", "sender_name": "carol", "content": "x"},
     "invalid_argument: sender not in thread: 'carol' is not a participant"),
    ("append", {"thread_id": "nope", "sender_name": "alice", "content": "x"}, "not_found: unknown thread"),
    ("poll", {"thread_id": "nope"}, "not_found: unknown thread"),
    ("poll", {"thread_id": "{tid}", "after_seq": -1}, "invalid_argument: 'after_seq'"),
    ("poll", {"thread_id": "{tid}", "after_seq": 2**63}, "invalid_argument: 'after_seq'"),
    ("has_unread", {"thread_id": "{tid}", "agent_name": "ghost"}, "not_found: unknown agent 'ghost'"),
    ("mark_read", {"thread_id": "{tid}", "agent_name": "ghost", "seq": 1}, "not_found: unknown agent 'ghost'"),
    ("mark_read", {"thread_id": "{tid}", "agent_name": "bob", "seq": -1}, "invalid_argument: 'seq'"),
    ("mark_read", {"thread_id": "{tid}", "agent_name": "bob", "seq": 2**53}, "invalid_argument: 'seq'"),
    ("mark_read", {"thread_id": "nope", "agent_name": "bob", "seq": 1}, "not_found: unknown thread"),
]


def _fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


@pytest.mark.parametrize(("tool", "args", "expected"), BAD_CALLS,
                         ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BAD_CALLS)])
async def test_bad_call_is_a_clear_error_and_changes_nothing(
    node: Node, tool: str, args: dict[str, Any], expected: str
) -> None:
    """Bad arguments and unknown ids give isError with a coded message; the replica is unchanged."""
    async with connect(node) as client:
        world = await make_world(client)
        before = (node.replica.state_digest(), node.replica.max_lseq())
        result = await client.call_tool(tool, {k: _fill(v, world) for k, v in args.items()})
        assert result.is_error and result.structured_content is None
        assert text(result).startswith(expected), text(result)
        assert (node.replica.state_digest(), node.replica.max_lseq()) == before


async def test_unknown_tool_is_an_error(node: Node) -> None:
    """Calling a tool that does not exist is an isError result, not a crash."""
    async with connect(node) as client:
        result = await client.call_tool("send_messages", {})
        assert result.is_error and "Unknown tool" in text(result)


# -- wait ---------------------------------------------------------------------------------------


async def test_check_messages_wait_wakes_on_arrival(node: Node) -> None:
    """A waiting check_messages returns soon after a message for the caller lands."""
    async with connect(node) as client:
        call = asyncio.create_task(client.call_tool("check_messages", {"recipient": "beta", "wait": 30}))
        await node.parks.parked(node.replica)
        await asyncio.to_thread(node.replica.send_message, "alpha", "gamma", "not for beta")
        await node.parks.parked(node.replica)  # it woke, looked, and waits again
        assert not call.done()
        await asyncio.to_thread(node.replica.send_message, "alpha", "beta", "for beta")
        landed = time.monotonic()
        result = await call
        assert time.monotonic() - landed < patience(0.5)
        assert [m["content"] for m in (result.structured_content or {})["messages"]] == ["for beta"]


async def test_poll_wait_wakes_on_append(node: Node) -> None:
    """A waiting poll returns the next thread message soon after it is appended."""
    async with connect(node) as client:
        world = await make_world(client)
        cursor = (await ok(client, "poll", thread_id=world["tid"]))["cursor"]
        args = {"thread_id": world["tid"], "after_seq": cursor, "wait": 30}
        call = asyncio.create_task(client.call_tool("poll", args))
        await node.parks.parked(node.replica)
        assert not call.done()
        started = time.monotonic()
        await ok(client, "append", thread_id=world["tid"], sender_name="bob", content="news")
        result = await call
        assert time.monotonic() - started < patience(0.5)
        assert [m["content"] for m in (result.structured_content or {})["messages"]] == ["news"]


async def test_wait_times_out_empty_and_is_capped(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing arriving, wait returns empty after its time; a huge wait is cut to the cap."""
    async with connect(node) as client:
        started = time.monotonic()
        result = await ok(client, "check_messages", recipient="nobody", wait=0.3)
        assert result["messages"] == [] and 0.3 <= time.monotonic() - started < patience(2)
        monkeypatch.setattr(s, "MAX_WAIT_SECONDS", 0.2)
        started = time.monotonic()
        assert (await ok(client, "check_messages", recipient="nobody", wait=300))["messages"] == []
        assert time.monotonic() - started < patience(2)


async def test_a_waiting_call_does_not_block_other_calls(node: Node) -> None:
    """While one call waits, other calls on the same session are served at once."""
    async with connect(node) as client:
        call = asyncio.create_task(client.call_tool("check_messages", {"recipient": "beta", "wait": 30}))
        await node.parks.parked(node.replica)
        started = time.monotonic()
        await ok(client, "whoami")
        await ok(client, "send_message", **{"from": "alpha", "channel": "beta", "content": "unblock"})
        assert time.monotonic() - started < patience(1)
        assert (await call).structured_content is not None


async def test_legacy_handshake_client_works(node: Node) -> None:
    """Clients on the pre-2026 initialize handshake get the same tools and results."""
    async with Client(build_server(node.replica, waiter=node.watcher), mode="legacy") as c:
        assert c.protocol_version < "2026"
        assert len((await c.list_tools()).tools) == len(TOOL_NAMES)
        assert (await ok(c, "send_message", **{"from": "a", "channel": "b", "content": "x"}))["recipients"] == ["b"]


# -- pure boundary helpers -----------------------------------------------------------------------


def test_request_binding_prefers_headers_then_query_then_default() -> None:
    """Headers beat query parameters, which beat the server's own binding; blanks are ignored."""

    class Req:
        def __init__(self, headers: dict[str, str], query: dict[str, str]) -> None:
            self.headers, self.query_params = headers, query

    default = SessionBinding("cli", "c1")
    assert request_binding(None, default) == default
    both = Req({"x-peerd-role": "h"}, {"role": "q", "instance": "qi"})
    assert request_binding(both, default) == SessionBinding("h", "qi")
    assert request_binding(Req({"x-peerd-role": " "}, {}), default) == default


def test_error_codes_follow_the_replica_error_hierarchy() -> None:
    """NotFound, other local errors and store failures map to their own codes."""
    assert error_code(NotFound("x")) == "not_found"
    assert error_code(InvalidArgument("x")) == "invalid_argument"
    assert error_code(StoreError("x")) == "store_error"


async def test_waiter_close_releases_waiters_and_a_waiting_call_returns(node: Node) -> None:
    """Closing the host's waiter (shutdown) ends a waiting wait_beyond and a waiting check_messages
    at once, with what they have; later waits return at once."""
    async with connect(node) as client:
        call = asyncio.create_task(client.call_tool("check_messages", {"recipient": "beta", "wait": 300}))
        waiting = asyncio.create_task(node.watcher.wait_beyond(node.replica.max_lseq() + 1000))
        await asyncio.sleep(0)  # the task runs up to its future (the call may or may not be parked yet: either way it ends)
        assert node.watcher.waiting >= 1 and not waiting.done()
        node.watcher.close()
        await asyncio.wait_for(waiting, patience(5))
        result = await asyncio.wait_for(call, patience(5))
        assert (result.structured_content or {})["messages"] == []
        await asyncio.wait_for(node.watcher.wait_beyond(10**9), patience(1))
    assert node.replica.send_message("a", "b", "after close").seq > 0



async def test_hot_results_built_as_dicts_are_their_models_wire_form(node: Node) -> None:
    """send_message, check_messages, poll and list_peers build their results as plain dicts: each is
    exactly what its output model would give (names, order, JSON values, text = structured content)."""
    r = node.replica
    r.update_profile("reader", "Reader", {"role": "rev", "capabilities": ["x"]}, {"currentTask": "t", "sessionCount": 3})
    r.update_profile("reader", None, None, {"lastSeen": 1_700_000_000_000}, instance_id="reader-2")
    alice, bob = r.create_agent("alice"), r.create_agent("bob")
    tid = r.create_thread(alice, bob)
    r.append(tid, alice, "in the thread")
    async with connect(node) as client:
        calls: list[tuple[str, dict[str, Any], type[Any]]] = [
            ("send_message", {"from": "writer", "channel": "reader,nobody", "content": "hi", "tenantId": "t1"},
             s.SentOut),
            ("send_message", {"from": "writer", "channel": "reader", "content": "again"}, s.SentOut),
            ("check_messages", {"recipient": "reader", "limit": 1}, s.InboxOut),
            ("check_messages", {"recipient": "reader"}, s.InboxOut),
            ("poll", {"thread_id": tid, "after_seq": 0}, s.PollOut),
            ("list_peers", {"limit": 2}, s.PeersOut),
            ("list_peers", {}, s.PeersOut),
        ]
        for tool, args, model in calls:
            result = await client.call_tool(tool, args)
            assert not result.is_error, text(result)
            data = result.structured_content
            assert data is not None
            assert text(result) == json.dumps(data, ensure_ascii=False, separators=(",", ":"))
            again = model.model_validate(data).model_dump(mode="json", by_alias=True)
            assert json.dumps(again) == json.dumps(data), tool
    assert data["items"] and any(p["profileId"] is None for p in data["items"])
