"""Resource updates on ``subscriptions/listen`` streams (the 2026-07-28 revision), from the change feed.

At 2026-07-28 a client opts in to server events with a ``subscriptions/listen`` request whose
response is the stream. The SDK serves that request (``mcp.server.subscriptions.ListenHandler``:
the acknowledgement, the per-stream filter, the subscription id on every frame) and fans events
out through a ``SubscriptionBus``; a server announces a change by publishing a ``ServerEvent`` on
the bus. What the SDK cannot know is *when* a peerd resource changes: that is this module.

Invariants:
* peerd never writes a listen stream itself: it publishes ``ResourceUpdated(uri)`` on the bus
  it gave the server, and the SDK's handler delivers it to every stream that asked for ``uri``.
* The SDK offers no hook that says which URIs are listened to (a bus listener is an opaque
  callable), so ``Listens.middleware`` reads them off each listen request: while its stream is
  open, each of its URIs is *watched*. A URI watched by several streams is watched once (a
  count); its digest is taken before the stream is acknowledged, so every change after the
  acknowledgement is announced.
* One follower task per server, and only while a listen stream is open: it waits on the
  process's change feed (one future; nothing polls) and on each change publishes one
  ``ResourceUpdated`` per watched URI whose text changed since the last look, however many
  streams listen to it (the digests of one change are taken in one trip to a worker thread).
* A listen naming a URI that is not peerd's is ``invalid_argument`` before any acknowledgement,
  as ``resources/subscribe`` is on the handshake revisions.
* When the waiter wakes the follower with no change, the host is closing: every listen stream
  of the server ends gracefully (its final result), so no stream holds a shutdown up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from mcp_server import resources
from replica import PeerdError, Replica
from replica.feed import Waiter

log = logging.getLogger("mcp_server.listen")

LISTEN = "subscriptions/listen"
Run = Callable[..., Awaitable[Any]]
"""Runs ``fn(replica, *args)`` off the loop (``PushHub``'s runner)."""


@dataclass
class Watched:
    ref: resources.Ref
    digest: str  # of the resource's text when last announced (or when first watched)
    streams: int = 0


def listened_uris(params: object) -> list[str]:
    """The resource URIs a listen request's (wire) params ask for, each once, in order."""
    notifications = params.get("notifications") if isinstance(params, dict) else None
    uris = notifications.get("resourceSubscriptions") if isinstance(notifications, dict) else None
    return list(dict.fromkeys(u for u in uris if isinstance(u, str))) if isinstance(uris, list) else []


def digests_of(r: Replica, refs: Iterable[resources.Ref]) -> list[str]:
    """The digest of each resource, in order."""
    return [resources.digest(r, ref) for ref in refs]


class Listens:
    """The listen streams of one MCP server: the bus they hear on, the URIs they watch, their follower."""

    def __init__(self, run: Run, waiter: Waiter) -> None:
        self.bus = InMemorySubscriptionBus()
        self.handler = ListenHandler(self.bus)  # serves subscriptions/listen (``build_server`` registers it)
        self._run = run
        self._waiter = waiter
        self._watched: dict[str, Watched] = {}
        self._streams = 0  # listen requests in progress (their streams open, or about to be)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def watched(self) -> dict[str, int]:
        """Each watched URI and how many open streams listen to it."""
        return {uri: w.streams for uri, w in self._watched.items()}

    async def middleware(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Watches the peerd URIs of each listen request for as long as its stream is open."""
        if ctx.method != LISTEN:
            return await call_next(ctx)
        refs: list[tuple[str, resources.Ref]] = []
        for uri in listened_uris(ctx.params):
            ref = resources.parse_uri(uri)
            if ref is None:
                raise MCPError(code=INVALID_PARAMS, message=f"invalid_argument: not a peerd resource URI: {uri!r} "
                               "(peerd://inbox/ROLE, peerd://inbox/ROLE/INSTANCE or peerd://thread/THREAD_ID)")
            refs.append((uri, ref))
        counted: list[str] = []
        self._streams += 1
        try:
            await self._watch(refs, counted)
            self._kick()
            return await call_next(ctx)
        finally:
            self._streams -= 1
            self._unwatch(counted)

    async def _watch(self, refs: Iterable[tuple[str, resources.Ref]], counted: list[str]) -> None:
        """Count each URI as watched once more (taking its digest if it is new), noting it in ``counted``."""
        for uri, ref in refs:
            if uri not in self._watched:
                try:
                    digest = await self._run(resources.digest, ref)
                except PeerdError as exc:
                    raise MCPError(code=INVALID_PARAMS, message=f"invalid_argument: {exc}") from None
                self._watched.setdefault(uri, Watched(ref, digest))  # another stream may have begun meanwhile
            self._watched[uri].streams += 1
            counted.append(uri)

    def _unwatch(self, uris: Iterable[str]) -> None:
        for uri in uris:
            w = self._watched.get(uri)
            if w is not None:
                w.streams -= 1
                if w.streams <= 0:
                    del self._watched[uri]

    def _kick(self) -> None:
        if self._closed or not self._streams or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._follow(), name="peerd-listen")

    async def _follow(self) -> None:
        """Announce changes of watched URIs on every change of the feed, while a stream is open."""
        seen = -1
        try:
            while self._streams and not self._closed:
                mark = await self._run(Replica.max_lseq)
                if mark == seen:  # woken without a change: the host is closing
                    self.end_streams()
                    return
                seen = mark
                await self._announce()
                await self._waiter.wait_beyond(seen)
        except PeerdError as exc:  # the replica failed: streams stay open, nothing more is announced
            log.warning("stopped announcing resource updates to listen streams: %s", exc)
        except Exception:
            log.exception("stopped announcing resource updates to listen streams")

    async def _announce(self) -> None:
        looked = list(self._watched.items())
        digests: list[str] = await self._run(digests_of, [w.ref for _uri, w in looked])
        for (uri, w), now in zip(looked, digests, strict=True):
            if now != w.digest and self._watched.get(uri) is w:
                w.digest = now
                await self.bus.publish(ResourceUpdated(uri=uri))

    def end_streams(self) -> None:
        """End every open listen stream gracefully (each sends its final result)."""
        self.handler.close()

    async def aclose(self) -> None:
        """Stop the follower and end every listen stream (the server is going away)."""
        self._closed = True
        self.end_streams()
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
