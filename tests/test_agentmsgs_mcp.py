"""AgentMsgs' MCP side on peerd: its command line (``peerd mcp --transport stdio|http --db-path FILE |
--in-memory``) as real processes, and its documented worker loop over the SDK client."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from peerd.cli.errors import CliError
from peerd.cli.mcpserve import DEFAULT_HTTP_PORT, Plan, plan
from peerd.cli.parser import build_parser
from replica.agentmsgs import App, SQLiteStore
from tests.daemons import PEERD
from tests.localclient import mcp_client

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def peerd_mcp(*argv: str) -> StdioServerParameters:
    return StdioServerParameters(command=str(PEERD), args=["mcp", *argv], env=ENV)


async def worker_loop(c: Client) -> str:
    """AgentMsgs' MCP worker loop, step by step, twice; returns the thread id."""
    for name in ("Boss", "Worker"):
        await c.call_tool("create_agent", {"name": name})
    me = data(await c.call_tool("create_agent", {"name": "Worker"}))  # 1. create or find the worker agent
    assert me["created"] is False
    tid = data(await c.call_tool("create_thread", {"participant_names": ["Boss", "Worker"]}))["thread_id"]  # 2.
    for task in ("task one", "task two"):
        sent = data(await c.call_tool("append", {"thread_id": tid, "sender_name": "Boss", "content": task}))
        status = data(await c.call_tool("thread_status", {"thread_id": tid, "agent_name": "Worker"}))  # 3.
        assert status["has_unread"] is True
        polled = data(await c.call_tool("poll", {"thread_id": tid, "after_seq": status["cursor"]}))  # 4.
        assert [(m["seq"], m["sender"], m["content"]) for m in polled["messages"]] == [(sent["seq"], "Boss", task)]
        done = data(await c.call_tool("append", {"thread_id": tid, "sender_name": "Worker",  # 5. process
                                                 "content": f"done: {task}"}))
        last = done["seq"]
        await c.call_tool("mark_read", {"thread_id": tid, "agent_name": "Worker", "seq": last})  # 6.
        unread = data(await c.call_tool("has_unread", {"thread_id": tid, "agent_name": "Worker"}))
        assert unread["has_unread"] is False  # 7. repeat
    status = data(await c.call_tool("thread_status", {"thread_id": tid, "agent_name": "Worker"}))
    assert (status["cursor"], status["unread_count"], status["message_count"]) == (4, 0, 4)
    return tid


async def test_worker_loop_over_stdio_in_memory() -> None:
    """`peerd mcp --in-memory --transport stdio` runs the worker loop; its first message is seq 1."""
    async with Client(peerd_mcp("--in-memory", "--transport", "stdio")) as c:
        tid = await worker_loop(c)
        first = data(await c.call_tool("poll", {"thread_id": tid}))["messages"][0]
        assert (first["seq"], first["content"]) == (1, "task one")
        empty = data(await c.call_tool("create_thread", {"participant_names": ["Boss", "Worker"]}))
        info = data(await c.call_tool("thread_info", {"thread_id": empty["thread_id"]}))
        assert (info["message_count"], info["latest_message"]) == (0, None)
        bad = await c.call_tool("create_thread", {"participant_names": ["Boss", "boss"]})
        assert bad.is_error and bad.content[0].text.startswith(  # type: ignore[union-attr]
            "invalid_argument: need >=2 participants")
    async with Client(peerd_mcp("--in-memory")) as c:  # a new process: nothing kept, nothing shared
        gone = await c.call_tool("thread_info", {"thread_id": tid})
        assert gone.is_error and "unknown thread" in gone.content[0].text  # type: ignore[union-attr]


async def test_worker_loop_over_stdio_on_a_db_path(tmp_path: Path) -> None:
    """`peerd mcp --transport stdio --db-path FILE` creates the file and its key; the App reads what it wrote."""
    db = tmp_path / "agentmsgs.db"
    async with Client(peerd_mcp("--transport", "stdio", "--db-path", str(db))) as c:
        tid = await worker_loop(c)
        node = data(await c.call_tool("whoami", {}))["nodeId"]
    assert db.is_file() and (tmp_path / "agentmsgs.db.key").is_file()
    with App(store=SQLiteStore(db)) as app:
        assert app.replica.node_id == node
        assert [(m.seq, m.sender.name) for m in app.poll(tid)] == [
            (1, "Boss"), (2, "Worker"), (3, "Boss"), (4, "Worker")]
        assert app.has_unread(tid, "Worker") is False and app.has_unread(tid, "Boss") is True
    async with Client(peerd_mcp("--db-path", str(db))) as c:  # a second server on the file: same node, same data
        assert data(await c.call_tool("whoami", {}))["nodeId"] == node
        assert data(await c.call_tool("thread_info", {"thread_id": tid}))["message_count"] == 4


@asynccontextmanager
async def peerd_mcp_http(*argv: str) -> AsyncIterator[dict[str, Any]]:
    """`peerd mcp --transport http --port 0 ARGV --json` as a process; yields its announcement, stops it
    with SIGTERM and checks that it exits cleanly."""
    proc = await asyncio.create_subprocess_exec(
        str(PEERD), "mcp", "--transport", "http", "--port", "0", "--json", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=ENV)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
        assert line, (await proc.stderr.read()).decode()  # type: ignore[union-attr]
        yield json.loads(line)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def token_of(served: dict[str, Any]) -> str:
    """The token an HTTP ``peerd mcp`` answers to: in the file it names (made owner-only), or, in
    memory, the one it printed."""
    if "token" in served:
        return str(served["token"])
    path = Path(served["token_file"])
    assert path.stat().st_mode & 0o077 == 0
    return path.read_text().strip()


async def test_worker_loop_over_http_on_a_db_path(tmp_path: Path) -> None:
    """`peerd mcp --transport http --db-path FILE` serves the worker loop on 127.0.0.1, to clients with
    the token it keeps beside the file (FILE.token), and stops on SIGTERM."""
    db = tmp_path / "agentmsgs.db"
    async with peerd_mcp_http("--db-path", str(db)) as served:
        url = served["mcp_url"]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        assert served["token_file"] == f"{db}.token" and "token" not in served
        async with mcp_client(url, token_of(served)) as c:
            tid = await worker_loop(c)
            assert data(await c.call_tool("whoami", {}))["nodeId"] == served["node_id"]
        async with httpx2.AsyncClient(timeout=30) as raw:
            refused = await raw.post(url, json={}, headers={"Origin": "http://evil.example"})
            unauthorized = await raw.post(url, json={}, headers={"Accept": "application/json, text/event-stream"})
        assert refused.status_code == 403 and unauthorized.status_code == 401
    with App(store=SQLiteStore(db)) as app:
        assert app.replica.node_id == served["node_id"]
        assert [m.content for m in app.poll(tid)] == ["task one", "done: task one", "task two", "done: task two"]


async def test_http_in_memory_waiting_poll_wakes() -> None:
    """`peerd mcp --in-memory --transport http`: a waiting poll wakes on another session's append."""
    async with peerd_mcp_http("--in-memory") as served, mcp_client(served["mcp_url"], token_of(served)) as c:
        for name in ("a", "b"):
            await c.call_tool("create_agent", {"name": name})
        tid = data(await c.call_tool("create_thread", {"participant_names": ["a", "b"]}))["thread_id"]
        async with mcp_client(served["mcp_url"], token_of(served)) as other:
            waiting = asyncio.create_task(other.call_tool("poll", {"thread_id": tid, "wait": 60}))
            await c.call_tool("append", {"thread_id": tid, "sender_name": "a", "content": "wake"})
            woken = data(await asyncio.wait_for(waiting, 30))
        assert [(m["seq"], m["content"]) for m in woken["messages"]] == [(1, "wake")]


def test_http_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    """A taken --port ends `peerd mcp --transport http` with exit 1 and a message naming --port."""
    import socket  # noqa: PLC0415

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([str(PEERD), "mcp", "--transport", "http", "--in-memory", "--port", str(port)],
                              capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 1
    assert f"cannot serve MCP on 127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr


# -- the command line ---------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["mcp", *argv])


def test_plan_reads_agentmsgs_command_lines(tmp_path: Path) -> None:
    """AgentMsgs' documented command lines each pick the right replica and transport."""
    home = tmp_path / "home"
    db = tmp_path / "agentmsgs.db"
    assert plan(_args("--transport", "stdio", "--db-path", str(db)), home) == Plan("stdio", None, db)
    assert plan(_args("--transport", "http", "--db-path", str(db)), home) == Plan("http", None, db)
    assert plan(_args("--db-path", str(db), "--transport", "stdio"), home) == Plan("stdio", None, db)
    assert plan(_args("--in-memory", "--transport", "stdio"), home) == Plan("stdio")
    assert plan(_args(), home) == Plan("stdio", home)
    assert plan(_args("--transport", "http", "--port", "0", "--host", "localhost"), home).port == 0
    assert plan(_args("--transport", "http"), home).port == DEFAULT_HTTP_PORT


@pytest.mark.parametrize(("argv", "message"), [
    (("--home", "h", "--in-memory"), "not more than one"),
    (("--port", "9000"), "--host and --port apply to --transport http"),
    (("--transport", "http", "--host", "0.0.0.0"), "--host must be 127.0.0.1 or localhost"),
    (("--transport", "http", "--port", "70000"), "--port must be between 0 and 65535"),
    (("--transport", "http", "--role", "tau"), "--role and --instance apply to --transport stdio"),
])
def test_plan_refuses_contradictions(tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    """Flags that contradict each other are a usage error (exit 2) naming the flags."""
    with pytest.raises(CliError, match=message) as err:
        plan(_args(*argv), tmp_path)
    assert err.value.code == 2


def test_peerd_mcp_and_python_m_mcp_server_share_their_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The MCP server's flags are one definition (``mcp_server.arguments``): a role is stripped and
    an empty one is a usage error in `peerd mcp` as in `python -m mcp_server`."""
    from mcp_server.__main__ import parse_args  # noqa: PLC0415

    assert _args("--role", " tau ").role == "tau"
    for parse in (lambda: _args("--role", " "), lambda: parse_args(["--home", "h", "--role", ""])):
        with pytest.raises(SystemExit) as ended:
            parse()
        assert ended.value.code == 2 and "--role: must not be empty" in capsys.readouterr().err


def test_db_path_and_in_memory_exclude_each_other(tmp_path: Path) -> None:
    """`peerd mcp --db-path F --in-memory` exits 2 with a usage message, and creates nothing."""
    db = tmp_path / "x.db"
    proc = subprocess.run([str(PEERD), "mcp", "--db-path", str(db), "--in-memory"], capture_output=True,
                          text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    assert not db.exists()
