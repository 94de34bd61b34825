"""What every tool handler gets: the session's binding, the host's services, one call's context, a
tool's spec, and the waiting loop that ``wait`` arguments use.

Invariants:
* Session binding fills in the caller's role and instance; explicit arguments win. The bound
  instance applies only to the bound role.
* Replica calls never wait on the event loop. A quick tool's call (``ToolSpec.quick``: short
  reads and writes, the hot ones) is tried on the loop in the replica's ``no_wait`` mode, and
  handed to a worker thread only when it would wait for a lock (another thread or process is
  using the replica; nothing was written); every other call goes to a worker thread.
* ``wait`` blocks through the ``Waiter`` (the process's change feed, no polling), capped at
  ``MAX_WAIT_SECONDS``; the change mark is taken before each look.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from mcp.types import ToolAnnotations
from pydantic import BaseModel

from mcp_server import schemas as s
from replica import (
    InvalidArgument,
    Replica,
)
from replica.errors import WouldWait
from replica.feed import Waiter
from replica.names import same_name
from replica.service import Service

T = TypeVar("T")
Wire = dict[str, Any]  # a result in its output model's wire form (aliases, field order, JSON values)
A = TypeVar("A", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class SessionBinding:
    """The role and instance a session speaks for, when known."""

    role: str | None = None
    instance: str | None = None


FleetIdProvider = Callable[[], "str | None"]


@dataclass(frozen=True)
class Env:
    """What every call of one server shares."""

    replica: Callable[[], Replica]
    waiter: Waiter
    bind: SessionBinding
    fleet_id: FleetIdProvider | None = None
    bugs_told: set[tuple[str, str]] = field(default_factory=set)  # (tool, exception type) logged with a traceback


@dataclass(frozen=True)
class Call:
    """One tool call: the server's environment and this request's binding."""

    env: Env
    bind: SessionBinding
    quick: bool = False  # the tool's ``ToolSpec.quick``

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(replica, *args)``: on the loop without waiting if the call is quick and nothing
        holds the replica, else on a worker thread (see the module's invariants)."""
        replica = self.env.replica()
        if self.quick:
            try:
                with replica.no_wait():
                    return fn(replica, *args)
            except WouldWait:
                pass  # nothing was written: the call runs again where it may wait
        return await asyncio.to_thread(fn, replica, *args)

    async def serve(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(service, *args)`` (a ``replica.service.Service`` method), as ``run`` runs its calls."""
        return await self.run(_served, fn, args)


def _served(replica: Replica, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    return fn(Service(replica), *args)


@dataclass(frozen=True)
class ToolSpec(Generic[A, R]):
    name: str
    description: str
    args: type[A]
    out: type[R] | None  # None: no output schema (a result that may be null, as get_profile's)
    handler: Callable[[Call, A], Awaitable[R | Wire | None]]
    annotations: ToolAnnotations
    quick: bool = False  # short replica work, tried on the event loop first (``Call.run``)


# -- small pure helpers -------------------------------------------------------------------


def role_of(explicit: str | None, bind: SessionBinding, what: str) -> str:
    if explicit is not None:
        return explicit.strip()
    if bind.role:
        return bind.role
    raise InvalidArgument(
        f"'{what}' is required: this session is not bound to a role "
        "(pass it, or bind the session with --role / X-Peerd-Role / ?role=)"
    )


def instance_of(explicit: str | None, role: str, bind: SessionBinding) -> str | None:
    if explicit is not None:
        return explicit
    return bind.instance if bind.role is not None and same_name(role, bind.role) else None


def clean_name(name: str, what: str) -> str:
    clean = name.strip()
    if not clean:
        raise InvalidArgument(f"{what} must be a non-empty string")
    return clean


def capped_wait(seconds: float) -> float:
    return min(seconds, s.MAX_WAIT_SECONDS)


async def wait_for_data(call: Call, look: Callable[[], Awaitable[T]], found: Callable[[T], bool],
                        wait: float) -> T:
    """``look()`` now; if nothing is ``found`` and ``wait`` > 0, look again after each change.
    A wake with no change means the host is closing: the call returns what it has. With no
    ``wait`` it is one look (no change mark, so no second trip to the worker thread)."""
    if wait <= 0:
        return await look()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + capped_wait(wait)
    mark = await call.run(Replica.max_lseq)
    while True:
        result = await look()
        left = deadline - loop.time()
        if found(result) or left <= 0:
            return result
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await call.env.waiter.wait_beyond(mark)
        now = await call.run(Replica.max_lseq)
        if now <= mark:
            return result
        mark = now


# -- replica-side bodies (run on a worker thread) -----------------------------------------
