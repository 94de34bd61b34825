"""``peerd codex-wake`` against the pinned Codex (its real app server, a fake model): mail for a role
reaches the Codex session that speaks for the role as new input, and Codex runs it as a turn with
no prompt from anyone.

Each test runs Codex's app server on its control socket in a throwaway CODEX_HOME (as Codex's
terminal UI starts it), sessions that connect to it as the terminal UI does, and ``peerd
codex-wake`` as its own process; the model is ``tests.fakemodels``, which records what Codex sent
it. Needs the pinned Codex (``npm ci --prefix tools/codex``); without it these tests fail.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from peerd.codexwake import Binding, Thread, binding_of, chosen, codex_version, peerd_servers, speaks
from replica import open_home
from tests.agentclis import (
    CODEX,
    client_env,
    codex_app_server,
    codex_client,
    codex_home,
    fake_provider,
    installed,
    start_thread,
)
from tests.daemons import PEERD
from tests.fakemodels import ANSWER, FakeModel, fake_model
from tests.waiting import end_group, eventually, patience


def server_config(home: Path, role: str, *, name: str = "peerd", push: bool = False) -> str:
    """A ``[mcp_servers]`` entry as docs/mcp.md shows it: peerd mcp on ``home``, bound to ``role``."""
    extra = "" if push else ', "--no-push"'
    return f'[mcp_servers.{name}]\ncommand = "peerd"\nargs = ["mcp", "--home", "{home}", "--role", "{role}"{extra}]\n\n'


@dataclass
class Setup:
    tmp: Path
    model: FakeModel
    home: Path  # the peerd home
    codex: Path  # the Codex user's HOME
    env: dict[str, str] = field(default_factory=dict)

    def configure(self, *servers: str) -> None:
        codex_home(self.codex).mkdir(parents=True, exist_ok=True)
        (codex_home(self.codex) / "config.toml").write_text(fake_provider(self.model.url) + "".join(servers))

    def send(self, sender: str, to: str, text: str) -> str:
        with open_home(self.home) as r:
            return r.send_message(sender, to, text).id

    def delivered(self, mid: str) -> tuple[bool, bool]:
        with open_home(self.home) as r:
            (status,) = r.message_status(mid)
        return status.delivered_at is not None, status.read_at is not None


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    installed(CODEX)
    home = tmp_path / "peerd-home"
    done = await asyncio.to_thread(subprocess.run, [str(PEERD), "init", "--home", str(home)],
                                   capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    codex = tmp_path / "codex-user"
    codex.mkdir()
    async with fake_model() as model:
        s = Setup(tmp_path, model, home, codex)
        s.env = client_env(codex, CODEX_HOME=str(codex_home(codex)))
        yield s


@dataclass
class WakerProc:
    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            async with self.changed:
                self.lines.append(raw.decode().rstrip("\n"))
                self.changed.notify_all()
        async with self.changed:
            self.changed.notify_all()

    async def said(self, pattern: str, within: float = 60) -> str:
        """The first line matching ``pattern`` (waited for as the waker prints it)."""
        regex = re.compile(pattern)

        def found() -> str | None:
            return next((line for line in self.lines if regex.search(line)), None)

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: found() is not None or self.proc.returncode
                                                             is not None), patience(within))
            except TimeoutError:
                raise AssertionError(f"peerd codex-wake never said {pattern!r}; it said {self.lines}") from None
        line = found()
        assert line is not None, f"peerd codex-wake exited ({self.proc.returncode}) before {pattern!r}: {self.lines}"
        return line


@asynccontextmanager
async def waker(s: Setup, *args: str) -> AsyncIterator[WakerProc]:
    """``peerd codex-wake`` on the setup's home, finding Codex where Codex's terminal UI does."""
    proc = await asyncio.create_subprocess_exec(str(PEERD), "codex-wake", "--home", str(s.home), *args, env=s.env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                start_new_session=True)
    w = WakerProc(proc)
    reader = asyncio.ensure_future(w.read())
    try:
        yield w
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), patience(20))
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        await reader
    assert proc.returncode == 0, w.lines  # SIGTERM is a clean stop


def user_text(params: Mapping[str, Any]) -> str:
    """The text of a ``userMessage`` item, as a session shows it."""
    item = params.get("item", {})
    return "".join(c.get("text", "") for c in item.get("content", [])) if item.get("type") == "userMessage" else ""


def is_user_message(tid: str, text: str) -> Any:
    return lambda m, p: m == "item/completed" and p.get("threadId") == tid and text in user_text(p)


async def test_a_waiting_session_starts_a_turn_with_new_mail(setup: Setup) -> None:
    """An idle session bound to builder: mail to builder becomes its input, a turn runs on it (the
    model is given the mail), and the message is recorded delivered, not read."""
    s = setup
    s.configure(server_config(s.home, "builder"))
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes), waker(s) as w:
        await w.said(r"connected to Codex 0\.171\.0 at ")
        tid = await start_thread(app, s.tmp)
        await w.said(f"Codex thread {tid} speaks for builder$")
        mid = s.send("alpha", "builder", "please review PR 7")
        await notes.wait_for(is_user_message(tid, "please review PR 7"), "the mail as the session's input")
        turn = await notes.wait_for(lambda m, p: m == "turn/completed" and p.get("threadId") == tid, "the turn's end")
        assert turn["turn"]["status"] == "completed"
        (request,) = await s.model.wait_for("please review PR 7")
        assert "peerd: 1 new unread message(s) for builder" in request.body
        assert f"message_id {mid}" in request.body and "from alpha, channel builder" in request.body
        assert s.delivered(mid) == (True, False)
        await w.said(f"woke Codex thread {tid} \\(builder\\) with 1 message\\(s\\)")


async def test_only_the_session_of_the_role_on_this_node_is_woken(setup: Setup, tmp_path: Path) -> None:
    """Sessions bound to another role, to a role of another peerd home, or with no peerd at all,
    never get builder's mail; a later session of builder takes over from an earlier one."""
    s = setup
    other = tmp_path / "other-home"
    open_home(other).close()
    s.configure(server_config(s.home, "builder"))
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes), waker(s) as w:
        await w.said("connected to Codex")
        first = await start_thread(app, s.tmp)
        await w.said(f"Codex thread {first} speaks for builder$")
        tester = await start_thread(app, s.tmp, {
            "mcp_servers.peerd.args": ["mcp", "--home", str(s.home), "--role", "tester", "--no-push"],
            "mcp_servers.elsewhere.command": "peerd",
            "mcp_servers.elsewhere.args": ["mcp", "--home", str(other), "--role", "builder", "--no-push"]})
        await w.said(f"Codex thread {tester} speaks for tester$")
        bare = await start_thread(app, s.tmp, {"mcp_servers.peerd.enabled": False})
        second = await start_thread(app, s.tmp)
        await w.said(f"Codex thread {second} speaks for builder$")
        s.send("alpha", "builder", "only for the newest builder session")
        await notes.wait_for(is_user_message(second, "only for the newest builder"), "the mail in the newer session")
        await notes.wait_for(lambda m, p: m == "turn/completed" and p.get("threadId") == second, "its turn's end")
        assert [len(notes.matching(is_user_message(t, "peerd:"))) for t in (first, tester, bare)] == [0, 0, 0]
        assert not any(f"thread {first}" in line and "woke" in line for line in w.lines)


async def test_mail_that_waited_goes_to_the_next_session_when_it_starts(setup: Setup) -> None:
    """Mail that arrived while no session of the role ran is handed to the first one Codex starts."""
    s = setup
    s.configure(server_config(s.home, "builder"))
    mid = s.send("alpha", "builder", "sent before any session")
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes), waker(s) as w:
        await w.said("connected to Codex")
        tid = await start_thread(app, s.tmp)
        await notes.wait_for(is_user_message(tid, "sent before any session"), "the waiting mail as input")
        assert s.delivered(mid) == (True, False)


async def test_a_busy_session_takes_the_mail_after_its_turn(setup: Setup) -> None:
    """Mail that lands during a turn is queued, not lost or steered in: the next turn runs on it."""
    s = setup
    s.configure(server_config(s.home, "builder"))
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes), waker(s) as w:
        await w.said("connected to Codex")
        tid = await start_thread(app, s.tmp)
        await w.said(f"Codex thread {tid} speaks for builder$")
        s.model.hold()
        await app.call("turn/start", {"threadId": tid, "input": [{"type": "text", "text": "a long task"}]})
        await s.model.wait_for("a long task")  # the turn is under way: the model has it
        s.send("alpha", "builder", "news during the turn")
        await w.said(f"woke Codex thread {tid}")
        queued = await app.call("thread/queue/list", {"threadId": tid})
        assert ["news during the turn" in str(q["input"]) for q in queued["data"]] == [True]
        assert not s.model.holding("news during the turn")
        s.model.release()
        await notes.wait_for(is_user_message(tid, "news during the turn"), "the mail as the next turn's input")
        ends = await eventually(lambda: len(notes.matching(lambda m, p: m == "turn/completed")) >= 2 or None, 60,
                                "both turns to end")
        assert ends


async def test_codex_hooks_and_the_waker_show_each_message_once(setup: Setup) -> None:
    """With the documented hooks (trusted, as /hooks records it) and the waker, the woken turn's
    model request holds the message once: the prompt hook does not show it again."""
    s = setup
    hook = f"peerd hook --home {s.home} --role builder"
    hooks = ('[[hooks.UserPromptSubmit]]\n[[hooks.UserPromptSubmit.hooks]]\ntype = "command"\n'
             f'command = "{hook}"\ntimeout = 10\n\n')
    s.configure(server_config(s.home, "builder"), hooks)
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, _notes):
        listed = await app.call("hooks/list", {"cwds": [str(s.tmp)]})
    (entry,) = listed["data"][0]["hooks"]
    assert entry["trustStatus"] == "untrusted"
    trust = f'[hooks.state."{entry["key"]}"]\ntrusted_hash = "{entry["currentHash"]}"\n'
    s.configure(server_config(s.home, "builder"), hooks, trust)
    async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes), waker(s) as w:
        await w.said("connected to Codex")
        tid = await start_thread(app, s.tmp)
        await w.said(f"Codex thread {tid} speaks for builder$")
        s.send("alpha", "builder", "exactly once please")
        await notes.wait_for(lambda m, p: m == "hook/completed" and p["run"]["eventName"] == "userPromptSubmit",
                             "the prompt hook to run on the woken turn")
        (request,) = await s.model.wait_for("exactly once please")
        assert request.body.count("exactly once please") == 1


async def test_the_waker_waits_for_codex_follows_its_restarts_and_passes_over_a_pushing_server(setup: Setup) -> None:
    """Started before Codex, the waker says where it waits and connects once Codex is up; a session
    whose peerd server pushes channel events is named and passed over; when Codex stops and starts
    again, the waker connects again and wakes its new sessions."""
    s = setup
    s.configure(server_config(s.home, "builder", push=True))
    async with waker(s) as w:
        await w.said(r"waiting for Codex's app server at .*/\.codex/app-server-control/app-server-control\.sock$")
        async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, _notes):
            await w.said("connected to Codex")
            tid = await start_thread(app, s.tmp)
            await w.said(f"Codex thread {tid} speaks for builder, but its peerd server pushes channel events")
        await w.said("lost Codex's app server")
        s.configure(server_config(s.home, "builder"))
        async with codex_app_server(s.codex, s.env) as socket, codex_client(socket) as (app, notes):
            tid = await start_thread(app, s.tmp)
            s.send("alpha", "builder", "after the restart")
            await notes.wait_for(is_user_message(tid, "after the restart"), "the mail in the new session")
        assert sum("connected to Codex" in line for line in w.lines) == 2


# -- Codex's own terminal UI --------------------------------------------------------------------


class Terminal:
    """A program on a pseudo-terminal of 40 rows and 120 columns; answers the cursor-position and
    device-attribute queries a full-screen UI asks its terminal, and keeps what it draws."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: Path) -> None:
        main, sub = pty.openpty()
        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdin=sub, stdout=sub, stderr=sub,
                                     start_new_session=True)
        os.close(sub)
        self.fd = main
        self.screen = bytearray()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.screen += data
            if b"\x1b[6n" in data:
                os.write(self.fd, b"\x1b[1;1R")
            if b"\x1b[c" in data:
                os.write(self.fd, b"\x1b[?62;22c")

    def text(self) -> str:
        with self.lock:
            raw = bytes(self.screen).decode(errors="replace")
        return re.sub(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Z0-9]|\x1b[=>78DEHM]",
                      "", raw)

    def close(self) -> None:
        end_group(self.proc)
        os.close(self.fd)
        self.reader.join(timeout=5)


async def test_codex_terminal_ui_waiting_for_a_prompt_is_woken_by_mail(setup: Setup) -> None:
    """Codex's own terminal UI, started as a user starts it and left waiting: mail to its role
    starts a turn in it, with nobody typing; the model gets the mail and the UI shows the answer."""
    s = setup
    s.configure(server_config(s.home, "builder"))
    work = s.tmp / "project"
    work.mkdir()
    async with codex_app_server(s.codex, s.env) as _socket, waker(s) as w:
        await w.said("connected to Codex")
        tui = Terminal([str(installed(CODEX)), "--no-alt-screen", "-C", str(work)], {**s.env, "TERM": "xterm-256color"},
                       work)
        try:
            line = await w.said(r"Codex thread \S+ speaks for builder$", within=90)
            tid = line.split("Codex thread ", 1)[1].split()[0]
            s.send("alpha", "builder", "the terminal UI should see this")
            await s.model.wait_for("the terminal UI should see this", within=90)
            await w.said(f"woke Codex thread {tid} \\(builder\\)")
            await eventually(lambda: ANSWER in tui.text(), 60, "the model's answer on the terminal UI's screen")
        finally:
            await asyncio.to_thread(tui.close)


# -- pure parts -----------------------------------------------------------------------------------


def test_peerd_servers_are_known_by_their_server_info_and_pushing_ones_are_told() -> None:
    """A thread's peerd servers are those named peerd by their own serverInfo (whatever the config
    calls them), connected; one declaring claude/channel pushes."""
    statuses: list[dict[str, Any]] = [
        {"name": "peerd", "runtimeStatus": "connected", "serverInfo": {"name": "peerd"}, "serverCapabilities": {}},
        {"name": "mail", "runtimeStatus": "connected", "serverInfo": {"name": "peerd"},
         "serverCapabilities": {"experimental": {"claude/channel": {}}}},
        {"name": "down", "runtimeStatus": "failed", "serverInfo": {"name": "peerd"}},
        {"name": "peerd-lookalike", "runtimeStatus": "connected", "serverInfo": {"name": "other"}},
        {"name": "starting", "runtimeStatus": None, "serverInfo": None},
    ]
    assert peerd_servers(statuses) == [("peerd", False), ("mail", True)]


def test_a_binding_is_this_nodes_and_bound() -> None:
    """whoami through Codex binds a thread only for this node's server and a bound role."""
    me = "ab" * 32

    def who(**kw: Any) -> dict[str, Any]:
        return {"structuredContent": {"nodeId": me, "fleetId": "f", "role": "builder", "instanceId": None, **kw}}

    assert binding_of(who(), me) == Binding("builder", None)
    assert binding_of(who(instanceId="laptop"), me, pushes=True) == Binding("builder", "laptop", True)
    assert binding_of(who(nodeId="cd" * 32), me) is None
    assert binding_of(who(role=None), me) is None
    assert binding_of({"content": [], "isError": True}, me) is None


def test_the_newest_session_of_a_role_and_instance_is_chosen() -> None:
    """One thread per (role, instance), the one started last; pushing servers and other roles
    (when roles are named) are left out; names match as peerd matches them."""
    threads = {
        "old": Thread(Binding("Builder", None), (0, 5.0)),
        "loaded": Thread(Binding("builder", None), (0, 9.0)),
        "started": Thread(Binding("builder", None), (1, 1.0)),
        "laptop": Thread(Binding("builder", "laptop"), (0, 1.0)),
        "pushy": Thread(Binding("tester", None, pushes=True), (1, 9.0)),
        "none": Thread(None, (1, 10.0)),
    }
    assert chosen(threads, frozenset()) == {("builder", ""): "started", ("builder", "laptop"): "laptop"}
    assert chosen(threads, frozenset({"tester"})) == {}


def test_sub_agent_and_ephemeral_threads_never_speak_for_a_role() -> None:
    assert speaks({"parentThreadId": None, "ephemeral": False})
    assert not speaks({"parentThreadId": "t1", "ephemeral": False})
    assert not speaks({"parentThreadId": None, "ephemeral": True})


def test_codex_version_is_read_from_its_user_agent() -> None:
    assert codex_version({"userAgent": "peerd/0.171.0 (Debian 12.0.0; x86_64) xterm (peerd; 0.3.0)"}) == "0.171.0"
    assert codex_version({}) == "(version unknown)"
