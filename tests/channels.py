"""Receiving pushes in tests: Claude Code channel events and resource updates through the SDK client.

The SDK client drops notification methods it does not know, so channel events are observed
through a ``ClientExtension`` binding. Clients connect in the handshake era (``mode="legacy"``),
as Claude Code and Codex do, unless a test asks for another ``mode``. Absence is checked by order, not by waiting: pushes to a session
go out in arrival order, so once a later marker message arrives, anything that would have
come before it has come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.types import CallToolResult, ResourceUpdatedNotification
from pydantic import BaseModel

from tests.waiting import patience

EVENT_WITHIN = 15.0  # generous guard for one push to arrive on a busy machine


class Event(BaseModel):
    content: str
    meta: dict[str, str] = {}


class Pushes(ClientExtension):
    """Collects ``notifications/claude/channel`` events and resource updates of one client."""

    identifier = "io.peerd/test-channel"

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.updates: asyncio.Queue[str] = asyncio.Queue()

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return [NotificationBinding(method="notifications/claude/channel", params_type=Event, handler=self._event)]

    async def _event(self, params: Event) -> None:
        await self.events.put(params)

    async def on_message(self, message: object) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            await self.updates.put(message.params.uri)

    async def next_event(self, within: float = EVENT_WITHIN) -> Event:
        return await asyncio.wait_for(self.events.get(), patience(within))

    async def next_update(self, within: float = EVENT_WITHIN) -> str:
        return await asyncio.wait_for(self.updates.get(), patience(within))

    async def events_until(self, marker: str, within: float = EVENT_WITHIN) -> list[Event]:
        """Every event up to and including the one whose content is ``marker``."""
        out: list[Event] = []
        while not out or out[-1].content != marker:
            out.append(await self.next_event(within))
        return out

    async def updates_until(self, marker: str, within: float = EVENT_WITHIN) -> list[str]:
        out: list[str] = []
        while not out or out[-1] != marker:
            out.append(await self.next_update(within))
        return out


@asynccontextmanager
async def pushed_client(target: Any, *, mode: str = "legacy", **kwargs: Any) -> AsyncIterator[tuple[Client, Pushes]]:
    """An SDK client (handshake era, unless ``mode`` says otherwise) on ``target`` that records what
    is pushed to it."""
    pushes = Pushes()
    async with Client(target, mode=mode, extensions=[pushes], message_handler=pushes.on_message,
                      **kwargs) as client:
        yield client, pushes


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content
