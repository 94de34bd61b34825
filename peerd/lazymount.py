"""An ASGI app built on its first request: how the local server mounts MCP without loading it at start.

Invariants:
* The builder runs once, in a worker thread (it may import slow modules);
  requests that arrive during the build wait for that one build, and the
  event loop keeps serving everything else meanwhile.
* The built app's ASGI lifespan runs in a task of its own from just after
  the build until ``close`` (as an ASGI server runs it), so a lifespan that
  holds a task group (the MCP session manager) sees one host task.
* A failed build answers 503 with the local port's JSON error and is retried
  by the next request; after ``close`` nothing is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_server.localguard import send_error
from replica.errors import Closing

log = logging.getLogger("peerd.local")

McpBuilder = Callable[[], ASGIApp]
"""Builds the mounted app; runs in a worker thread, so it may import the MCP SDK."""


class Lifespan:
    """Runs an ASGI app's lifespan protocol in a task of its own, as an ASGI server does."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._to_app: asyncio.Queue[Message] = asyncio.Queue()
        self._from_app: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        try:
            await self._step("startup")
        except BaseException:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            raise

    async def stop(self) -> None:
        if self._task is None:
            return
        try:
            await self._step("shutdown")
        finally:
            with contextlib.suppress(Exception):
                await self._task

    async def _run(self) -> None:
        scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._to_app.get, self._from_app.put)
        finally:
            self._from_app.put_nowait({"type": "lifespan.ended"})

    async def _step(self, phase: str) -> None:
        await self._to_app.put({"type": f"lifespan.{phase}"})
        reply = await self._from_app.get()
        if reply["type"] != f"lifespan.{phase}.complete":
            raise RuntimeError(f"lifespan {phase} failed: {reply.get('message') or reply['type']}")


class MountClosed(Closing):
    """The server is shutting down: nothing more gets built."""


class LazyMount:
    """An ASGI app built on its first request, off the event loop; its lifespan runs until ``close``."""

    def __init__(self, build: McpBuilder, what: str = "MCP") -> None:
        self._build = build
        self._what = what
        self._lock = asyncio.Lock()
        self._app: ASGIApp | None = None
        self._lifespan: Lifespan | None = None
        self._closed = False
        self._failed = False
        self.builds = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            app = await self.ready()
        except MountClosed:
            await send_error(send, 503, "shutting down")
            return
        except Exception as exc:  # the environment (no SDK?) or our bug, not the request's fault
            if not self._failed:  # one traceback, not one per request
                log.exception("cannot start %s", self._what)
            self._failed = True
            await send_error(send, 503, f"{self._what} is unavailable: {exc}")
            return
        await app(scope, receive, send)

    async def ready(self) -> ASGIApp:
        """The app, built and started by the first caller; the others wait for that one build."""
        if self._app is not None:
            return self._app
        async with self._lock:
            if self._closed:
                raise MountClosed
            if self._app is None:
                self.builds += 1
                app = await asyncio.to_thread(self._build)
                lifespan = Lifespan(app)
                await lifespan.start()
                self._lifespan, self._app = lifespan, app
            return self._app

    async def close(self) -> None:
        """Stop the app's lifespan (if it was ever built); no build starts afterwards."""
        self._closed = True
        async with self._lock:
            lifespan, self._lifespan = self._lifespan, None
            if lifespan is not None:
                await lifespan.stop()
