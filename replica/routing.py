"""Routing rules as pure functions: who sees a message.

Invariants:
* Names match by ``names.name_key`` (NFC, lower case, trimmed): ``"TAU"``
  reaches ``tau``; the channel as written is what is signed and shown.
* ``channel`` is a role, ``broadcast``, or a comma-separated list of roles
  (spaces trimmed, empty entries and entries naming the same role dropped);
  ``broadcast`` anywhere in the list makes the whole message a broadcast.
* A channel entry may also name an instance in VantagePeers' form
  ``<role>-<machine>`` (``"sigma-vps"``): it reaches the reader whose instance
  is that name and whose role begins it (role ``sigma``, instance
  ``sigma-vps``), as if the message targeted that instance.
* A message with a target instance is seen only by that instance of each
  targeted role; without one, by every instance (each its own receipt).
* A broadcast reaches every role, including roles that appear later, if it
  was sent no earlier than the broadcast history (default 7 days) before the
  role was first seen in the fleet (``in_broadcast_history``): a new role
  gets recent broadcasts, not every one ever sent. Older ones stay in the
  log and search.
* The sender's own (role, instance) never gets its own message back.
* Thread messages are not routed to inboxes; participants read them by ``poll``.
* Pure: the same envelope and reader always give the same answer (no clock, no store),
  so every replica routes a message alike.
"""

from __future__ import annotations

from typing import NamedTuple

from replica.names import name_key

BROADCAST = "broadcast"
BROADCAST_ROUTE = "*"  # the route key every role matches
DAY_MS = 86_400_000
DEFAULT_BROADCAST_HISTORY_MS = 7 * DAY_MS


def parse_channel(channel: str) -> tuple[str, ...]:
    """The roles a channel names, in order, as first written, or ``("broadcast",)``."""
    roles: dict[str, str] = {}
    for part in channel.split(","):
        role = part.strip()
        key = name_key(role)
        if key == BROADCAST:
            return (BROADCAST,)
        if key and key not in roles:
            roles[key] = role
    return tuple(roles.values())


def channel_key(channel: str) -> str:
    """The channel as it is matched: the keys of its roles joined by commas, or ``broadcast``."""
    return ",".join(name_key(r) for r in parse_channel(channel))


def route_keys(channel: str | None, thread: str | None) -> tuple[str, ...]:
    """Index keys under which a message is filed for inbox lookups."""
    if thread is not None or channel is None:
        return ()
    roles = parse_channel(channel)
    return (BROADCAST_ROUTE,) if roles == (BROADCAST,) else tuple(name_key(r) for r in roles)


def instance_key(instance: str | None) -> str:
    """Receipts are keyed per instance; no instance is the empty key."""
    return name_key(instance) if instance else ""


def instance_address(role: str, instance: str | None) -> str | None:
    """The channel entry that names this reader's instance (``sigma-vps`` for role ``sigma``), if any."""
    inst = instance_key(instance)
    return inst if inst.startswith(name_key(role) + "-") else None


class Envelope(NamedTuple):
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
    address = instance_address(role, instance)
    if name_key(role) not in keys and BROADCAST_ROUTE not in keys and (address is None or address not in keys):
        return False
    if keys == (BROADCAST_ROUTE,) and not in_broadcast_history(msg.created_ms, broadcast_floor_ms):
        return False
    if msg.target_instance is not None and instance_key(msg.target_instance) != instance_key(instance):
        return False
    own = name_key(msg.sender) == name_key(role) and instance_key(msg.sender_instance) == instance_key(instance)
    return not own
