"""Every agent CLI people run, connected to peerd for real, as docs/mcp.md tells the reader: Claude
Code, Codex, Gemini CLI and Qwen Code at the releases ``tools/`` pins (``scripts/test`` installs
them; a missing one fails these tests, never skips them).

For each client, in a throwaway HOME with peerd's default home in it: every documented ``mcp add``
line (or Codex ``config.toml`` block) is run as written, over stdio and over HTTP (with the home's
token as the bearer header), and the client itself is asked whether the server is connected
(``claude mcp list``, ``gemini mcp list``, ``qwen mcp list``; for Codex, its app server's
``mcpServerStatus/list`` on a live session, and a tool call through it). Without the token the
client reports it cannot connect. Then each documented hook runs in a whole turn against a fake
model (``tests.fakemodels``): the mail that ``peerd hook`` shows is in what the model is given.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_server import Wiring
from peerd import home as homes
from peerd.local import LocalServer, build_app
from peerd.localauth import file_auth
from replica import open_home
from tests.agentclis import (
    CLAUDE,
    GEMINI,
    QWEN,
    Notes,
    client_env,
    codex_app_server,
    codex_client,
    codex_home,
    command_lines,
    fake_provider,
    filled,
    installed,
    run,
    section,
    shell,
    start_thread,
)
from tests.daemons import PEERD
from tests.fakemodels import FakeModel, fake_model
from tests.waiting import eventually

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class User:
    """A user of one client: their HOME, peerd's default home in it (served over HTTP on
    ``port`` as the daemon serves it), a project folder, and the fake model."""

    root: Path
    home: Path
    port: int
    work: Path
    model: FakeModel

    def env(self, **extra: str) -> dict[str, str]:
        return client_env(self.root, **extra)

    def fill(self, text: str, role: str) -> str:
        return filled(text, self.root, role=role, port=self.port)

    def send(self, to: str, text: str) -> str:
        with open_home(self.home) as r:
            return r.send_message("alpha", to, text).id

    def delivered(self, mid: str) -> bool:
        with open_home(self.home) as r:
            return r.message_status(mid)[0].delivered_at is not None

    async def was_delivered(self, mid: str, what: str) -> None:
        await eventually(lambda: self.delivered(mid), 30, what, in_thread=True)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
async def user(tmp_path: Path) -> AsyncIterator[User]:
    root = tmp_path / "user"
    home = root / ".local" / "share" / "peerd"
    done = await asyncio.to_thread(subprocess.run, [str(PEERD), "init", "--home", str(home)], capture_output=True,
                                   text=True, check=False)
    assert done.returncode == 0, done.stderr
    work = tmp_path / "project"
    await asyncio.to_thread(work.mkdir)
    with open_home(home) as replica:
        wiring = Wiring.over(replica)
        try:
            app = build_app([], wiring.mcp_http(), auth=file_auth(homes.local_token_path(home)))
            async with LocalServer(app) as server, fake_model() as model:
                yield User(root, home, server.port, work, model)
        finally:
            wiring.close()


def documented(heading: str, lang: str) -> list[Any]:
    return [b for b in section(heading) if b.lang == lang]


def without_token(line: str) -> str:
    """A documented HTTP line with its Authorization header left out."""
    return re.sub(r'\s+(--header|-H)\s+"Authorization: Bearer [^"]*"', "", line)


async def check_lists(user: User, cli: Path, heading: str, *, listing: list[str], remove: list[str],
                      connected: str, refused: str, role: str = "ROLE") -> None:
    """Each documented ``mcp add`` line, alone in the client's config: the client lists the server
    as connected; the HTTP one without the token, as not connected."""
    (block,) = documented(heading, "sh")
    lines = [user.fill(line, role) for line in command_lines(block)]
    assert any("--transport http" in line for line in lines) and any("--transport" not in line for line in lines)
    http = next(line for line in lines if "--transport http" in line)
    env = user.env()
    for line, expected in [*((line, connected) for line in lines), (without_token(http), refused)]:
        added = await shell(str(installed(cli)) + line.removeprefix(cli.name), env, user.work)
        assert added.code == 0, (line, added)
        listed = await run([str(cli), *listing], env, user.work)
        shown = ANSI.sub("", listed.out + listed.err)
        assert re.search(rf"^\S*\s*peerd: .*{expected}\s*$", shown, re.M), (line, shown)
        removed = await run([str(cli), *remove], env, user.work)
        assert removed.code == 0, removed


async def check_hooks(user: User, heading: str, settings: Path, argv: list[str], env: dict[str, str], *,
                      role: str = "ROLE", extra: dict[str, Any] | None = None) -> None:
    """Each documented hook event alone in the client's settings: a turn's model request holds
    the mail the hook showed, and the message is recorded delivered."""
    (block,) = documented(heading, "json")
    hooks = json.loads(user.fill(block.body, role))["hooks"]
    assert len(hooks) == 2 and "SessionStart" in hooks
    for event, entries in hooks.items():
        write(settings, json.dumps({**(extra or {}), "hooks": {event: entries}}))
        text = f"mail shown by the {event} hook"
        mid = user.send(role, text)
        done = await run(argv, env, user.work)
        assert done.code == 0, (event, done)
        assert user.model.holding(text), (event, [r.path for r in user.model.requests], done)
        await user.was_delivered(mid, f"the {event} hook's delivery receipt")


# -- Claude Code --------------------------------------------------------------------------------


async def test_claude_code_connects_over_stdio_and_http_as_documented(user: User) -> None:
    """`claude mcp add` as documented, then `claude mcp list`: ✔ Connected (✘ without the token)."""
    (block,) = documented("Claude Code", "sh")
    lines = [user.fill(line, "reviewer") for line in command_lines(block)]
    block_text = "\n".join(lines)
    assert "--transport http" in block_text and "uv run --directory" in block_text
    env = user.env()
    claude = str(installed(CLAUDE))
    for line, expected in [*((line, "✔ Connected") for line in lines), (without_token(lines[1]), "✘ Failed to connect")]:
        added = await shell(claude + line.removeprefix("claude"), env, user.work)
        assert added.code == 0, (line, added)
        listed = await run([claude, "mcp", "list"], env, user.work)
        assert re.search(rf"^peerd: .* - {expected}", listed.out, re.M), (line, listed)
        assert (await run([claude, "mcp", "remove", "peerd"], env, user.work)).code == 0


async def test_claude_code_hooks_bring_mail_into_the_turn(user: User) -> None:
    """The documented SessionStart and UserPromptSubmit hooks each put new mail into the turn."""
    block = documented("Hooks: Claude Code and Codex", "json")[0]  # Claude Code's settings.json
    hooks = json.loads(user.fill(block.body, "reviewer"))["hooks"]
    env = user.env(ANTHROPIC_BASE_URL=user.model.url, ANTHROPIC_API_KEY="test-key")
    for event, entries in hooks.items():
        write(user.root / ".claude" / "settings.json", json.dumps({"hooks": {event: entries}}))
        text = f"mail shown by the {event} hook"
        mid = user.send("reviewer", text)
        done = await run([str(installed(CLAUDE)), "-p", "hello"], env, user.work)
        assert done.code == 0, (event, done)
        (request,) = [r for r in user.model.holding(text) if r.path == "/v1/messages"]
        assert "unread message(s) for reviewer" in request.body
        await user.was_delivered(mid, f"the {event} hook's delivery receipt")


# -- Codex --------------------------------------------------------------------------------------


async def codex_session(user: User, config: str, env: dict[str, str], server: str = "peerd") -> dict[str, Any]:
    """Codex's app server with ``config``: a new session's view of MCP server ``server`` (its
    status, and ``whoami`` called through Codex)."""
    write(codex_home(user.root) / "config.toml", fake_provider(user.model.url) + config)
    async with codex_app_server(user.root, env) as socket, codex_client(socket) as (app, _notes):
        tid = await start_thread(app, user.work)
        (status,) = (await app.call("mcpServerStatus/list", {"threadId": tid, "serverName": server,
                                                             "detail": "toolsAndAuthOnly"}))["data"]
        who = None
        if status["runtimeStatus"] == "connected":
            called = await app.call("mcpServer/tool/call", {"threadId": tid, "server": server, "tool": "whoami",
                                                            "arguments": {}})
            who = called["structuredContent"]
        return {"status": status["runtimeStatus"], "tools": len(status["tools"]), "whoami": who}


async def test_codex_connects_over_stdio_and_http_as_documented(user: User) -> None:
    """Both documented config.toml entries: a Codex session reports the server connected and calls
    its tools (bound to the role, and over HTTP the instance); without the token, auth required."""
    stdio, http = (user.fill(b.body, "builder") for b in documented("Codex (`~/.codex/config.toml`)", "toml"))
    token = homes.local_token_path(user.home).read_text().strip()
    env = user.env()
    seen = await codex_session(user, stdio, env)
    assert seen["status"] == "connected" and seen["tools"] > 20
    assert (seen["whoami"]["role"], seen["whoami"]["instanceId"]) == ("builder", None)
    seen = await codex_session(user, http, {**env, "PEERD_TOKEN": token})  # as `PEERD_TOKEN=... codex`
    assert seen["status"] == "connected"
    assert (seen["whoami"]["role"], seen["whoami"]["instanceId"]) == ("builder", "laptop-1")
    seen = await codex_session(user, re.sub(r"(?m)^bearer_token_env_var = .*\n", "", http), env)  # no token sent
    assert seen["status"] == "authenticationRequired"  # peerd's 401, as Codex reads it


async def test_codex_hooks_bring_mail_into_turns_once_trusted(user: User) -> None:
    """The documented one-file config: its hooks are untrusted until trusted (as /hooks records it);
    then the session's first turn gets the waiting mail from SessionStart, a later turn new mail
    from UserPromptSubmit, each in the model's request."""
    (block,) = documented("Codex: MCP server and hooks in one file", "toml")
    config = user.fill(block.body, "builder")
    write(codex_home(user.root) / "config.toml", fake_provider(user.model.url) + config)
    env = user.env()
    async with codex_app_server(user.root, env) as socket, codex_client(socket) as (app, _notes):
        listed = (await app.call("hooks/list", {"cwds": [str(user.work)]}))["data"][0]["hooks"]
    assert sorted(h["eventName"] for h in listed) == ["sessionStart", "userPromptSubmit"]
    assert {h["trustStatus"] for h in listed} == {"untrusted"}
    trust = "".join(f'\n[hooks.state."{h["key"]}"]\ntrusted_hash = "{h["currentHash"]}"\n' for h in listed)
    write(codex_home(user.root) / "config.toml", fake_provider(user.model.url) + config + trust)
    first = user.send("builder", "waiting before the session")
    async with codex_app_server(user.root, env) as socket, codex_client(socket) as (app, notes):
        tid = await start_thread(app, user.work)
        for n, (prompt, mail) in enumerate([("hello", "waiting before the session"), ("again", "new during it")], 1):
            if n == 2:
                second = user.send("builder", mail)
            await app.call("turn/start", {"threadId": tid, "input": [{"type": "text", "text": prompt}]})
            await notes.wait_for(turns_ended(notes, n), f"turn {n} to end")
            assert user.model.holding(mail), n
        contexts = {p["run"]["eventName"]: " ".join(e["text"] for e in p["run"]["entries"] if e["kind"] == "context")
                    for p in notes.matching(lambda m, _p: m == "hook/completed")}
        assert "waiting before the session" in contexts["sessionStart"]
        assert "new during it" in contexts["userPromptSubmit"]
    await user.was_delivered(first, "the SessionStart hook's delivery receipt")
    await user.was_delivered(second, "the UserPromptSubmit hook's delivery receipt")


def turns_ended(notes: Notes, n: int) -> Callable[[str, Mapping[str, Any]], bool]:
    return lambda _m, _p: sum(1 for k, _ in notes.seen if k == "turn/completed") >= n


# -- Gemini CLI ---------------------------------------------------------------------------------


def trust_folder(user: User) -> None:
    """What Gemini CLI records when the user trusts the project folder on first start."""
    write(user.root / ".gemini" / "trustedFolders.json", json.dumps({str(user.work): "TRUST_FOLDER"}))


async def test_gemini_cli_connects_over_stdio_and_http_as_documented(user: User) -> None:
    """`gemini mcp add` as documented, then `gemini mcp list` in a trusted folder: Connected."""
    trust_folder(user)
    await check_lists(user, installed(GEMINI), "Gemini CLI", listing=["mcp", "list"],
                      remove=["mcp", "remove", "--scope", "user", "peerd"], connected="- Connected",
                      refused="- Disconnected")


async def test_gemini_cli_hooks_bring_mail_into_the_turn(user: User) -> None:
    """The documented SessionStart and BeforeAgent hooks each put new mail into the model's request."""
    trust_folder(user)
    env = user.env(GEMINI_API_KEY="test-key", GOOGLE_GEMINI_BASE_URL=user.model.url)
    await check_hooks(user, "Gemini CLI", user.root / ".gemini" / "settings.json",
                      [str(installed(GEMINI)), "-m", "gemini-2.5-flash", "-p", "hello"], env,
                      extra={"security": {"auth": {"selectedType": "gemini-api-key"}}})


# -- Qwen Code ----------------------------------------------------------------------------------


async def test_qwen_code_connects_over_stdio_and_http_as_documented(user: User) -> None:
    """`qwen mcp add` as documented, then `qwen mcp list`: Connected."""
    await check_lists(user, installed(QWEN), "Qwen Code", listing=["mcp", "list"],
                      remove=["mcp", "remove", "peerd"], connected="- Connected", refused="- Disconnected")


async def test_qwen_code_hooks_bring_mail_into_the_turn(user: User) -> None:
    """The documented SessionStart and UserPromptSubmit hooks each put new mail into the model's request."""
    env = user.env(OPENAI_API_KEY="test-key", OPENAI_BASE_URL=f"{user.model.url}/v1", OPENAI_MODEL="fake-model")
    await check_hooks(user, "Qwen Code", user.root / ".qwen" / "settings.json",
                      [str(installed(QWEN)), "-p", "hello"], env,
                      extra={"security": {"auth": {"selectedType": "openai"}}})
