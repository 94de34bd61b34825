"""Plain result types returned by the replica API (frozen dataclasses).

Invariants: values only (no I/O, no reference back to a replica); ``to_dict``
gives JSON-ready dicts whose keys are the field names, in field order, which is
what the local API and ``peerd --json`` print.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class _Dict:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload,no-any-return]


@dataclass(frozen=True)
class SentMessage(_Dict):
    id: str
    seq: int
    created: str
    hlc: int
    recipients: tuple[str, ...]


@dataclass(frozen=True)
class RecipientCheck(_Dict):
    """The roles a message names (or the role that reads) that this replica has never seen (no
    profile, never sent, never checked an inbox) or seen only reading (``unconfirmed``), and, when
    there are any, confirmed roles to suggest (closest spellings first)."""

    unknown_recipients: tuple[str, ...]
    known_roles: tuple[str, ...]
    unconfirmed: tuple[str, ...] = ()  # those of unknown_recipients seen only reading their inbox


@dataclass(frozen=True)
class InboxMessage(_Dict):
    id: str
    receipt_id: str
    sender: str
    sender_instance: str | None
    channel: str
    target_instance: str | None
    content: str
    created: str
    seq: int
    delivered_at: str | None
    read_at: str | None
    from_node: str | None = None  # the sending node: the origin of the message's op (key, hex)
    from_node_name: str | None = None  # its name in the membership, None if unknown here


@dataclass(frozen=True)
class Inbox(_Dict):
    messages: list[InboxMessage]
    cursor: int
    truncated: bool = False  # more unread messages wait beyond this page (limit or byte budget)


@dataclass(frozen=True)
class MarkResult(_Dict):
    """What ``mark_receipts`` did: receipts newly read, ids this replica does not know, and ids
    that belong to another role than the caller's (left unmarked)."""

    marked: int
    unknown: list[str]
    not_yours: list[str]
    message_ids: list[str] = field(default_factory=list)  # unknown ids that are message ids (a common slip)
    owners: dict[str, str] = field(default_factory=dict)  # each of not_yours: the role it is addressed to


@dataclass(frozen=True)
class MessageRecord(_Dict):
    """A message as stored: ``content`` is None once it is retracted (``retracted`` is when)."""

    id: str
    seq: int
    sender: str
    sender_instance: str | None
    channel: str | None
    target_instance: str | None
    thread: str | None
    content: str | None
    created: str
    session_day: int
    tenant: str | None
    retracted: str | None
    from_node: str | None = None  # the sending node (key, hex), as in ``InboxMessage``
    from_node_name: str | None = None


@dataclass(frozen=True)
class MessagePage(_Dict):
    """Messages newest first; pass ``before`` (a seq) to get the next, older page."""

    messages: list[MessageRecord]
    before: int | None


def receipt_state(delivered_at: str | None, read_at: str | None) -> str:
    """A receipt's state as shown to people: pending, delivered or read."""
    if read_at is not None:
        return "read"
    return "delivered" if delivered_at is not None else "pending"


@dataclass(frozen=True)
class RecipientStatus(_Dict):
    role: str
    instance: str | None
    receipt_id: str | None
    delivered_at: str | None
    read_at: str | None
    acked_at: str | None = None  # acknowledged (``replica.acks``)

    @property
    def state(self) -> str:
        return receipt_state(self.delivered_at, self.read_at)


@dataclass(frozen=True)
class LogMessage(_Dict):
    """A message in the log; a thread message's ``sender`` is its agent's name (id in ``sender_id``)."""

    id: str
    seq: int
    sender: str
    sender_id: str
    sender_instance: str | None
    channel: str | None
    target_instance: str | None
    thread: str | None
    content: str
    created: str
    from_node: str | None = None  # the sending node (key, hex), as in ``InboxMessage``
    from_node_name: str | None = None


@dataclass(frozen=True)
class MessageLog(_Dict):
    messages: list[LogMessage]
    cursor: int


@dataclass(frozen=True)
class Profile(_Dict):
    """A role's profile (``instance_id`` None) or one instance's; ``static`` and ``dynamic`` are
    objects merged key by key. ``orchestrator_id`` and ``instance_id`` are spelt as first written."""

    orchestrator_id: str
    name: str | None
    static: dict[str, Any]
    dynamic: dict[str, Any]
    updated: str | None
    instance_id: str | None = None
    created: str | None = None
    profile_id: str = ""


@dataclass(frozen=True)
class Agent(_Dict):
    id: str
    name: str
    alive: bool


@dataclass(frozen=True)
class Thread(_Dict):
    id: str
    participants: list[str]
    created: str | None


@dataclass(frozen=True)
class ThreadMessage(_Dict):
    """A thread message; ``seq`` is its number within the thread (1, 2, 3, ... in arrival order here)."""

    seq: int
    id: str
    sender: str
    content: str
    created: str
    thread_id: str


@dataclass(frozen=True)
class ThreadInfo(_Dict):
    thread_id: str
    participants: list[str]
    message_count: int
    latest_activity: str | None


@dataclass(frozen=True)
class ThreadSummary(_Dict):
    """A thread for an overview: participants by agent name (ids alongside)."""

    thread_id: str
    participants: list[str]
    participant_ids: list[str]
    message_count: int
    latest_activity: str | None


@dataclass(frozen=True)
class ReadState(_Dict):
    cursor: int
    unread_count: int
    unread_from_others: int


@dataclass(frozen=True)
class Page:
    """Ops a peer lacks. ``ranges[origin] = (lo, hi)``: the page holds every op of
    that origin with lo <= seq <= hi. ``more``: the sender holds further ops the
    receiver lacks (ask again with the updated vector)."""

    ops: list[bytes]
    ranges: dict[bytes, tuple[int, int]]
    more: bool

    @property
    def size(self) -> int:
        return sum(len(o) for o in self.ops)


@dataclass(frozen=True)
class ApplyResult(_Dict):
    new: int
    duplicate: int
    new_lseqs: list[int] = field(default_factory=list)
    new_index: list[int] = field(default_factory=list)  # positions in the input of the ops that were new
    refused: int = 0  # ops of a removed node above its cutoff, not stored (replica.membership)


@dataclass(frozen=True)
class SearchHit(_Dict):
    id: str
    seq: int
    sender: str
    sender_instance: str | None
    channel: str | None
    thread: str | None
    content: str
    created: str
    session_day: int = 0
    tenant: str | None = None
    from_node: str | None = None  # the sending node (key, hex), as in ``InboxMessage``
    from_node_name: str | None = None


@dataclass(frozen=True)
class SenderSeen(_Dict):
    role: str
    instance: str | None
    last_seen: str
    last_hlc: int


@dataclass(frozen=True)
class FileCheck(_Dict):
    """What a read-only look at a replica file found (``store.check_file``)."""

    result: str  # SQLite's quick_check: "ok" when sound
    messages: int
    ops: int
    newer_ops: int = 0  # ops held from a newer peerd, waiting for an upgrade to be applied
    pin_refused: int = 0  # ops from peers refused for a role pin (``replica.pinstore``)


@dataclass(frozen=True)
class NodeRef(_Dict):
    """A node of the fleet: its id (the node key, hex) and the name the membership gives it (None
    when this replica knows none)."""

    id: str
    name: str | None


@dataclass(frozen=True)
class RolePin(_Dict):
    """The pin in force for a role (``replica.pins``): ``nodes`` empty once it was lifted."""

    role: str
    nodes: list[NodeRef]
    set_at: str
    set_by: NodeRef
    hlc: int  # the pin op's stamp: messages stamped after it are judged by it


@dataclass(frozen=True)
class RoleSender(_Dict):
    """A node that sent in a role's name: how many of its messages are held here, the newest when."""

    node: NodeRef
    messages: int
    last_sent: str


@dataclass(frozen=True)
class RoleSenders(_Dict):
    """A role, the nodes that have sent in its name (messages held here), and its pin if any."""

    role: str
    senders: list[RoleSender]
    pinned_to: list[NodeRef] | None = None
    status: str | None = None  # "confirmed", "unconfirmed" (seen only reading), None (not seen: pinned only)
    first_seen: str | None = None


@dataclass(frozen=True)
class RoleForgotten(_Dict):
    """A role forgotten (``Replica.forget_role``): it was first seen at ``first_seen``; every read
    sighting up to ``upto`` no longer counts."""

    role: str
    first_seen: str | None
    upto: str | None
