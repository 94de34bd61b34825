"""Routing rules as pure functions: who sees a message.

* ``channel`` is a role, ``broadcast``, or a comma-separated list of roles
  (spaces trimmed, empty entries and duplicates dropped); ``broadcast``
  anywhere in the list makes the whole message a broadcast.
* A message with a target instance is seen only by that instance of each
  targeted role; without one, by every instance (each its own receipt).
* A broadcast reaches every role, including roles that appear later, if it
  was sent no earlier than the broadcast history (default 7 days) before the
  role was first seen in the fleet (``in_broadcast_history``): a new role
  gets recent broadcasts, not every one ever sent. Older ones stay in the
  log and search.
* The sender's own (role, instance) never gets its own message back.
* Thread messages are not routed to inboxes; participants read them by ``poll``.
"""

from __future__ import annotations

from dataclasses import dataclass

BROADCAST = "broadcast"
BROADCAST_ROUTE = "*"  # the route key every role matches
DAY_MS = 86_400_000
DEFAULT_BROADCAST_HISTORY_MS = 7 * DAY_MS


def parse_channel(channel: str) -> tuple[str, ...]:
    """The roles a channel names, in order, or ``("broadcast",)``."""
    roles: list[str] = []
    for part in channel.split(","):
        role = part.strip()
        if role == BROADCAST:
            return (BROADCAST,)
        if role and role not in roles:
            roles.append(role)
    return tuple(roles)


def route_keys(channel: str | None, thread: str | None) -> tuple[str, ...]:
    """Index keys under which a message is filed for inbox lookups."""
    if thread is not None or channel is None:
        return ()
    roles = parse_channel(channel)
    return (BROADCAST_ROUTE,) if roles == (BROADCAST,) else roles


def instance_key(instance: str | None) -> str:
    """Receipts are keyed per instance; no instance is the empty key."""
    return instance or ""


@dataclass(frozen=True)
class Envelope:
    sender: str
    sender_instance: str | None
    channel: str | None
    target_instance: str | None
    thread: str | None = None
    created_ms: int = 0  # the wall time of the message's HLC


def broadcast_floor(first_seen_ms: int, history_ms: int) -> int:
    """The earliest wall time (ms) of a broadcast in the inbox of a role first seen at ``first_seen_ms``."""
    return max(0, first_seen_ms - history_ms)


def in_broadcast_history(created_ms: int, floor_ms: int) -> bool:
    """Whether a broadcast created at ``created_ms`` is recent enough for an inbox with this floor."""
    return created_ms >= floor_ms


def visible_to(msg: Envelope, role: str, instance: str | None, broadcast_floor_ms: int = 0) -> bool:
    """Whether (role, instance) finds ``msg`` in its inbox; broadcasts older than
    ``broadcast_floor_ms`` (see ``broadcast_floor``) are not there."""
    keys = route_keys(msg.channel, msg.thread)
    if role not in keys and BROADCAST_ROUTE not in keys:
        return False
    if keys == (BROADCAST_ROUTE,) and not in_broadcast_history(msg.created_ms, broadcast_floor_ms):
        return False
    if msg.target_instance is not None and msg.target_instance != instance:
        return False
    own = msg.sender == role and instance_key(msg.sender_instance) == instance_key(instance)
    return not own
