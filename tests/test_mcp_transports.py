"""MCP over real transports: the stdio server process, and streamable HTTP on the daemon's own local
server (``peerd.local``: the same app builder, guard and uvicorn embedding as ``peerd run``), whose
clients send its token as peerd's documented configurations do."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from mcp_server import TOOLS, Wiring
from mcp_server.__main__ import parse_args
from mcp_server.localauth import LocalAuth
from peerd.local import LocalServer, build_app
from replica import Replica, open_home
from replica.ops import MAX_CONTENT_BYTES
from tests.localclient import bearer, mcp_client
from tests.waiting import eventually, patience

REPO = Path(__file__).resolve().parent.parent
TOKEN = "s" * 43


@pytest.fixture
def replica(home: Path) -> Iterator[Replica]:
    r = open_home(home)
    yield r
    r.close()


def stdio_params(home: Path, *extra: str) -> StdioServerParameters:
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH to start the stdio server as users do"
    return StdioServerParameters(
        command=uv, args=["run", "--no-sync", "python", "-m", "mcp_server", "--home", str(home), *extra],
        cwd=REPO, env={"UV_PYTHON_DOWNLOADS": "never"},
    )


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


@asynccontextmanager
async def http_host(replica: Replica) -> AsyncIterator[tuple[LocalServer, Wiring]]:
    """MCP over HTTP on ``replica``, and its wiring (whose waiter a test watches)."""
    wiring = await asyncio.to_thread(Wiring.watching, replica)  # the HTTP host's one feed, as in the daemon
    try:
        async with LocalServer(build_app([], wiring.mcp_http(fleet_id=lambda: "f1"), auth=LocalAuth(TOKEN))) as server:
            yield server, wiring
    finally:
        await wiring.aclose()


@asynccontextmanager
async def http_server(replica: Replica) -> AsyncIterator[LocalServer]:
    async with http_host(replica) as (server, _wiring):
        yield server


# -- stdio -------------------------------------------------------------------------------------


async def test_stdio_server_serves_tools_bound_by_command_line(home: Path, replica: Replica) -> None:
    """`python -m mcp_server --home DIR --role R --instance I` lists tools and writes the home's replica."""
    async with Client(stdio_params(home, "--role", "alpha", "--instance", "a1")) as c:
        assert len((await c.list_tools()).tools) == len(TOOLS) + 1  # and replay_unread
        me = data(await c.call_tool("whoami", {}))
        assert (me["nodeId"], me["role"], me["instanceId"]) == (replica.node_id, "alpha", "a1")
        sent = data(await c.call_tool("send_message", {"channel": "beta", "content": "over stdio"}))
        bad = await c.call_tool("mark_as_read", {"receiptIds": [""]})
        assert bad.is_error
    [msg] = replica.check_messages("beta").messages
    assert (msg.id, msg.sender, msg.sender_instance, msg.content) == (sent["messageId"], "alpha", "a1", "over stdio")


async def test_stdio_wait_wakes_on_a_write_from_another_process(home: Path, replica: Replica) -> None:
    """A stdio server's waiting check_messages returns well within 0.5 s of another process's write."""
    async with Client(stdio_params(home, "--role", "beta")) as c:
        await c.call_tool("whoami", {})
        before = replica.max_lseq()
        call = asyncio.create_task(c.call_tool("check_messages", {"wait": 30}))
        # The server is another process, so its waiter cannot be watched; its call's first look is
        # seen instead: the first check of a role records when the role was first seen (an op).
        # From there the call parks at once (a write that wins that race is found by its next look).
        await eventually(lambda: replica.max_lseq() > before, 10, "the server's call to look for mail")
        assert not call.done()
        await asyncio.to_thread(replica.send_message, "alpha", "beta", "wake up")
        landed = time.monotonic()
        result = data(await call)
        assert time.monotonic() - landed < patience(0.5)
    assert [m["content"] for m in result["messages"]] == ["wake up"]


def test_main_requires_a_home(monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """Without --home or PEERD_HOME the entry point refuses to start, and a folder with no replica
    is refused rather than made into an empty one; PEERD_HOME is honoured."""
    monkeypatch.delenv("PEERD_HOME", raising=False)
    with pytest.raises(SystemExit):
        parse_args([])
    with pytest.raises(SystemExit):
        parse_args(["--home", str(tmp_path / "typo")])
    assert "no peerd replica in" in capsys.readouterr().err and not (tmp_path / "typo").exists()
    monkeypatch.setenv("PEERD_HOME", str(home))
    assert parse_args(["--role", "x"]).home == home


# -- waiting on writes of other processes (the daemon's case) ------------------------------------

WRITER = """
import sys, time
from pathlib import Path
from replica import open_home
r = open_home(Path(sys.argv[1]))
r.send_message("alpha", "beta", "from another process")
print(time.time(), flush=True)
r.close()
"""


async def test_in_process_wait_sees_another_process_write(home: Path, replica: Replica) -> None:
    """An HTTP session's wait wakes within 0.5 s of a commit by a separate process on the same file."""
    async with http_host(replica) as (server, wiring), mcp_client(server.mcp_url, TOKEN) as c:
        call = asyncio.create_task(c.call_tool("check_messages", {"recipient": "beta", "wait": 30}))
        await eventually(lambda: wiring.waiter.waiting, 10, "the call to wait")  # an unbound session: no pusher waits
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(home), stdout=asyncio.subprocess.PIPE, cwd=REPO)
        out, _ = await writer.communicate()
        result = data(await call)
        returned = time.time()
    assert writer.returncode == 0
    assert [m["content"] for m in result["messages"]] == ["from another process"]
    assert returned - float(out) < patience(0.5)


# -- streamable HTTP ------------------------------------------------------------------------------


async def test_http_binds_sessions_by_query_and_by_headers(replica: Replica) -> None:
    """?role=&instance= and X-Peerd-Role / X-Peerd-Instance bind a session; arguments still win."""
    async with http_server(replica) as server:
        assert server.port > 0 and server.mcp_url == f"http://127.0.0.1:{server.port}/mcp"
        async with mcp_client(f"{server.mcp_url}?role=alpha&instance=a1", TOKEN) as c:
            me = data(await c.call_tool("whoami", {}))
            assert (me["role"], me["instanceId"], me["fleetId"]) == ("alpha", "a1", "f1")
            sent = data(await c.call_tool("send_message", {"channel": "beta", "content": "hi"}))
            assert (sent["from"], sent["fromInstanceId"]) == ("alpha", "a1")
        headers = {"X-Peerd-Role": "beta", "X-Peerd-Instance": "b7"}
        async with (httpx2.AsyncClient(headers={**headers, **bearer(TOKEN)}, timeout=30) as hc,
                    Client(streamable_http_client(server.mcp_url, http_client=hc)) as c):
            me = data(await c.call_tool("whoami", {}))
            assert (me["role"], me["instanceId"]) == ("beta", "b7")
            inbox = data(await c.call_tool("check_messages", {}))
            assert [m["content"] for m in inbox["messages"]] == ["hi"]
            assert data(await c.call_tool("check_messages", {"recipient": "alpha"}))["recipientInstanceId"] is None


async def test_http_legacy_handshake_clients_work(replica: Replica) -> None:
    """A client on the initialize handshake (session ids) gets the tools and its binding, and reads a
    largest message: answers are one JSON body, never an SSE event over the SDK client's 1 MiB cap."""
    largest = "\x01" * MAX_CONTENT_BYTES  # escaped in JSON: 6 bytes each
    async with http_server(replica) as server, mcp_client(f"{server.mcp_url}?role=gamma", TOKEN, mode="legacy") as c:
        assert c.protocol_version < "2026"
        assert data(await c.call_tool("whoami", {}))["role"] == "gamma"
        await c.call_tool("send_message", {"from": "alpha", "channel": "gamma", "content": largest})
        page = data(await c.call_tool("check_messages", {}))
        assert [m["content"] for m in page["messages"]] == [largest]


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "http://evil.example"}, {"Origin": "null"}, {"Host": "evil.example"},
     {"Host": "attacker.test:8080", "Origin": "http://attacker.test:8080"}],
    ids=["origin", "null-origin", "host", "rebinding"],
)
async def test_http_refuses_foreign_host_or_origin(replica: Replica, headers: dict[str, str]) -> None:
    """A request whose Host or Origin is not 127.0.0.1/localhost gets 403 and changes nothing."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "send_message", "arguments": {"from": "x", "channel": "y", "content": "z"}}}
    before = replica.state_digest()
    async with http_server(replica) as server, httpx2.AsyncClient(timeout=10, headers=bearer(TOKEN)) as raw:
        refused = await raw.post(server.mcp_url, json=body, headers=headers)
        local = await raw.post(server.mcp_url, json={}, headers={"Origin": f"http://localhost:{server.port}"})
    assert refused.status_code == 403
    assert local.status_code not in (401, 403)
    assert replica.state_digest() == before


async def test_http_needs_the_token_and_a_json_body(replica: Replica) -> None:
    """Without the token (or with a wrong one) /mcp answers 401 before MCP sees the request; a body a
    web form could send gets 415; with the token and JSON, MCP answers."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    before = replica.state_digest()
    async with http_server(replica) as server, httpx2.AsyncClient(timeout=10) as raw:
        for token in (None, "wrong"):
            refused = await raw.post(server.mcp_url, json=init, headers={**accept, **bearer(token)})
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        form = await raw.post(server.mcp_url, content=b"{}", headers={**accept, **bearer(TOKEN),
                                                                       "Content-Type": "text/plain"})
        assert form.status_code == 415
        ok = await raw.post(server.mcp_url, json=init, headers={**accept, **bearer(TOKEN)})
        assert ok.status_code == 200 and "serverInfo" in ok.text
    assert replica.state_digest() == before
