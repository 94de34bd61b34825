"""The Claude Code plugin in plugins/peerd and the marketplace that lists it: the structure the
format asks for, the pinned Claude Code's own `claude plugin validate` on both, and the plugin's MCP
server and hooks run as Claude Code runs them (a shell, the role from PEERD_ROLE).

Needs the pinned Claude Code CLI from ``npm ci --prefix tools/claude-code`` (``scripts/test``
installs it); without it the validation tests fail, saying so."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from replica import open_home
from tests.daemons import PEERD

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "plugins" / "peerd"
CLAUDE = REPO / "tools" / "claude-code" / "node_modules" / ".bin" / "claude"
KEBAB = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What Claude Code gives the plugin's commands: the user's environment (peerd on PATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
    env["PATH"] = f"{PEERD.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PEERD_HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def test_the_plugin_has_the_structure_claude_code_reads() -> None:
    manifest = load(PLUGIN / ".claude-plugin" / "plugin.json")
    assert KEBAB.fullmatch(manifest["name"]) and manifest["description"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", manifest["version"])
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{manifest["version"]}"' in pyproject  # the plugin says the release it is
    (server,) = load(PLUGIN / ".mcp.json")["mcpServers"].values()
    assert server["command"] == "sh" and "exec peerd mcp" in server["args"][-1]
    hooks = load(PLUGIN / "hooks" / "hooks.json")["hooks"]
    assert set(hooks) == {"SessionStart", "UserPromptSubmit"}
    for entries in hooks.values():
        for entry in entries:
            for hook in entry["hooks"]:
                assert hook["type"] == "command" and "peerd hook" in hook["command"] and hook["timeout"] <= 30
    skill = (PLUGIN / "skills" / "peerd" / "SKILL.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", skill, re.S)
    assert front is not None
    fields = dict(line.split(": ", 1) for line in front[1].splitlines())
    assert fields["name"] == "peerd" and len(fields["description"]) < 1024
    for tool in ("file_reservation_paths", "check_messages", "acknowledge_message", "list_file_reservations"):
        assert tool in skill
    market = load(REPO / ".claude-plugin" / "marketplace.json")
    (listed,) = market["plugins"]
    assert (listed["name"], (REPO / listed["source"]).resolve()) == (manifest["name"], PLUGIN)


def validate(target: Path, home: Path) -> subprocess.CompletedProcess[str]:
    assert CLAUDE.exists(), f"the pinned Claude Code CLI is missing: run npm ci --prefix tools/claude-code ({CLAUDE})"
    return subprocess.run([str(CLAUDE), "plugin", "validate", str(target)], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "HOME": str(home), "DISABLE_AUTOUPDATER": "1"})


def test_claude_code_validates_the_plugin_and_the_marketplace(tmp_path: Path) -> None:
    for target in (PLUGIN, REPO):
        done = validate(target, tmp_path)
        assert done.returncode == 0 and "Validation passed" in done.stdout, done.stdout + done.stderr
    assert "mcpServers: peerd" in validate(PLUGIN, tmp_path).stdout


async def test_the_plugins_server_binds_the_role_from_the_environment(tmp_path: Path) -> None:
    await asyncio.to_thread(subprocess.run, [str(PEERD), "init", "--home", str(tmp_path / "home")], check=True,
                            capture_output=True)
    (server,) = await asyncio.to_thread(lambda: list(load(PLUGIN / ".mcp.json")["mcpServers"].values()))
    params = StdioServerParameters(command=server["command"], args=server["args"],
                                   env=env_for(tmp_path, PEERD_ROLE="reviewer", PEERD_INSTANCE="laptop"))
    async with Client(params) as client:
        who = (await client.call_tool("whoami", {})).structured_content
    assert who is not None and (who["role"], who["instanceId"]) == ("reviewer", "laptop")


def test_the_plugins_hooks_show_mail_and_stay_quiet_without_a_role(tmp_path: Path) -> None:
    with open_home(tmp_path / "home") as r:
        r.send_message("builder", "reviewer", "please look at the parser")
    hook = load(PLUGIN / "hooks" / "hooks.json")["hooks"]["UserPromptSubmit"][0]["hooks"][0]["command"]
    stdin = json.dumps({"hook_event_name": "UserPromptSubmit", "prompt": "hi"})
    shown = subprocess.run(["sh", "-c", hook], input=stdin, capture_output=True, text=True, timeout=60,
                           env=env_for(tmp_path, PEERD_ROLE="reviewer"), check=False)
    assert shown.returncode == 0, shown.stderr
    assert "please look at the parser" in json.loads(shown.stdout)["hookSpecificOutput"]["additionalContext"]
    quiet = subprocess.run(["sh", "-c", hook], input=stdin, capture_output=True, text=True, timeout=60,
                           env=env_for(tmp_path), check=False)
    assert (quiet.returncode, quiet.stdout) == (0, "")


def test_the_codex_configuration_has_the_server_and_both_hooks_for_one_role() -> None:
    import tomllib  # noqa: PLC0415

    from tests import docblocks  # noqa: PLC0415

    doc = (REPO / "docs" / "mcp.md").read_text()
    section = doc.split("### Codex: MCP server and hooks in one file", 1)[1]
    block = next(b for b in docblocks.blocks("docs/mcp.md", section) if b.lang == "toml")
    config = tomllib.loads(block.body)
    args = config["mcp_servers"]["peerd"]["args"]
    assert config["mcp_servers"]["peerd"]["command"] == "peerd" and args[0] == "mcp" and "--no-push" in args
    role = args[args.index("--role") + 1]
    for event in ("SessionStart", "UserPromptSubmit"):
        (hook,) = config["hooks"][event][0]["hooks"]
        assert hook["type"] == "command" and hook["command"].startswith("peerd hook ")
        assert f"--role {role}" in hook["command"]
