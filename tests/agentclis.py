"""The agent CLIs the tests connect to peerd for real, at the releases ``tools/`` pins: where each
is, the environment it runs in (a throwaway HOME of its own, peerd on PATH), and Codex's app
server started and spoken to as Codex's own terminal UI does.

``scripts/test`` installs them (``npm ci --prefix tools/<name>``); a test whose CLI is missing
fails, saying how to install it: it never skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from peerd.codexapp import CONTROL_SOCKET, CodexApp, CodexError
from tests import docblocks
from tests.daemons import PEERD
from tests.waiting import eventually, patience

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
CLAUDE = TOOLS / "claude-code" / "node_modules" / ".bin" / "claude"
CODEX = TOOLS / "codex" / "node_modules" / ".bin" / "codex"
GEMINI = TOOLS / "gemini-cli" / "node_modules" / ".bin" / "gemini"
QWEN = TOOLS / "qwen-code" / "node_modules" / ".bin" / "qwen"
NODE22 = TOOLS / "inspector" / "node_modules" / ".bin"  # Qwen Code asks for Node 22; the Inspector pins it
MCP_DOC = REPO / "docs" / "mcp.md"


def installed(cli: Path) -> Path:
    """``cli``, or a failed test saying how to install it."""
    if not cli.exists():
        folder = cli.parents[2].relative_to(REPO)
        pytest.fail(f"{cli.name} is not installed: run ./scripts/test, which installs it "
                    f"(npm ci --prefix {folder})")
    if cli == QWEN and not (NODE22 / "node").exists():
        pytest.fail("Qwen Code runs on the Inspector's Node 22: npm ci --prefix tools/inspector")
    return cli


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A client's environment: this user's, with HOME a throwaway folder, this checkout's peerd
    and Node 22 first on PATH, no peerd or model settings of the caller's, no update checks."""
    drop = ("PEERD_", "CODEX_", "GEMINI_", "GOOGLE_", "ANTHROPIC_", "OPENAI_", "CLAUDE", "QWEN", "XDG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(HOME=str(home), PATH=os.pathsep.join([str(PEERD.parent), str(NODE22), env.get("PATH", "")]),
               DISABLE_AUTOUPDATER="1", NO_COLOR="1", CI="1")
    env.update(extra)
    return env


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


async def run(argv: list[str], env: Mapping[str, str], cwd: Path, *, within: float = 120) -> Run:
    """Run a command to its end (the event loop keeps serving meanwhile: fake models, peerd)."""
    proc = await asyncio.create_subprocess_exec(*argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), patience(within))
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


async def shell(line: str, env: Mapping[str, str], cwd: Path) -> Run:
    """A documented command line, typed in a shell (which reads ``$(cat ...)`` and ``~``)."""
    return await run(["bash", "-c", line], env, cwd)


# -- the documented configurations ----------------------------------------------------------------


def section(heading: str) -> list[docblocks.Block]:
    """The blocks of one ``###`` section of docs/mcp.md."""
    text = MCP_DOC.read_text().split(f"\n### {heading}\n", 1)[1].split("\n### ", 1)[0]
    return docblocks.blocks("docs/mcp.md", text)


def command_lines(block: docblocks.Block) -> list[str]:
    return [line for line in (docblocks.strip_comment(x) for x in docblocks.logical_lines(block.body)) if line]


def filled(text: str, home: Path, *, role: str, port: int | None = None) -> str:
    """A documented line or file with the reader's values: their home, the role, the local port."""
    text = text.replace(docblocks.HOME, str(home)).replace(docblocks.CLONE, str(REPO)).replace("ROLE", role)
    return text if port is None else text.replace("<local-port>", str(port))


# -- Codex's app server -----------------------------------------------------------------------------


def fake_provider(model_url: str) -> str:
    """Codex config lines that send its model requests to the fake model (no account needed)."""
    return ('model = "fake-model"\napproval_policy = "never"\nsandbox_mode = "read-only"\n'
            'model_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{model_url}/v1"\nwire_api = "responses"\nrequires_openai_auth = false\n'
            "supports_websockets = false\nrequest_max_retries = 0\nstream_max_retries = 0\n\n")


@dataclass
class Notes:
    """The notifications one Codex connection received, to wait on."""

    seen: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _telling: set[asyncio.Future[None]] = field(default_factory=set)

    def __call__(self, method: str, params: Mapping[str, Any]) -> None:
        self.seen.append((method, params))
        told = asyncio.ensure_future(self._notify())
        self._telling.add(told)
        told.add_done_callback(self._telling.discard)

    async def _notify(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    def matching(self, pred: Callable[[str, Mapping[str, Any]], bool]) -> list[Mapping[str, Any]]:
        return [p for m, p in self.seen if pred(m, p)]

    async def wait_for(self, pred: Callable[[str, Mapping[str, Any]], bool], what: str,
                       within: float = 60) -> Mapping[str, Any]:
        async with self._arrived:
            try:
                await asyncio.wait_for(self._arrived.wait_for(lambda: bool(self.matching(pred))), patience(within))
            except TimeoutError:
                raise AssertionError(f"no {what}; seen: {[m for m, _ in self.seen]}") from None
        return self.matching(pred)[0]


def codex_home(home: Path) -> Path:
    return home / ".codex"


@asynccontextmanager
async def codex_app_server(home: Path, env: Mapping[str, str]) -> AsyncIterator[Path]:
    """Codex's app server for ``home`` (its CODEX_HOME ``home/.codex``) on its control socket, the
    one Codex's terminal UI attaches to; yields the socket once it answers."""
    socket = codex_home(home) / CONTROL_SOCKET
    log = (home / "codex-app-server.log").open("ab")
    proc = await asyncio.create_subprocess_exec(str(installed(CODEX)), "app-server", "--listen", "unix://",
                                                env={**env, "CODEX_HOME": str(codex_home(home))}, cwd=home,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                start_new_session=True)

    async def answers() -> bool:
        if proc.returncode is not None:
            raise AssertionError(f"codex app-server exited {proc.returncode}: {(home / 'codex-app-server.log').read_text()}")
        try:
            app = await CodexApp.connect(socket, lambda _m, _p: None)
        except CodexError:
            return False
        await app.close()
        return True

    try:
        await eventually(answers, 60, "Codex's app server to answer on its socket", interval=0.1)
        yield socket
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), patience(20))
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        log.close()


@asynccontextmanager
async def codex_client(socket: Path) -> AsyncIterator[tuple[CodexApp, Notes]]:
    """A connection to Codex's app server, as a Codex UI makes one, with its notifications."""
    notes = Notes()
    app = await CodexApp.connect(socket, notes, client="peerd-tests")
    try:
        yield app, notes
    finally:
        await app.close()


async def start_thread(app: CodexApp, cwd: Path, config: Mapping[str, Any] | None = None) -> str:
    """A new session, as Codex's terminal UI starts one (it stays subscribed to the thread);
    ``config`` overrides config.toml for this session alone (as ``codex -c`` does)."""
    started = await app.call("thread/start", {"cwd": str(cwd), **({"config": dict(config)} if config else {})})
    return str(started["thread"]["id"])
