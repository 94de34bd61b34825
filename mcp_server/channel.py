"""Mail that wakes the agent: Claude Code channel events and resource updates, pushed to MCP sessions.

Invariants:
* One ``PushHub`` per MCP server. Each session it serves has at most one follower task,
  which waits on the process's one change feed through the ``Waiter`` (one future while
  nothing happens) and, on each change, pushes new mail and sends resource updates.
  Nothing polls.
* A message is pushed to a session at most once (the session's cursor only moves
  forward) and to a reader (role, instance) once ever: only mail with no *delivered*
  time is pushed, and once its notification is written, its receipt records
  *delivered*. ``replay_unread`` is the one way to push unread mail again. Pushing never
  marks anything read.
* Only messages read from the replica are pushed, so every one is a signed op of the
  fleet verified on arrival; bodies are framed by ``framing`` so they cannot pose as the
  user or the system; an allowlist of senders narrows pushes (the rest still wait for
  ``check_messages``). At most ``BURST`` messages are pushed one by one per change; the
  rest of a burst is one summary event and stays undelivered.
* Notifications go out on the session's standalone channel: on stdio at once; on HTTP only
  while the session's GET stream is open (``mcp_server.streamwatch`` tells the hub). What a
  session asks for and how a push looks on the wire are ``mcp_server.channelwire``. Mail that lands
  before the stream opens, or while it is closed, stays undelivered and is pushed when it
  opens: a push is never recorded for a stream that is not there.
* A session bound to a role is also told when a lease of that role is found lost or won here
  (``mcp_server.leasepush``), once each, before the mail of the same change.
* Resource updates go only to sessions that subscribed to that URI, and only when the
  resource's text changed since the subscription or the last update. That is
  ``resources/subscribe``, on the handshake revisions; at 2026-07-28 a client listens
  (``subscriptions/listen``) and ``mcp_server.listen`` (the hub's ``listens``) tells its streams.
* A 2026-07-28 client on stdio sends no ``notifications/initialized``: its session is attached
  at its first request, and the pipe carries its pushes as on the handshake revisions. A
  2026-07-28 HTTP request has no standing stream: no pushes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, ServerNotification, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field

from mcp_server import framing, leasepush, resources
from mcp_server.channelwire import (
    CHANNEL_CAPABILITY,
    ChannelNotification,
    ChannelParams,
    ConfigOf,
    PushConfig,
    SessionKey,
    decorate_handshake,
    http_config,
    session_key,
)
from mcp_server.listen import Listens
from mcp_server.tools import Call, ToolSpec
from replica import InvalidArgument, PeerdError, Replica
from replica.feed import Waiter
from replica.mailbox import Mail

__all__ = ["BURST", "CHANNEL_CAPABILITY", "PushConfig", "PushHub", "ReplayArgs", "ReplayOut", "http_config",
           "replay_tool"]

log = logging.getLogger("mcp_server.channel")

BURST = 20  # messages pushed one by one per change; more become one summary event
PAGE = 1000  # mail read per look
IDLE_SESSION_SECONDS = 1800.0  # an HTTP session with no request and no stream for this long is forgotten


# -- one session --------------------------------------------------------------------------------


@dataclass
class Session:
    """Push state of one MCP session."""

    key: SessionKey
    config: PushConfig = field(default_factory=PushConfig)
    outlet: ServerSession | None = None  # set once the client said notifications/initialized
    stream_open: bool = False  # stdio: always; HTTP: while its GET stream is open
    cursor: int = 0  # mail up to this arrival position has been looked at
    subs: dict[str, str] = field(default_factory=dict)  # subscribed URI -> digest last announced
    task: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seen: float = 0.0  # loop time of its last request or stream event
    pushed: int = 0
    lease_cursor: int | None = None  # lease losses up to here were told (``mcp_server.leasepush``)

    @property
    def ready(self) -> bool:
        return self.outlet is not None and self.stream_open

    @property
    def wanted(self) -> bool:
        return self.config.active or bool(self.subs)

    async def send(self, notification: BaseModel) -> bool:
        """Hand one notification to the transport; False if the session is gone."""
        if self.outlet is None:
            return False
        try:
            await self.outlet.send_notification(cast(ServerNotification, notification))
        except Exception as exc:  # a closed stream or connection: the session is over
            log.debug("push to session %s failed: %s", self.key, exc)
            return False
        return True


CURRENT: contextvars.ContextVar[Session | None] = contextvars.ContextVar("peerd_push_session", default=None)


# -- the hub --------------------------------------------------------------------------------------


class PushHub:
    """Every session of one MCP server that may get pushes or resource updates."""

    def __init__(self, replica: Callable[[], Replica], waiter: Waiter, config_of: ConfigOf) -> None:
        self._replica = replica
        self._waiter = waiter
        self._config_of = config_of
        self._sessions: dict[SessionKey, Session] = {}
        self._closed = False
        self.listens = Listens(self._run, waiter)  # resource updates for 2026-07-28 listen streams

    @property
    def sessions(self) -> Mapping[SessionKey, Session]:
        return self._sessions

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        replica = self._replica()
        return await asyncio.to_thread(lambda: fn(replica, *args, **kwargs))

    # -- sessions ---------------------------------------------------------------------------

    def _session(self, key: SessionKey, *, stdio: bool = False) -> Session:
        s = self._sessions.get(key)
        if s is None:
            self._prune()
            s = self._sessions[key] = Session(key, stream_open=stdio)
        s.seen = asyncio.get_running_loop().time()
        return s

    def _prune(self) -> None:
        """Forget HTTP sessions idle past the SDK's session timeout (no request, no stream)."""
        now = asyncio.get_running_loop().time()
        for key, s in list(self._sessions.items()):
            if key is not None and not s.stream_open and now - s.seen > IDLE_SESSION_SECONDS:
                self._drop(key)

    def _drop(self, key: SessionKey) -> None:
        s = self._sessions.pop(key, None)
        if s is not None and s.task is not None:
            s.task.cancel()

    def _kick(self, s: Session) -> None:
        """Start the session's follower if it has something to do and is not running."""
        if self._closed or not s.ready or not s.wanted or (s.task is not None and not s.task.done()):
            return
        s.task = asyncio.create_task(self._follow(s), name=f"peerd-push-{s.key or 'stdio'}")

    def stream_opened(self, key: str) -> None:
        s = self._session(key)
        s.stream_open = True
        self._kick(s)

    def stream_closed(self, key: str) -> None:
        s = self._sessions.get(key)
        if s is not None:
            s.stream_open = False
            if s.task is not None:
                s.task.cancel()
                s.task = None

    def session_closed(self, key: str) -> None:
        self._drop(key)

    def touch(self, key: str) -> None:
        s = self._sessions.get(key)
        if s is not None:
            s.seen = asyncio.get_running_loop().time()

    async def aclose(self) -> None:
        """Stop every follower (the server is going away)."""
        self._closed = True
        tasks = [s.task for s in self._sessions.values() if s.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.listens.aclose()

    # -- the MCP side -----------------------------------------------------------------------

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Sees every inbound message: decorates ``initialize`` and ``server/discover``, attaches
        sessions (at ``notifications/initialized``; a 2026-07-28 stdio client, which sends none,
        at its first request), answers ``resources/(un)subscribe`` on the handshake revisions
        (2026-07-28 has ``subscriptions/listen`` instead: ``mcp_server.listen``), and lets tool
        calls find their session (``CURRENT``)."""
        stdio = ctx.request is None
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        key = None if stdio else session_key(ctx.request)
        if ctx.method in ("resources/subscribe", "resources/unsubscribe") and not modern:
            if not stdio and key is None:
                raise MCPError(code=INVALID_PARAMS, message="invalid_argument: subscriptions need a session "
                               "(a stateful MCP session with an mcp-session-id)")
            return await self._subscription(self._session(key, stdio=stdio), ctx)
        s = self._session(key, stdio=stdio) if stdio or key is not None else None
        if s is not None and stdio and modern and s.outlet is None:
            self._attach(s, ctx)  # the pipe is the session's stream from its first request on
        if ctx.method in ("initialize", "server/discover"):
            # a 2026-07-28 HTTP request has no standing stream: no channel is promised there
            return decorate_handshake(await call_next(ctx), self._config_of(ctx.request), channel=stdio or not modern)
        token = CURRENT.set(s)
        try:
            result = await call_next(ctx)
        finally:
            CURRENT.reset(token)
        if ctx.method == "notifications/initialized" and s is not None:
            self._attach(s, ctx)
        return result

    def _attach(self, s: Session, ctx: ServerRequestContext[Any, Any]) -> None:
        """The session's client reads its stream from now on: push to it."""
        s.config = self._config_of(ctx.request)
        s.outlet = ctx.session
        self._kick(s)

    async def _subscription(self, s: Session, ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
        uri = (ctx.params or {}).get("uri")
        ref = resources.parse_uri(uri)
        if ref is None:
            raise MCPError(code=INVALID_PARAMS, message=f"invalid_argument: not a peerd resource URI: {uri!r} "
                           "(peerd://inbox/ROLE, peerd://inbox/ROLE/INSTANCE or peerd://thread/THREAD_ID)")
        assert isinstance(uri, str)
        if ctx.method == "resources/unsubscribe":
            s.subs.pop(uri, None)
            return {}
        try:
            s.subs[uri] = await self._run(resources.digest, ref)
        except PeerdError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"invalid_argument: {exc}") from None
        if s.outlet is None:
            s.outlet = ctx.session
        self._kick(s)
        return {}

    # -- following the feed -----------------------------------------------------------------

    async def _follow(self, s: Session) -> None:
        """Push and update on every change of the feed until the session or the host goes away."""
        seen = -1
        try:
            while s.ready and s.wanted:
                mark = await self._run(Replica.max_lseq)
                if mark == seen:
                    return  # woken without a change: the host is closing
                seen = mark
                async with s.lock:
                    alive = await self._push_new(s, mark) and await self._update_subs(s)
                if not alive:
                    return
                await self._waiter.wait_beyond(seen)
        except PeerdError as exc:  # the replica failed: stop pushing, the tools still report errors
            log.warning("stopped pushing to session %s: %s", s.key or "stdio", exc)
        except Exception:  # a bug: say so once, and leave the session's tools working
            log.exception("stopped pushing to session %s", s.key or "stdio")

    async def _push_new(self, s: Session, mark: int) -> bool:
        cfg = s.config
        if not cfg.active or cfg.binding.role is None:
            return True
        alive, s.lease_cursor = await leasepush.tell(self._run, s.send, cfg.binding.role, s.lease_cursor)
        while alive:
            mail: list[Mail] = await self._run(Replica.mail, cfg.binding.role, cfg.binding.instance,
                                               after=s.cursor, limit=PAGE, pending_only=True)
            full = len(mail) >= PAGE
            s.cursor = mail[-1].seq if full else max(mark, s.cursor, *(m.seq for m in mail))
            wanted = [m for m in mail if framing.allowed(m.sender, cfg.senders)]
            if not await self._push(s, wanted[:BURST]):
                return False
            if len(wanted) > BURST:
                rest = framing.summary_content(len(wanted) - BURST, cfg.binding.role, full)
                if not await s.send(ChannelNotification(params=ChannelParams(
                        content=rest, meta={"kind": "summary", "count": str(len(wanted) - BURST)}))):
                    return False
                if full:
                    s.cursor = max(mark, s.cursor)
                    return True
            if not full:
                return True
        return False

    async def _push(self, s: Session, mail: Sequence[Mail]) -> bool:
        """Push each message, then record delivered for those written; False if the session is gone.

        A message counts as written from the moment it is handed over: if the follower is
        cancelled (the session ends) while the transport takes it, it may have gone out, and
        it is recorded rather than pushed twice. The recording runs even then."""
        sent: list[Mail] = []
        try:
            for m in mail:
                event = ChannelNotification(params=ChannelParams(content=framing.channel_content(m),
                                                                 meta=framing.channel_meta(m)))
                sent.append(m)
                if not await s.send(event):
                    sent.pop()
                    return False
            return True
        finally:
            if sent:
                s.pushed += len(sent)
                await self._record(sent)

    async def _record(self, sent: Sequence[Mail]) -> None:
        """Record delivery, and let it land even if the follower is cancelled meanwhile (the
        next session must not see these as pending)."""
        write = asyncio.ensure_future(self._run(Replica.record_delivered, sent))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            await write
            raise

    async def _update_subs(self, s: Session) -> bool:
        for uri, last in list(s.subs.items()):
            ref = resources.parse_uri(uri)
            if ref is None:
                continue
            now = await self._run(resources.digest, ref)
            if now != last and uri in s.subs:
                s.subs[uri] = now
                if s.outlet is None:
                    return False
                try:
                    await s.outlet.send_resource_updated(uri)
                except Exception as exc:
                    log.debug("resource update to session %s failed: %s", s.key, exc)
                    return False
        return True

    # -- replay -----------------------------------------------------------------------------

    async def replay(self, s: Session, limit: int) -> ReplayOut:
        """Push ``s``'s unread mail again, oldest first, at most ``limit`` messages."""
        cfg = s.config
        if not cfg.active or cfg.binding.role is None:
            why = "pushes are off" if cfg.binding.role else "it is not bound to a role"
            raise InvalidArgument(f"this session gets no pushes: {why}; check_messages lists unread mail")
        if not s.ready:
            raise InvalidArgument("this session has no open stream for pushes yet (open its GET stream); "
                                  "check_messages lists unread mail")
        async with s.lock:
            mail: list[Mail] = await self._run(Replica.mail, cfg.binding.role, cfg.binding.instance,
                                               limit=PAGE, pending_only=False)
            wanted = [m for m in mail if framing.allowed(m.sender, cfg.senders)]
            chosen = wanted[:limit]
            await self._push(s, chosen)
        return ReplayOut(pushed=len(chosen), more=len(wanted) > len(chosen))


# -- the replay tool ------------------------------------------------------------------------------


class ReplayArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False, hide_input_in_errors=True)

    limit: int = Field(BURST, ge=1, le=100, description="Most messages to push again (oldest unread first).")


class ReplayOut(BaseModel):
    pushed: int = Field(description="How many unread messages were pushed to this session again.")
    more: bool = Field(description="True if more unread messages wait beyond limit (check_messages lists them).")


def replay_tool(hub: PushHub) -> ToolSpec[ReplayArgs, ReplayOut]:
    async def handler(_call: Call, args: ReplayArgs) -> ReplayOut:
        s = CURRENT.get()
        if s is None:
            raise InvalidArgument("this session gets no pushes; check_messages lists unread mail")
        return await hub.replay(s, args.limit)

    return ToolSpec("replay_unread", "Push your unread messages to this session again as channel events "
                    "(after a context reset); nothing is marked read.", ReplayArgs, ReplayOut, handler,
                    ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
