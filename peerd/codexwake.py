"""Waking Codex: a role's new mail handed, as new input, to the Codex session that speaks for the
role; Codex runs it as a turn at once when the session waits, or after the turn it is in.

Invariants:
* Codex itself says which session speaks for a role: a thread loaded in its app server whose MCP
  servers include a peerd server (``serverInfo.name`` ``peerd``) answering ``whoami``, through
  Codex's ``mcpServer/tool/call``, with this node's id and a role: the role (and instance) the
  agent's own tools are bound to. Sub-agent threads (with a parent) and ephemeral ones never
  speak for a role, and a thread whose peerd server pushes channel events (Codex drops them, and
  they count as delivered) is passed over, saying so. One thread per (role, instance) is woken:
  the one Codex started last.
* What is handed over is what ``check_messages`` would return and nobody has delivered
  (``Replica.mail``, pending only), from the allowed senders: at most ``limit`` messages framed as
  the prompt hook frames them (``mcp_server.framing.hook_text``), in one queued input
  (``thread/queue/add``), the rest counted (they stay pending; ``check_messages`` lists them).
  A thread that waits with the input still queued is started on it (``thread/queue/start``).
* Once each: each thread has a cursor that only moves forward, and a message's delivery is
  recorded before it is queued (so the prompt hook of the turn it starts does not show it again).
  A batch Codex did not take is kept and handed to the role's session once there is one again;
  it is never lost either way (nothing is ever marked read).
* Nothing polls: the waker waits on the replica's change feed and on Codex's notifications
  (``thread/started``, ``thread/closed``), and looks at Codex's loaded threads once per change;
  only reconnecting to a Codex that is not there waits on a timer (backoff up to ``RETRY_MAX``).
* peerd approves nothing and answers nothing for the agent: the agent reads and answers with its
  own tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_server.framing import allowed, hook_text
from peerd.codexapp import CodexApp, CodexError
from replica import Replica
from replica.feed import Waiter
from replica.mailbox import Mail
from replica.names import name_key

PAGE = 1000  # pending mail read per look
DEFAULT_LIMIT = 10  # messages shown in full in one input, as `peerd hook`
RETRY_MIN, RETRY_MAX = 0.25, 5.0  # seconds between tries to reach a Codex that is not there
GONE = ("thread/closed", "thread/archived", "thread/deleted")
LIVE = (None, "notStarted", "starting", "connected")  # an MCP server's runtimeStatus while it is or may be up


@dataclass(frozen=True)
class Binding:
    """Whom a Codex thread's peerd tools speak for; ``pushes``: its server pushes channel events."""

    role: str
    instance: str | None
    pushes: bool = False

    @property
    def target(self) -> tuple[str, str]:
        return name_key(self.role), name_key(self.instance) if self.instance else ""


@dataclass
class Thread:
    """A loaded Codex thread as the waker knows it: whom it speaks for (None: nobody), when it was
    seen to start (the later wins a role), and where its look at the mail ended."""

    binding: Binding | None
    order: tuple[int, float]
    cursor: int = 0


@dataclass
class Options:
    roles: frozenset[str] = frozenset()  # name keys; empty: every role a session speaks for
    senders: Sequence[str] = ()
    limit: int = DEFAULT_LIMIT


# -- pure parts -----------------------------------------------------------------------------------


def peerd_servers(statuses: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """The servers of a thread's MCP server list that are peerd (by their own ``serverInfo``,
    whatever the configuration calls them) and connected or still starting: each one's name, and
    whether it pushes channel events (it declares ``claude/channel``: started without ``--no-push``)."""
    found = []
    for s in statuses:
        info, caps = s.get("serverInfo"), s.get("serverCapabilities")
        if isinstance(info, dict) and info.get("name") == "peerd" and s.get("runtimeStatus") in LIVE:
            experimental = caps.get("experimental") if isinstance(caps, dict) else None
            found.append((str(s["name"]), isinstance(experimental, dict) and "claude/channel" in experimental))
    return found


def binding_of(result: Any, node_id: str, *, pushes: bool = False) -> Binding | None:
    """The binding a ``whoami`` result through Codex states, if it is this node's and bound."""
    who = result.get("structuredContent") if isinstance(result, dict) else None
    if not isinstance(who, dict) or who.get("nodeId") != node_id or not isinstance(who.get("role"), str):
        return None
    instance = who.get("instanceId")
    return Binding(who["role"], instance if isinstance(instance, str) and instance else None, pushes)


def speaks(info: Mapping[str, Any]) -> bool:
    """Whether a thread may speak for a role at all: not a sub-agent's, not ephemeral."""
    return not info.get("parentThreadId") and not info.get("ephemeral")


def chosen(threads: Mapping[str, Thread], roles: frozenset[str]) -> dict[tuple[str, str], str]:
    """For each (role, instance) that a thread speaks for, the thread Codex started last."""
    best: dict[tuple[str, str], tuple[tuple[int, float], str]] = {}
    for tid, t in threads.items():
        if t.binding is None or t.binding.pushes or (roles and t.binding.target[0] not in roles):
            continue
        if t.binding.target not in best or t.order > best[t.binding.target][0]:
            best[t.binding.target] = (t.order, tid)
    return {target: tid for target, (_, tid) in best.items()}


def codex_version(server: Mapping[str, Any]) -> str:
    """Codex's version, from its ``initialize`` result (``userAgent`` is ``<client>/<version> ...``)."""
    agent = str(server.get("userAgent", ""))
    match = re.search(r"/(\d+\.\d+\.\d+\S*)", agent)
    return match.group(1) if match else "(version unknown)"


def wake_input(binding: Binding, items: Sequence[Mail], more: int) -> list[dict[str, Any]]:
    """The queued input: the hook's framing of the mail, as one text."""
    text = hook_text(binding.role, binding.instance, items, more, new_only=True)
    return [{"type": "text", "text": text, "text_elements": []}]


# -- the waker ------------------------------------------------------------------------------------


@dataclass
class Waker:
    """Follows a replica and one Codex app server; hands each role's new mail to its session."""

    replica: Replica
    waiter: Waiter
    socket: Path
    options: Options = field(default_factory=Options)
    say: Callable[[str], None] = print
    version: str = ""
    threads: dict[str, Thread] = field(default_factory=dict)
    unsent: dict[tuple[str, str], list[Mail]] = field(default_factory=dict)
    _kick: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _identifying: set[str] = field(default_factory=set)
    _seen: int = 0
    _app: CodexApp | None = None

    async def run(self) -> None:
        """Wake sessions until cancelled, (re)connecting to Codex whenever it is there."""
        delay, told = RETRY_MIN, False
        while True:
            try:
                app = await CodexApp.connect(self.socket, self._note, version=self.version)
            except CodexError:
                if not told:
                    self.say(f"waiting for Codex's app server at {self.socket}")
                    told = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            told = False
            self.say(f"connected to Codex {codex_version(app.server)} at {self.socket}")
            began = asyncio.get_running_loop().time()
            try:
                await self.serve(app)
            except CodexError as exc:
                self.say(f"lost Codex's app server: {exc}")
            finally:
                self._app = None
                await self._stop_tasks()
                await app.close()
                self.threads.clear()
            # a connection that held a while was fine: try again at once; one that broke at once, after a pause
            delay = RETRY_MIN if asyncio.get_running_loop().time() - began > RETRY_MAX else min(delay * 2, RETRY_MAX)
            await asyncio.sleep(delay)

    async def serve(self, app: CodexApp) -> None:
        """Wake on every change (of the replica, or of Codex's threads) until the connection closes
        (then raise ``CodexError``)."""
        self._app = app
        while not app.closed:
            mark = await asyncio.to_thread(self.replica.max_lseq)
            await self._discover(app)
            for target, tid in chosen(self.threads, self.options.roles).items():
                await self.wake(app, tid, target, mark)
            await self._wait(app, mark)
        raise CodexError("Codex's app server closed the connection", kind="unavailable")

    async def _discover(self, app: CodexApp) -> None:
        """Learn of loaded threads not known yet (``thread/started`` tells of new ones at once; a
        look at each change also finds those started while the waker was away)."""
        cursor: str | None = None
        while True:
            page = await app.call("thread/loaded/list", {"cursor": cursor} if cursor else {})
            for tid in page.get("data", []):
                self._identify_later(app, str(tid), None)
            if not (cursor := page.get("nextCursor")):
                return

    async def wake(self, app: CodexApp, tid: str, target: tuple[str, str], mark: int) -> None:
        """Queue (role, instance)'s pending mail, and what Codex did not take before, on thread ``tid``."""
        t = self.threads.get(tid)
        if t is None or t.binding is None:
            return  # gone while another thread was woken
        mail: list[Mail] = await asyncio.to_thread(self.replica.mail, t.binding.role, t.binding.instance,
                                                   after=t.cursor, limit=PAGE, pending_only=True)
        t.cursor = mail[-1].seq if len(mail) >= PAGE else max(mark, t.cursor, *(m.seq for m in mail))
        fresh = [m for m in mail if allowed(m.sender, self.options.senders)]
        batch = list({m.key: m for m in [*self.unsent.pop(target, []), *fresh]}.values())
        if not batch:
            return
        shown = batch[: self.options.limit]
        await asyncio.to_thread(self.replica.record_delivered, shown)
        try:
            await self.queue(app, tid, wake_input(t.binding, shown, len(batch) - len(shown)))
        except CodexError as exc:
            self.unsent[target] = shown
            if exc.kind != "refused":
                raise
            self.say(f"Codex thread {tid} did not take {t.binding.role}'s mail ({exc}); kept for its next session")
            self.threads.pop(tid, None)
            return
        self.say(f"woke Codex thread {tid} ({t.binding.role}) with {len(shown)} message(s)")

    async def queue(self, app: CodexApp, tid: str, items: list[dict[str, Any]]) -> None:
        """Queue ``items`` as the thread's next input; start it if the thread waits with it queued
        (Codex starts a queue by itself when a turn ends, or at once on an idle thread; a queue that
        was held, as after an interrupted turn, is started here)."""
        self._seen += 1
        added = await app.call("thread/queue/add", {"threadId": tid, "input": items,
                                                    "clientUserMessageId": f"peerd-{self._seen}-{tid}"})
        submission = added["queuedSubmission"]["id"]
        thread = (await app.call("thread/read", {"threadId": tid}))["thread"]
        if thread.get("status", {}).get("type") == "idle":
            with contextlib.suppress(CodexError):  # refused: Codex started it meanwhile
                await app.call("thread/queue/start", {"threadId": tid, "queuedSubmissionId": submission})

    # -- Codex's side ---------------------------------------------------------------------------

    def _note(self, method: str, params: Mapping[str, Any]) -> None:
        if method == "thread/started" and isinstance(params.get("thread"), dict) and self._app is not None:
            info = params["thread"]
            self._identify_later(self._app, str(info.get("id")), info)
        elif (method in GONE or (method == "thread/status/changed"
                                 and params.get("status", {}).get("type") == "notLoaded")) \
                and self.threads.pop(str(params.get("threadId")), None) is not None:
            self._kick.set()

    def _identify_later(self, app: CodexApp, tid: str, info: Mapping[str, Any] | None) -> None:
        if tid in self.threads or tid in self._identifying:
            return
        self._identifying.add(tid)
        task = asyncio.ensure_future(self._identify(app, tid, info))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _done: self._identifying.discard(tid))

    async def _identify(self, app: CodexApp, tid: str, info: Mapping[str, Any] | None) -> None:
        """Learn whom thread ``tid`` speaks for (asking its peerd server through Codex)."""
        started = info is not None
        try:
            if info is None:
                info = (await app.call("thread/read", {"threadId": tid}))["thread"]
            binding = await self._binding(app, tid) if speaks(info) else None
        except CodexError as exc:
            if exc.kind != "unavailable":  # else the connection is gone: the run loop says so
                self.say(f"cannot tell whom Codex thread {tid} speaks for: {exc}")
            return
        self._seen += 1
        order = (1, float(self._seen)) if started else (0, float(info.get("createdAt") or 0))
        self.threads[tid] = Thread(binding, order)
        if binding is not None and (not self.options.roles or binding.target[0] in self.options.roles):
            who = binding.role + (f" (instance {binding.instance})" if binding.instance else "")
            self.say(f"Codex thread {tid} speaks for {who}" if not binding.pushes else
                     f"Codex thread {tid} speaks for {who}, but its peerd server pushes channel events, which Codex "
                     "drops while they count as delivered: passed over (start that server with --no-push)")
        self._kick.set()

    async def _binding(self, app: CodexApp, tid: str) -> Binding | None:
        """Ask each peerd server of thread ``tid`` whom it speaks for, through Codex. The thread's
        list names its servers (they may still be starting); asked by name, Codex answers once the
        thread's own connection to that server is up."""
        candidates = [name for name, _ in peerd_servers(await self._statuses(app, {"threadId": tid}))]
        found = None
        for name in candidates:
            own = [st for st in await self._statuses(app, {"threadId": tid, "serverName": name})
                   if st.get("name") == name and st.get("runtimeStatus") in ("connected", None)]
            up = peerd_servers(own)
            if not up:
                continue  # it failed to start
            pushes = up[0][1]
            result = await app.call("mcpServer/tool/call", {"threadId": tid, "server": name, "tool": "whoami",
                                                            "arguments": {}})
            binding = binding_of(result, self.replica.node_id, pushes=pushes)
            if binding is not None and (found is None or found.pushes):
                found = binding  # a server that does not push wins
        return found

    @staticmethod
    async def _statuses(app: CodexApp, params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        statuses: list[Mapping[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await app.call("mcpServerStatus/list", {**params, "detail": "toolsAndAuthOnly",
                                                           **({"cursor": cursor} if cursor else {})})
            statuses += page.get("data", [])
            if not (cursor := page.get("nextCursor")):
                return statuses

    async def _wait(self, app: CodexApp, mark: int) -> None:
        """Until the replica moves past ``mark``, a thread is learnt or gone, or Codex leaves."""
        waits = [asyncio.ensure_future(self.waiter.wait_beyond(mark)), asyncio.ensure_future(self._kick.wait()),
                 asyncio.ensure_future(app.wait_closed())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            self._kick.clear()

    async def _stop_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
