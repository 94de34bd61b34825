"""The mistakes an agent makes most easily are errors (or warnings) it cannot miss, over MCP on a
real replica file; each call that is refused leaves the replica unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from mcp_server import Wiring, build_server
from replica import Replica, firstseen, open_home
from tests.waiting import eventually


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = open_home(tmp_path / "home")
    yield r
    r.close()


@asynccontextmanager
async def connect(replica: Replica) -> AsyncIterator[Client]:
    wiring = Wiring.over(replica)
    try:
        async with Client(build_server(replica, waiter=wiring.waiter)) as c:
            yield c
    finally:
        wiring.close()


def texts(result: CallToolResult) -> list[str]:
    return [b.text for b in result.content if isinstance(b, TextContent)]


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, texts(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, replica: Replica, tool: str, **args: Any) -> str:
    """The error text of a refused call, which changed nothing."""
    before = replica.state_digest()
    result = await client.call_tool(tool, args)
    assert result.is_error and result.structured_content is None, texts(result)
    assert replica.state_digest() == before
    return texts(result)[0]


async def inbox_of(client: Client, role: str) -> list[dict[str, Any]]:
    return list((await ok(client, "check_messages", recipient=role))["messages"])


async def test_a_message_id_given_as_a_receipt_id_says_what_to_pass(replica: Replica) -> None:
    """mark_as_read with the messageId (an easy slip) is refused, naming the receiptId to pass."""
    async with connect(replica) as c:
        sent = await ok(c, "send_message", **{"from": "alpha", "channel": "beta", "content": "x"})
        [msg] = await inbox_of(c, "beta")
        text = await refused(c, replica, "mark_as_read", receiptIds=[sent["messageId"]])
        assert text.startswith("invalid_argument: ")
        assert "this is a messageId; pass the receiptId that check_messages returned" in text
        assert msg["receiptId"] != sent["messageId"] and len(await inbox_of(c, "beta")) == 1


async def test_receipt_ids_none_of_which_is_known_are_refused(replica: Replica) -> None:
    async with connect(replica) as c:
        text = await refused(c, replica, "mark_as_read", receiptIds=["r_nope", "r_nada"])
        assert text.startswith("not_found: ") and "'r_nope', 'r_nada'" in text and "receiptId" in text


async def test_a_partial_batch_marks_the_valid_and_names_the_others(replica: Replica) -> None:
    async with connect(replica) as c:
        sent = await ok(c, "send_message", **{"from": "alpha", "channel": "beta", "content": "x"})
        [msg] = await inbox_of(c, "beta")
        result = await c.call_tool("mark_as_read", {"receiptIds": [msg["receiptId"], sent["messageId"], "r_x"]})
        out = result.structured_content
        assert not result.is_error and out is not None
        assert (out["markedAsRead"], out["unknown"]) == (1, [sent["messageId"], "r_x"])
        assert sent["messageId"] in out["warning"] and "'r_x'" in out["warning"]
        assert texts(result)[1] == f"warning: {out['warning']}"
        assert await inbox_of(c, "beta") == []


async def test_foreign_receipts_with_caller_orchestrator_are_refused(replica: Replica) -> None:
    """VantagePeers' scope guard: a receipt of another role than callerOrchestrator refuses the call."""
    async with connect(replica) as c:
        await ok(c, "send_message", **{"from": "alpha", "channel": "beta,gamma", "content": "x"})
        [b] = await inbox_of(c, "beta")
        [g] = await inbox_of(c, "gamma")
        text = await refused(c, replica, "mark_as_read", receiptIds=[b["receiptId"], g["receiptId"]],
                             callerOrchestrator="beta")
        assert text.startswith("invalid_argument: ") and "addressed to 'gamma', not to 'beta'" in text
        assert len(await inbox_of(c, "beta")) == 1


async def test_a_send_to_a_never_seen_role_warns_with_the_closest_known(replica: Replica) -> None:
    """The message is stored and waits, and the result's text says so, naming 'reviewer'."""
    async with connect(replica) as c:
        await ok(c, "update_profile", orchestratorId="reviewer", name="R")  # the role is seen, and confirmed
        await ok(c, "update_profile", orchestratorId="builder", name="B")
        result = await c.call_tool("send_message", {"from": "alpha", "channel": "reveiwer", "content": "x"})
        assert not result.is_error and result.structured_content is not None
        warning = texts(result)[1]
        assert warning.startswith("warning: role 'reveiwer' has not been seen in this fleet yet")
        assert "Did you mean 'reviewer'" in warning
        assert result.structured_content["warning"] == warning.removeprefix("warning: ")
        assert json.loads(texts(result)[0])["messageId"] == result.structured_content["messageId"]
        known = await c.call_tool("send_message", {"from": "alpha", "channel": "reviewer", "content": "y"})
        assert len(texts(known)) == 1 and known.structured_content and known.structured_content["warning"] is None


async def test_reading_a_never_seen_role_warns_and_keeps_vantagepeers_fields(replica: Replica) -> None:
    """check_messages for a typo'd role returns the inbox with VantagePeers' fields, plus a ``warning``
    (also the result's second text) naming the closest confirmed role; a role seen before, or
    confirmed, gets none."""
    async with connect(replica) as c:
        await ok(c, "update_profile", orchestratorId="reviewer", name="R")
        result = await c.call_tool("check_messages", {"recipient": "reveiwer"})
        assert not result.is_error and result.structured_content is not None
        data = result.structured_content
        assert {"recipient", "recipientInstanceId", "messages", "cursor", "truncated", "nextSince"} <= set(data)
        warning = texts(result)[1]
        assert warning.startswith("warning: role 'reveiwer' has not been seen in this fleet yet")
        assert "Did you mean 'reviewer'?" in warning and data["warning"] == warning.removeprefix("warning: ")
        again = await c.call_tool("check_messages", {"recipient": "reveiwer"})  # seen now: unconfirmed, quiet
        assert len(texts(again)) == 1 and again.structured_content and again.structured_content["warning"] is None
        fine = await c.call_tool("check_messages", {"recipient": "reviewer"})
        assert len(texts(fine)) == 1 and fine.structured_content and fine.structured_content.get("warning") is None


async def test_a_wait_keeps_the_warning_of_its_first_look(replica: Replica) -> None:
    """A waiting check_messages of a role never seen says so even when the mail comes during the wait
    (its first look made the role known)."""
    async with connect(replica) as c:
        waiting = asyncio.create_task(c.call_tool("check_messages", {"recipient": "newcomer", "wait": 30}))
        await eventually(lambda: standing_of(replica, "newcomer"), 30, "the first look (the role known)")
        await ok(c, "send_message", **{"from": "alpha", "channel": "newcomer", "content": "welcome"})
        result = await waiting
        assert result.structured_content is not None
        assert [m["content"] for m in result.structured_content["messages"]] == ["welcome"]
        assert "'newcomer' has not been seen" in result.structured_content["warning"]


def standing_of(replica: Replica, role: str) -> str | None:
    with replica._store.read() as cur:
        return firstseen.status(cur, role)


async def test_schemas_state_what_descriptions_say(replica: Replica) -> None:
    """wait is 0-300 in the schema and 301 is refused; receiptIds is one id or a list."""
    async with connect(replica) as c:
        schemas = {t.name: t.input_schema for t in (await c.list_tools()).tools}
        for tool in ("check_messages", "poll"):
            assert (schemas[tool]["properties"]["wait"]["minimum"], schemas[tool]["properties"]["wait"]["maximum"]) \
                == (0, 300)
        assert await refused(c, replica, "check_messages", recipient="beta", wait=301)
        kinds = [x["type"] for x in schemas["mark_as_read"]["properties"]["receiptIds"]["anyOf"]]
        assert kinds == ["string", "array"]
        assert schemas["create_thread"]["properties"]["participant_names"]["minItems"] == 2


async def test_get_profile_is_the_profile_itself_or_null(replica: Replica) -> None:
    async with connect(replica) as c:
        await ok(c, "update_profile", orchestratorId="alpha", dynamic={"currentTask": "review"})
        got = await ok(c, "get_profile", orchestratorId="alpha")
        assert (got["orchestratorId"], got["dynamic"]["currentTask"]) == ("alpha", "review")
        none = await c.call_tool("get_profile", {"orchestratorId": "nobody"})
        assert (none.is_error, none.structured_content, texts(none)) == (False, None, ["null"])


async def test_agentmsgs_error_texts_come_out_of_the_tools(replica: Replica) -> None:
    async with connect(replica) as c:
        await ok(c, "create_agent", name="alice")
        assert await refused(c, replica, "create_thread", participant_names=["alice"]) == \
            "invalid_argument: need >=2 participants"
