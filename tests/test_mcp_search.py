"""The search_messages MCP tool through the in-process SDK client, on a real replica file."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult, TextContent

from mcp_server import SessionBinding, Wiring, build_server
from replica import Replica, open_home


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    r = open_home(tmp_path / "home")
    yield r
    r.close()


@asynccontextmanager
async def connect(replica: Replica, bind: SessionBinding | None = None) -> AsyncIterator[Client]:
    wiring = Wiring.over(replica)
    try:
        async with Client(build_server(replica, waiter=wiring.waiter, bind=bind)) as c:
            yield c
    finally:
        wiring.close()


def text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def search(client: Client, **args: Any) -> dict[str, Any]:
    result = await client.call_tool("search_messages", args)
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


async def test_search_is_listed_read_only_with_exact_argument_names(replica: Replica) -> None:
    """search_messages is listed as read-only, with from/channel/since/limit optional and query required."""
    async with connect(replica) as client:
        tool = next(t for t in (await client.list_tools()).tools if t.name == "search_messages")
    assert set(tool.input_schema["properties"]) == {"query", "from", "channel", "since", "limit"}
    assert tool.input_schema["required"] == ["query"]
    assert tool.input_schema["additionalProperties"] is False
    assert tool.annotations is not None and tool.annotations.read_only_hint is True
    assert tool.output_schema is not None and "hits" in tool.output_schema["properties"]
    assert tool.description and "\n" not in tool.description


async def test_search_finds_messages_with_every_word_and_filters(replica: Replica) -> None:
    """Every word must match; from, channel, since and limit narrow the hits."""
    first = replica.send_message("planner", "coder", "deploy the staging cluster tonight")
    replica.send_message("reviewer", "coder,tester", "staging cluster looks healthy", from_instance_id="r1")
    replica.send_message("planner", "broadcast", "lunch is at noon")
    replica.send_message("planner", "tester", "cluster upgrade on staging postponed")
    async with connect(replica) as client:
        both = await search(client, query="staging cluster")
        assert len(both["hits"]) == 3
        assert all("staging" in h["content"] and "cluster" in h["content"] for h in both["hits"])
        assert (await search(client, query="lunch"))["hits"][0]["channel"] == "broadcast"
        from_planner = await search(client, **{"query": "staging", "from": "planner"})
        assert {h["from"] for h in from_planner["hits"]} == {"planner"} and len(from_planner["hits"]) == 2
        to_tester = await search(client, query="staging", channel="tester")
        assert sorted(h["content"] for h in to_tester["hits"]) == [
            "cluster upgrade on staging postponed", "staging cluster looks healthy"]
        reviewer = next(h for h in both["hits"] if h["from"] == "reviewer")
        assert reviewer["fromInstanceId"] == "r1" and reviewer["threadId"] is None
        later = await search(client, query="staging", since=first.seq)
        assert first.id not in {h["messageId"] for h in later["hits"]} and len(later["hits"]) == 2
        assert len((await search(client, query="staging", limit=1))["hits"]) == 1
        assert (await search(client, query="nothing-like-this"))["hits"] == []


async def test_search_ignores_a_session_binding_and_names_thread_senders(replica: Replica) -> None:
    """A bound session still searches everything; a thread message's sender is the agent's name."""
    alice, bob = replica.create_agent("alice"), replica.create_agent("bob")
    tid = replica.create_thread(alice, bob)
    replica.append(tid, alice, "quarterly numbers attached")
    replica.send_message("someone", "else", "quarterly planning")
    async with connect(replica, SessionBinding(role="bob")) as client:
        hits = (await search(client, query="quarterly"))["hits"]
    assert len(hits) == 2
    thread_hit = next(h for h in hits if h["threadId"] == tid)
    assert thread_hit["from"] == "alice" and thread_hit["channel"] is None


async def test_search_operators_are_plain_words(replica: Replica) -> None:
    """FTS syntax in the query is searched for literally, never run as an operator."""
    replica.send_message("a", "b", "the plan is final")
    async with connect(replica) as client:
        assert (await search(client, query="plan OR missing"))["hits"] == []  # OR is a word that must match too
        assert (await search(client, query='NEAR( "plan'))["hits"] == []
        assert (await search(client, query="fin*"))["hits"] == []  # no prefix queries
        assert len((await search(client, query="final plan"))["hits"]) == 1


@pytest.mark.parametrize(("args", "expected"), [
    ({}, "invalid_argument: missing required argument 'query'"),
    ({"query": "   "}, "invalid_argument: query must be a non-empty string"),
    ({"query": "x", "limit": 0}, "invalid_argument: 'limit'"),
    ({"query": "x", "since": -1}, "invalid_argument: 'since'"),
    ({"query": "x", "sender": "a"}, "invalid_argument: unknown argument 'sender'"),
])
async def test_bad_search_arguments_are_clear_errors(replica: Replica, args: dict[str, Any], expected: str) -> None:
    """Bad arguments come back as isError with the invalid_argument code and a clear message."""
    async with connect(replica) as client:
        result = await client.call_tool("search_messages", args)
    assert result.is_error and result.structured_content is None
    assert text(result).startswith(expected), text(result)
