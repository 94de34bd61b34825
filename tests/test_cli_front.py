"""The CLI as an agent or a new user meets it: `retract`, `status` on a home that is not there,
`inbox --wait` with no daemon, and the one vocabulary across CLI --json, the local API and MCP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.daemons import PEERD, Fleet, wait_until
from tests.localclient import mcp_client

pytest_plugins = ["tests.daemons"]

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def run(*argv: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, timeout=timeout,
                          env=ENV, check=False)


def ok_json(*argv: str, home: Path) -> Any:
    proc = run(*argv, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_status_of_a_home_that_is_not_there_exits_4_and_suggests_no_daemon_there(tmp_path: Path) -> None:
    typo = tmp_path / "not-my-home"
    proc = run("status", home=typo)
    assert proc.returncode == 4 and "no peerd home at" in proc.stderr
    assert "peerd run" not in proc.stderr and "peerd init" not in proc.stderr
    assert not typo.exists()


def test_retract_drops_the_content_offline_and_only_for_the_sender(tmp_path: Path) -> None:
    home = tmp_path / "solo"
    assert run("init", "--name", "solo", home=home).returncode == 0
    sent = ok_json("send", "--from", "me", "--to", "you", "oops", home=home)
    wrong = run("retract", sent["messageId"], "--from", "someone-else", home=home)
    assert wrong.returncode == 1 and wrong.stderr.startswith("peerd: ")
    out = ok_json("retract", sent["messageId"], "--from", "me", home=home)
    assert (out["deleted"], out["messageId"]) == (True, sent["messageId"])
    assert ok_json("inbox", "you", home=home)["messages"] == []
    assert ok_json("status", sent["messageId"], home=home)["retracted"] is True


def _watching(pid: int) -> bool:
    """The process holds an inotify descriptor: its file watch (the change feed) is set up."""
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fd) == "anon_inode:inotify" for fd in fds.iterdir() if fd.is_symlink())


def test_inbox_wait_with_no_daemon_waits_and_wakes_on_a_write(tmp_path: Path) -> None:
    """Offline, --wait blocks (it used to return at once) and a write by another process wakes it."""
    home = tmp_path / "solo"
    assert run("init", "--name", "solo", home=home).returncode == 0
    started = time.monotonic()
    empty = ok_json("inbox", "you", "--wait", "0.5", home=home)
    assert empty["messages"] == [] and time.monotonic() - started >= 0.5
    waiting = subprocess.Popen([str(PEERD), "inbox", "you", "--wait", "120", "--json", "--home", str(home)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_until(lambda: waiting.poll() is None and _watching(waiting.pid), 30, "the inbox to watch the replica")
        begun = time.monotonic()
        sent = ok_json("send", "--from", "me", "--to", "you", "wake up", home=home)
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert [m["messageId"] for m in json.loads(out)["messages"]] == [sent["messageId"]]
        assert time.monotonic() - begun < 60
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


MESSAGE_KEYS = {"messageId", "from", "fromInstanceId", "channel", "instanceId", "fromNode", "receiptId", "content", "createdAt",
                "deliveredAt", "readAt", "seq"}
RECIPIENT_KEYS = {"role", "instanceId", "receiptId", "state", "deliveredAt", "readAt", "acknowledgedAt"}


async def _mcp(url: str, token: str | None, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with mcp_client(url, token) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error and isinstance(result.structured_content, dict), result
    return result.structured_content


def test_cli_local_api_and_mcp_name_a_message_a_receipt_and_a_profile_alike(fleet: Fleet) -> None:
    d = fleet.add("a")
    fleet.start()
    url = str(d.info["mcp_url"])
    api_sent = d.send("alpha", "beta", "by the API")
    cli_sent = ok_json("send", "--from", "alpha", "--to", "beta", "by the CLI", home=d.home)
    mcp_sent = asyncio.run(_mcp(url, d.token, "send_message", {"from": "alpha", "channel": "beta", "content": "by MCP"}))
    assert set(api_sent) == set(cli_sent) == set(mcp_sent)

    api_inbox = d.check("beta", limit=1)["messages"]
    cli_inbox = ok_json("inbox", "beta", "--limit", "1", home=d.home)["messages"]
    mcp_inbox = asyncio.run(_mcp(url, d.token, "check_messages", {"recipient": "beta", "limit": 1}))["messages"]
    assert set(api_inbox[0]) == set(cli_inbox[0]) == set(mcp_inbox[0]) == MESSAGE_KEYS
    assert api_inbox == cli_inbox == mcp_inbox  # the oldest unread, the same item through every door
    assert api_inbox[0]["messageId"] == api_sent["messageId"]
    assert isinstance(api_inbox[0]["createdAt"], int) and api_inbox[0]["createdAt"] == api_sent["createdAt"]

    mid = api_sent["messageId"]
    api_status = d.api("GET", f"/api/messages/{mid}/status")
    cli_status = ok_json("status", mid, home=d.home)
    mcp_status = asyncio.run(_mcp(url, d.token, "message_status", {"messageId": mid}))
    assert api_status == cli_status == mcp_status
    assert set(api_status["recipients"][0]) == RECIPIENT_KEYS

    asyncio.run(_mcp(url, d.token, "update_profile", {"orchestratorId": "alpha", "name": "Alpha"}))
    api_profile = d.api("GET", "/api/profiles/alpha")
    cli_profile = ok_json("profile", "alpha", home=d.home)
    async def mcp_profile() -> Any:
        async with mcp_client(url, d.token) as client:
            return (await client.call_tool("get_profile", {"orchestratorId": "alpha"})).structured_content
    assert api_profile == cli_profile == asyncio.run(mcp_profile())
    assert {"orchestratorId", "name", "static", "dynamic", "updatedAt"} <= set(api_profile)
