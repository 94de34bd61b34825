"""Routing rules as pure functions: who sees a message.

* ``channel`` is a role, ``broadcast``, or a comma-separated list of roles
  (spaces trimmed, empty entries and duplicates dropped); ``broadcast``
  anywhere in the list makes the whole message a broadcast.
* A message with a target instance is seen only by that instance of each
  targeted role; without one, by every instance (each its own receipt).
* A broadcast reaches every role, including roles that appear later.
* The sender's own (role, instance) never gets its own message back.
* Thread messages are not routed to inboxes; participants read them by ``poll``.
"""

from __future__ import annotations

from dataclasses import dataclass

BROADCAST = "broadcast"
BROADCAST_ROUTE = "*"  # the route key every role matches


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


def visible_to(msg: Envelope, role: str, instance: str | None) -> bool:
    """Whether (role, instance) finds ``msg`` in its inbox."""
    keys = route_keys(msg.channel, msg.thread)
    if role not in keys and BROADCAST_ROUTE not in keys:
        return False
    if msg.target_instance is not None and msg.target_instance != instance:
        return False
    own = msg.sender == role and instance_key(msg.sender_instance) == instance_key(instance)
    return not own
