"""AgentMsgs' MCP side on peerd: its command line (``peerd mcp --transport stdio|http --db-path FILE |
--in-memory``) as real processes, and its documented worker loop over the SDK client."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult

from peerd.cli.errors import CliError
from peerd.cli.mcpserve import DEFAULT_HTTP_PORT, Plan, plan
from peerd.cli.parser import build_parser
from replica.agentmsgs import App, SQLiteStore
from tests.daemons import PEERD

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


def test_db_path_and_in_memory_exclude_each_other(tmp_path: Path) -> None:
    """`peerd mcp --db-path F --in-memory` exits 2 with a usage message, and creates nothing."""
    db = tmp_path / "x.db"
    proc = subprocess.run([str(PEERD), "mcp", "--db-path", str(db), "--in-memory"], capture_output=True,
                          text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    assert not db.exists()
