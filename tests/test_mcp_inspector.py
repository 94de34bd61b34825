"""The official MCP Inspector CLI against peerd over stdio and HTTP (the HTTP server guarded by the
home's token, which the Inspector sends as docs/mcp.md shows: ``--header "Authorization: Bearer ..."``).

Needs the pinned Inspector and Node 22 from ``npm ci --prefix tools/inspector``;
without them these tests fail (they never skip).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_server import TOOLS, Wiring
from mcp_server.localauth import LocalAuth
from peerd import home as homes
from peerd.local import LocalServer, build_app
from peerd.localauth import file_auth
from replica import open_home
from tests.waiting import patience

REPO = Path(__file__).resolve().parent.parent
INSPECTOR_DIR = REPO / "tools" / "inspector"
NODE = INSPECTOR_DIR / "node_modules" / ".bin" / "node"
LAUNCHER = (INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher"
            / "build" / "index.js")
TOOL_ERROR_EXIT = 5


def home_auth(home: Path) -> LocalAuth:
    """The credentials of a server on ``home``: its local.token (made now)."""
    return file_auth(homes.local_token_path(home))


def authorization(home: Path) -> str:
    """The header a client sends, as docs/mcp.md shows: the home's local.token as a bearer token."""
    return f"Authorization: Bearer {homes.local_token_path(home).read_text().strip()}"


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def inspector_env(tmp_path: Path) -> dict[str, str]:
    """The environment to run the Inspector in; fails the test if it is not installed."""
    if not NODE.exists() or not LAUNCHER.exists():
        pytest.fail(f"MCP Inspector not installed: run `npm ci --prefix {INSPECTOR_DIR.relative_to(REPO)}`")
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "inspector-home")  # it keeps a catalog and storage under ~/.mcp-inspector
    env["PATH"] = f"{NODE.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


async def inspect(env: dict[str, str], *args: str) -> Run:
    proc = await asyncio.create_subprocess_exec(
        str(NODE), str(LAUNCHER), "--cli", "--format", "json", "-q",
        "--connect-timeout", str(int(patience(15) * 1000)),  # the Inspector's default, stretched on a busy machine
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=patience(60))
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def result_of(run: Run) -> Any:
    assert run.code == 0, (run.code, run.out, run.err)
    payload = run.json()
    return payload.get("result", payload)


async def check_inspector(env: dict[str, str], target: list[str], command: list[str], role: str) -> None:
    """``target`` goes before the method options, ``command`` (a stdio server after ``--``) after them."""
    listed = result_of(await inspect(env, *target, "--method", "tools/list", "--strict", *command))
    assert len(listed["tools"]) == len(TOOLS) + 1  # and replay_unread
    assert all(t["description"] and (t.get("outputSchema") or t["name"] == "get_profile") for t in listed["tools"])
    call = ["--method", "tools/call", "--tool-name"]
    sent = result_of(await inspect(env, *target, *call, "send_message", "--tool-args-json",
                                   '{"channel": "beta", "content": "7"}', *command))
    assert sent["structuredContent"]["from"] == role and sent["isError"] is False
    failed = await inspect(env, *target, *call, "get_message", "--tool-args-json",
                           '{"messageId": "no-such-message"}', *command)
    assert failed.code == TOOL_ERROR_EXIT, (failed.code, failed.out, failed.err)
    assert "not_found: unknown message id" in failed.out + failed.err


async def check_vantagepeers_calls(env: dict[str, str], target: list[str], command: list[str]) -> None:
    """VantagePeers' own payloads through the Inspector: nested profile objects, a null profile, since as
    ISO-8601, mark_as_read with one id, and a strict refusal naming the unknown key."""
    call = ["--method", "tools/call", "--tool-name"]

    async def tool(name: str, args: dict[str, Any]) -> Any:
        return result_of(await inspect(env, *target, *call, name, "--tool-args-json", json.dumps(args), *command))

    made = await tool("update_profile", {
        "orchestratorId": "delta", "name": "Delta",
        "static": {"role": "Spécialiste des pipelines de données", "workspace": "/home/user/projects",
                   "capabilities": ["etl", "sql", "python"]},
        "dynamic": {"currentTask": "Configuration initiale", "lastSeen": 1780000009000, "sessionCount": 1}})
    assert made["structuredContent"]["profile"]["static"]["capabilities"] == ["etl", "sql", "python"]
    nobody = await tool("get_profile", {"orchestratorId": "nobody"})  # VantagePeers' null
    assert "structuredContent" not in nobody and nobody["content"][0]["text"] == "null"
    await tool("send_message", {"from": "delta", "channel": "broadcast", "content": "Delta en ligne"})
    inbox = await tool("check_messages", {"recipient": "gamma", "since": "2020-01-01T00:00:00Z"})
    [msg] = inbox["structuredContent"]["messages"]
    assert msg["content"] == "Delta en ligne"
    assert (await tool("mark_as_read", {"receiptIds": msg["receiptId"]}))["structuredContent"]["markedAsRead"] == 1
    bogus = await inspect(env, *target, *call, "set_summary", "--tool-args-json",
                          '{"orchestratorId": "alpha", "summary": "s", "bogusStaleParam": "x"}', *command)
    assert bogus.code == TOOL_ERROR_EXIT and "unknown argument 'bogusStaleParam'" in bogus.out + bogus.err


async def test_inspector_runs_vantagepeers_payloads_over_stdio_and_http(tmp_path: Path,
                                                                         inspector_env: dict[str, str]) -> None:
    """VantagePeers' payloads pass through the Inspector CLI on both transports."""
    home = tmp_path / "home"
    open_home(home).close()
    await check_vantagepeers_calls(inspector_env, ["--transport", "stdio"],
                                   ["--", sys.executable, "-m", "mcp_server", "--home", str(home)])
    with open_home(tmp_path / "http-home") as replica:
        wiring = Wiring.over(replica)
        try:
            async with LocalServer(build_app([], wiring.mcp_http(), auth=home_auth(tmp_path / "http-home"))) as server:
                target = [server.mcp_url, "--transport", "http", "--header", authorization(tmp_path / "http-home")]
                await check_vantagepeers_calls(inspector_env, target, [])
        finally:
            wiring.close()


async def test_inspector_over_stdio(tmp_path: Path, inspector_env: dict[str, str]) -> None:
    """Inspector --cli lists the tools (schemas pass --strict), calls one (exit 0), sees isError (exit 5)."""
    home = tmp_path / "home"
    open_home(home).close()
    server = ["--", sys.executable, "-m", "mcp_server", "--home", str(home), "--role", "alpha"]
    await check_inspector(inspector_env, ["--transport", "stdio"], server, "alpha")
    with open_home(home) as replica:
        assert [m.content for m in replica.check_messages("beta").messages] == ["7"]


async def test_inspector_over_http(tmp_path: Path, inspector_env: dict[str, str]) -> None:
    """The same Inspector checks pass against streamable HTTP on the daemon's local server, role bound by a header."""
    home = tmp_path / "home"
    with open_home(home) as replica:
        wiring = Wiring.over(replica)
        try:
            async with LocalServer(build_app([], wiring.mcp_http(), auth=home_auth(home))) as server:
                refused = await inspect(inspector_env, server.mcp_url, "--transport", "http", "--method", "tools/list")
                assert refused.code != 0 and "auth_required" in refused.err, refused  # without the header: 401
                target = [server.mcp_url, "--transport", "http", "--header", authorization(home),
                          "--header", "X-Peerd-Role: gamma"]
                await check_inspector(inspector_env, target, [], "gamma")
        finally:
            wiring.close()
        assert [m.content for m in replica.check_messages("beta").messages] == ["7"]
