"""The one vocabulary: replica values as every door shows them (MCP results, the local API,
``peerd ... --json``, the dashboard's API), in VantagePeers' names and forms.

Invariants:
* Pure: values in, JSON-ready dicts out; no replica, no I/O.
* One name per thing, VantagePeers' where it has the field (``messageId``, ``receiptId``,
  ``from``, ``fromInstanceId``, ``instanceId``, ``createdAt``), camelCase elsewhere; times are
  Unix ms (``createdAt``, ``deliveredAt``, ``readAt``, ``retractedAt``, ``updatedAt``).
* A message's view is built in one place (``message_head``): the inbox item, the stored
  message and the log entry each add their own fields to it, so a field every message view
  shows is one line here.
"""

from __future__ import annotations

from typing import Any, Protocol

from replica.models import InboxMessage, LogMessage, MessageRecord, Profile, RecipientStatus, SearchHit
from replica.stamps import ms_of_iso

Wire = dict[str, Any]


class MessageLike(Protocol):
    """What every message value holds (``InboxMessage``, ``MessageRecord``)."""

    @property
    def id(self) -> str: ...
    @property
    def sender(self) -> str: ...
    @property
    def sender_instance(self) -> str | None: ...
    @property
    def channel(self) -> str | None: ...
    @property
    def target_instance(self) -> str | None: ...
    @property
    def created(self) -> str: ...
    @property
    def from_node(self) -> str | None: ...
    @property
    def from_node_name(self) -> str | None: ...


def ms(stamp: str | None) -> int | None:
    """A replica time (ISO-8601, millisecond precision) as Unix ms, as VantagePeers shows times."""
    return None if stamp is None else ms_of_iso(stamp)


def message_head(m: MessageLike) -> Wire:
    """The fields every view of a message starts with (``fromNode``: the machine that signed it)."""
    return {"messageId": m.id, "from": m.sender, "fromInstanceId": m.sender_instance, "channel": m.channel,
            "instanceId": m.target_instance, "fromNode": node_ref(m.from_node, m.from_node_name)}


def node_ref(node: str | None, name: str | None) -> Wire | None:
    """A node as every door shows it: ``{id, name}`` (name null if unknown here); None if not known."""
    return None if node is None else {"id": node, "name": name}


def inbox_item(m: InboxMessage) -> Wire:
    """One unread (or read) message as its reader sees it, with the receipt to mark."""
    return {**message_head(m), "receiptId": m.receipt_id, "content": m.content, "createdAt": ms_of_iso(m.created),
            "deliveredAt": ms(m.delivered_at), "readAt": ms(m.read_at), "seq": m.seq}


def message_view(m: MessageRecord) -> Wire:
    """A message as stored (content null once retracted)."""
    return {**message_head(m), "threadId": m.thread, "content": m.content, "createdAt": ms_of_iso(m.created),
            "sessionDay": m.session_day, "tenantId": m.tenant, "seq": m.seq, "retracted": m.retracted is not None,
            "retractedAt": ms(m.retracted)}


def log_view(m: LogMessage) -> Wire:
    """A message of the log (arrival order); a thread message's ``from`` is its agent's name
    (its agent id in ``senderId``)."""
    return {**message_head(m), "threadId": m.thread, "senderId": m.sender_id, "content": m.content,
            "createdAt": ms_of_iso(m.created), "seq": m.seq}


def hit_view(h: SearchHit, sender: str) -> Wire:
    """A search hit (``sender``: the role, or a thread message's agent name)."""
    return {"messageId": h.id, "from": sender, "fromInstanceId": h.sender_instance, "channel": h.channel,
            "threadId": h.thread, "content": h.content, "createdAt": ms_of_iso(h.created),
            "sessionDay": h.session_day, "seq": h.seq, "fromNode": node_ref(h.from_node, h.from_node_name)}


def sent_view(m: MessageRecord, recipients: tuple[str, ...], unknown: tuple[str, ...],
              known: tuple[str, ...], warning: str | None) -> Wire:
    """What a send answers: the message as stored, whom it is for, and a warning for unknown roles."""
    return {**message_head(m), "recipients": list(recipients), "createdAt": ms_of_iso(m.created),
            "sessionDay": m.session_day, "tenantId": m.tenant, "seq": m.seq, "unknownRecipients": list(unknown),
            "knownRoles": list(known) if unknown else None, "warning": warning}


def recipient_view(x: RecipientStatus) -> Wire:
    """One recipient's delivery state (``message_status``)."""
    return {"role": x.role, "instanceId": x.instance, "receiptId": x.receipt_id, "state": x.state,
            "deliveredAt": ms(x.delivered_at), "readAt": ms(x.read_at), "acknowledgedAt": ms(x.acked_at)}


def status_view(m: MessageRecord, recipients: list[RecipientStatus]) -> Wire:
    return {"messageId": m.id, "retracted": m.retracted is not None, "retractedAt": ms(m.retracted),
            "recipients": [recipient_view(x) for x in recipients]}


def profile_view(p: Profile) -> Wire:
    """A profile with VantagePeers' defaults for what was never written (shown, not stored)."""
    static = {**p.static, **{k: v for k, v in (("role", ""), ("workspace", ""), ("capabilities", []))
                             if k not in p.static}}
    dynamic = {**p.dynamic, **{k: v for k, v in (("lastSeen", ms(p.updated)), ("sessionCount", 0))
                               if k not in p.dynamic}}
    return {"profileId": p.profile_id, "orchestratorId": p.orchestrator_id, "instanceId": p.instance_id,
            "name": p.name if p.name is not None else p.instance_id or p.orchestrator_id,
            "static": static, "dynamic": dynamic, "createdAt": ms(p.created), "updatedAt": ms(p.updated)}
