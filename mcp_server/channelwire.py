"""What an MCP session asks to have pushed, and how a push looks on the wire (Claude Code's
``claude/channel``): the part of ``mcp_server.channel`` that is plain values, read from requests.

Invariants:
- A session is pushed to only while its ``PushConfig`` is ``active``: pushes on, and a role
  bound. Over HTTP, ``X-Peerd-Push: off`` (or 0, no, false) turns them off and
  ``X-Peerd-Push-From`` is the allowlist of senders; blank entries are dropped.
- The ``initialize`` and ``server/discover`` results always offer resource subscriptions and
  never promise list changes (peerd's lists are fixed) nor prompts (it has none); they name
  the ``claude/channel`` capability, with the channel instructions, only for a session that
  will be pushed to, on a transport that can carry a push (not a 2026-07-28 HTTP request,
  which has no standing stream), so a client is never promised events it will not get.
- A header is read stripped; a blank one counts as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from mcp.server.context import HandlerResult
from mcp.types import Notification, NotificationParams
from pydantic import Field

from mcp_server import framing
from mcp_server.tools import SessionBinding

CHANNEL_CAPABILITY = "claude/channel"
CHANNEL_METHOD = "notifications/claude/channel"
SESSION_HEADER = "mcp-session-id"
PUSH_FROM_HEADER = "x-peerd-push-from"
PUSH_HEADER = "x-peerd-push"

SessionKey = str | None  # the HTTP session id; None on stdio (one session per process)


@dataclass(frozen=True)
class PushConfig:
    """What one session gets pushed: mail for ``binding`` (if it names a role), from ``senders`` only
    (empty: everyone), unless ``enabled`` is off."""

    binding: SessionBinding = field(default_factory=SessionBinding)
    enabled: bool = True
    senders: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.binding.role)


def split_names(value: str | None) -> frozenset[str]:
    """``"a, b"`` -> {"a", "b"} (empty entries dropped)."""
    return frozenset(p.strip() for p in (value or "").split(",") if p.strip())


def header(request: object, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    value = headers.get(name) if isinstance(headers, Mapping) else None
    return value.strip() or None if isinstance(value, str) else None


def http_config(request: object, binding: SessionBinding) -> PushConfig:
    """An HTTP session's push config: ``X-Peerd-Push: off`` turns pushes off, ``X-Peerd-Push-From``
    (comma-separated roles or agent names) is the allowlist."""
    off = (header(request, PUSH_HEADER) or "").lower() in ("0", "off", "no", "false")
    return PushConfig(binding, enabled=not off, senders=split_names(header(request, PUSH_FROM_HEADER)))


ConfigOf = Callable[[object], PushConfig]
"""A session's push config from its ``initialize`` / ``initialized`` request (None on stdio)."""


# -- the wire -------------------------------------------------------------------------------------


class ChannelParams(NotificationParams):
    content: str
    meta: dict[str, str] = Field(default_factory=dict)


class ChannelNotification(Notification[ChannelParams, Literal["notifications/claude/channel"]]):
    """Claude Code's channel event: ``content`` becomes the body of a ``<channel>`` tag, ``meta`` its attributes."""

    method: Literal["notifications/claude/channel"] = "notifications/claude/channel"
    params: ChannelParams


def decorate_handshake(result: HandlerResult, config: PushConfig, *, channel: bool = True) -> HandlerResult:
    """An ``initialize`` (handshake revisions) or ``server/discover`` (2026-07-28) result with what
    is true of peerd: resource subscriptions on, no list ever changes, no prompts (the SDK would
    offer its empty prompt list), and, for a push session on a transport that carries pushes
    (``channel``), the ``claude/channel`` capability and the channel instructions."""
    if not isinstance(result, dict):
        return result
    caps = result.setdefault("capabilities", {})
    caps.pop("prompts", None)
    for kind in ("tools", "resources"):
        if isinstance(caps.get(kind), dict):
            caps[kind]["listChanged"] = False
    res = caps.get("resources")
    if isinstance(res, dict):
        res["subscribe"] = True
    if channel and config.active and config.binding.role:
        caps.setdefault("experimental", {})[CHANNEL_CAPABILITY] = {}
        result["instructions"] = framing.instructions(config.binding.role, config.binding.instance)
    return result


def session_key(request: object) -> SessionKey:
    return header(request, SESSION_HEADER)
