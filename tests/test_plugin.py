"""The Claude Code plugin in plugins/peerd and the marketplace that lists it: the structure the
format asks for, the pinned Claude Code's own `claude plugin validate` on both, the plugin's MCP
server and hooks run as Claude Code runs them (a shell, the role from PEERD_ROLE), and the plugin
installed from a clone with the real Claude Code, with no peerd on PATH (a throwaway HOME).

Needs the pinned Claude Code CLI from ``npm ci --prefix tools/claude-code`` (``scripts/test``
installs it); without it the validation tests fail, saying so."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
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
    """What Claude Code gives the plugin's commands: the user's environment (peerd on PATH), and
    the plugin's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERD_")}
    env["PATH"] = f"{PEERD.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PEERD_HOME"] = str(tmp_path / "home")
    env["CLAUDE_PLUGIN_ROOT"] = str(PLUGIN)
    env.update(extra)
    return env


def rooted(words: list[str], root: Path = PLUGIN) -> list[str]:
    """A command's words with ``${CLAUDE_PLUGIN_ROOT}`` filled in, as Claude Code does."""
    return [w.replace("${CLAUDE_PLUGIN_ROOT}", str(root)) for w in words]


def test_the_plugin_has_the_structure_claude_code_reads() -> None:
    manifest = load(PLUGIN / ".claude-plugin" / "plugin.json")
    assert KEBAB.fullmatch(manifest["name"]) and manifest["description"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", manifest["version"])
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{manifest["version"]}"' in pyproject  # the plugin says the release it is
    (server,) = load(PLUGIN / ".mcp.json")["mcpServers"].values()
    assert (server["command"], server["args"]) == ("sh", ["${CLAUDE_PLUGIN_ROOT}/scripts/run-peerd.sh", "mcp"])
    assert (PLUGIN / "scripts" / "run-peerd.sh").is_file()
    hooks = load(PLUGIN / "hooks" / "hooks.json")["hooks"]
    assert set(hooks) == {"SessionStart", "UserPromptSubmit"}
    for event, entries in hooks.items():
        for entry in entries:
            for hook in entry["hooks"]:
                assert hook["type"] == "command" and hook["timeout"] <= 30
                wanted = "session-start" if event == "SessionStart" else "prompt-submit"
                assert hook["command"] == f'sh "${{CLAUDE_PLUGIN_ROOT}}/scripts/run-peerd.sh" hook {wanted}'
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
    params = StdioServerParameters(command=server["command"], args=rooted(server["args"]),
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


def bare_env(home: Path, *tools: Path) -> dict[str, str]:
    """A user with a HOME of their own and a PATH with the system's folders and ``tools`` alone:
    no peerd on it."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        (bin_dir / tool.name).symlink_to(tool)
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    assert shutil.which("peerd", path=path) is None
    return {"HOME": str(home), "PATH": path, "DISABLE_AUTOUPDATER": "1", "UV_PYTHON_DOWNLOADS": "never",
            "LANG": os.environ.get("LANG", "C.UTF-8")}


def uv_binary() -> Path:
    """uv itself (``uv run`` names it in ``UV``; a version manager's shim would need its own HOME)."""
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv is needed to run the plugin from a clone"
    return Path(found).resolve()


def claude(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert CLAUDE.exists(), f"the pinned Claude Code CLI is missing: run npm ci --prefix tools/claude-code ({CLAUDE})"
    done = subprocess.run([str(CLAUDE), *args], capture_output=True, text=True, timeout=180, check=False, env=env,
                          cwd=env["HOME"])
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def install(env: dict[str, str], marketplace: Path) -> Path:
    """``claude plugin marketplace add`` and ``install``, as the README says; the installed copy."""
    claude(env, "plugin", "marketplace", "add", str(marketplace))
    claude(env, "plugin", "install", "peerd@peerd")
    installed = load(Path(env["HOME"]) / ".claude" / "plugins" / "installed_plugins.json")
    return Path(installed["plugins"]["peerd@peerd"][0]["installPath"])


def plugin_commands() -> list[list[str]]:
    """The ``claude plugin ...`` commands README.md and docs/mcp.md give (the same in both), with
    the clone's path filled in."""
    from tests import docblocks  # noqa: PLC0415

    found = []
    for doc, heading in (("README.md", "A Claude Code plugin in"), ("docs/mcp.md", "### Claude Code plugin")):
        section = (REPO / doc).read_text().split(heading, 1)[1]
        block = next(b for b in docblocks.blocks(doc, section) if b.lang == "sh")
        found.append([shlex.split(line.replace(docblocks.CLONE, str(REPO)), comments=True)
                      for line in block.body.splitlines() if line.strip()])
    assert found[0] == found[1], "README.md and docs/mcp.md give other commands"
    return found[0]


def test_the_plugin_installed_from_a_clone_connects_with_no_peerd_on_path(tmp_path: Path) -> None:
    """The docs' commands with the real Claude Code, in a HOME of its own and with no peerd on PATH:
    the plugin's server runs peerd from the clone through uv, and `claude mcp list` shows it connected."""
    env = bare_env(tmp_path / "user", uv_binary())
    subprocess.run([str(PEERD), "init", "--home", str(tmp_path / "user" / ".local" / "share" / "peerd")], check=True,
                   capture_output=True)  # the default home the plugin serves
    commands = plugin_commands()
    assert [c[:3] for c in commands] == [["claude", "plugin", "marketplace"], ["claude", "plugin", "install"],
                                         ["claude", "mcp", "list"]]
    for command in commands:
        listed = claude(env, *command[1:]).stdout
    line = next((x for x in listed.splitlines() if x.startswith("plugin:peerd:peerd:")), listed)
    assert "Connected" in line, listed


def test_the_installed_copy_runs_peerd_from_its_marketplace_or_says_why(tmp_path: Path) -> None:
    """The plugin as Claude Code's cache holds it runs peerd from the clone its marketplace names (a
    session-start hook shows the role's mail); with no uv, or from a marketplace that is no clone of
    peerd, the hook says why as a systemMessage (exit 0) and the server on stderr (exit 1)."""
    user = tmp_path / "user"
    env = bare_env(user, uv_binary())
    home = user / ".local" / "share" / "peerd"
    with open_home(home) as r:
        r.send_message("builder", "reviewer", "please look at the parser")
    copy = install(env, REPO)
    script = ["sh", str(copy / "scripts" / "run-peerd.sh")]
    start = json.dumps({"hook_event_name": "SessionStart", "source": "startup"})

    def hook(run_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, "hook", "session-start"], input=start, capture_output=True, text=True,
                              timeout=120, env={**run_env, "PEERD_ROLE": "reviewer"}, check=False)

    shown = hook(env)
    assert shown.returncode == 0, shown.stderr
    assert "please look at the parser" in json.loads(shown.stdout)["hookSpecificOutput"]["additionalContext"]
    no_uv = {**env, "PATH": "/usr/bin:/bin"}
    said = hook(no_uv)
    assert said.returncode == 0 and f"running it from the clone at {REPO} needs uv" in json.loads(said.stdout)[
        "systemMessage"]
    server = subprocess.run([*script, "mcp"], capture_output=True, text=True, timeout=60, env=no_uv, check=False)
    assert server.returncode == 1 and server.stderr.startswith("peerd plugin: peerd is not on PATH")
    not_a_clone = tmp_path / "market"  # the marketplace and the plugin alone, no peerd sources beside them
    shutil.copytree(REPO / ".claude-plugin", not_a_clone / ".claude-plugin")
    shutil.copytree(PLUGIN, not_a_clone / "plugins" / "peerd")
    other = bare_env(tmp_path / "other", uv_binary())
    script = ["sh", str(install(other, not_a_clone) / "scripts" / "run-peerd.sh")]
    said = hook(other)
    assert said.returncode == 0 and "no clone of peerd was found" in json.loads(said.stdout)["systemMessage"]
    assert "claude plugin marketplace add /path/to/peerd" in json.loads(said.stdout)["systemMessage"]
