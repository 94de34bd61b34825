"""Routing rules as pure functions: who sees a message.

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
* A broadcast reaches every role, including roles that appear later.
* The sender's own (role, instance) never gets its own message back.
* Thread messages are not routed to inboxes; participants read them by ``poll``.
"""

from __future__ import annotations

from dataclasses import dataclass

from replica.names import name_key

BROADCAST = "broadcast"
BROADCAST_ROUTE = "*"  # the route key every role matches


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
    address = instance_address(role, instance)
    if name_key(role) not in keys and BROADCAST_ROUTE not in keys and (address is None or address not in keys):
        return False
    if msg.target_instance is not None and instance_key(msg.target_instance) != instance_key(instance):
        return False
    own = name_key(msg.sender) == name_key(role) and instance_key(msg.sender_instance) == instance_key(instance)
    return not own
