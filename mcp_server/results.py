"""Result models of the MCP tools: VantagePeers' result names as it spells them (``messageId``,
``createdAt`` in Unix ms, ``markedAsRead`` ...) for its tools, AgentMsgs' snake_case for the thread
tools, peerd's own extras beside them.

Invariants: a result model names each field once, in the order agents see it; a nullable scalar
stays a nullable scalar (published as ``"type": [T, "null"]``, ``mcp_server.schemas``); the models
hold values only.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# -- results -----------------------------------------------------------------------------


class Camel(BaseModel):
    """Result models of the messaging tools: camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True,
                              defer_build=True)


class Snake(BaseModel):
    """Result models of the thread tools: snake_case on the wire, like their arguments."""

    model_config = ConfigDict(defer_build=True)


class NodeOut(Camel):
    id: str = Field(description="The node's id (its public key, hex).")
    name: str | None = Field(description="The node's name in the fleet's membership; null if unknown here.")


class SentOut(Camel):
    message_id: str = Field(description="Message id; pass it to message_status or get_message.")
    sender: str = Field(validation_alias="from", serialization_alias="from")
    from_instance_id: str | None
    channel: str
    instance_id: str | None
    from_node: NodeOut | None = Field(None, description="The machine that sent it (this node).")
    recipients: list[str] = Field(description="Roles the message is addressed to ('broadcast' for everyone).")
    created_at: int = Field(description="Unix ms.")
    session_day: int
    tenant_id: str | None
    seq: int
    unknown_recipients: list[str] = Field(
        default_factory=list, description="Addressed roles never seen in the fleet (no profile, never sent, never "
        "checked an inbox): likely a typo. The message is stored all the same and waits for them.")
    known_roles: list[str] | None = Field(
        None, description="When some recipients are unknown: roles this node knows, closest spellings first.")
    warning: str | None = Field(None, description="A sentence when some recipients are unknown (also the "
                                "result's second text).")


class InboxItem(Camel):
    message_id: str
    sender: str = Field(validation_alias="from", serialization_alias="from")
    from_instance_id: str | None
    channel: str
    instance_id: str | None = Field(description="The instance it was sent to, if only one.")
    from_node: NodeOut | None = Field(
        None, description="The machine that sent it: the node that signed the message (a role may be pinned to "
        "nodes: peerd role pin).")
    receipt_id: str = Field(description="Pass to mark_as_read once handled.")
    content: str
    created_at: int = Field(description="Unix ms.")
    delivered_at: int | None
    read_at: int | None
    seq: int = Field(description="Position in this node's arrival order.")


class InboxOut(Camel):
    recipient: str
    recipient_instance_id: str | None
    messages: list[InboxItem]
    cursor: int = Field(description="Pass as 'since' to skip what this call returned.")
    truncated: bool = Field(description="More unread messages wait (limit or the page's byte budget).")
    next_since: int | None = Field(description="When truncated: pass as 'since' for the next page.")
    warning: str | None = Field(None, description="When the recipient was never seen in the fleet, or only reading "
                                "(a likely typo): a sentence naming the closest known roles (also a second text).")


class MarkedOut(Camel):
    marked_as_read: int = Field(description="How many receipts became read by this call.")
    marked: int = Field(description="The same count (peerd's older name).")
    unknown: list[str] = Field(description="Receipt ids this node does not know (nothing marked for them).")
    not_yours: list[str] = Field(description="Receipts of other roles than callerOrchestrator (always empty: "
                                 "such a call is refused).")
    warning: str | None = Field(None, description="A sentence naming the ids not marked, and why.")


class MessageOut(Camel):
    message_id: str
    sender: str = Field(validation_alias="from", serialization_alias="from")
    from_instance_id: str | None
    channel: str | None
    instance_id: str | None
    from_node: NodeOut | None = Field(None, description="The machine that sent it (the node that signed it).")
    thread_id: str | None
    content: str | None = Field(description="Null once the message is retracted.")
    created_at: int = Field(description="Unix ms.")
    session_day: int
    tenant_id: str | None
    seq: int
    retracted: bool
    retracted_at: int | None


class MessagePageOut(Camel):
    items: list[MessageOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as 'cursor' for the next page; null on the last page.")


class RetractedOut(Camel):
    deleted: bool
    message_id: str
    receipts_deleted: int = Field(description="Receipts of the message, which no inbox serves any more.")
    retracted_at: int | None


class BroadcastReceiptOut(Camel):
    recipient: str
    recipient_instance_id: str | None
    read: bool
    read_at: int | None
    delivered_at: int | None
    receipt_id: str | None = Field(description="Null for a recipient the message has not reached yet.")
    acknowledged_at: int | None = Field(None, description="When it acknowledged (acknowledge_message), Unix ms.")


class BroadcastStatusOut(Camel):
    message_id: str
    sender: str = Field(validation_alias="from", serialization_alias="from")
    channel: str | None
    created_at: int
    receipts: list[BroadcastReceiptOut]
    truncated: bool
    retracted: bool


class KeywordOut(Camel):
    query: str
    items: list[MessageOut] = Field(description="Best match first.")


class ProfileOut(Camel):
    profile_id: str
    orchestrator_id: str
    instance_id: str | None
    name: str
    static: dict[str, Any] = Field(description="{role, workspace, capabilities, ...}")
    dynamic: dict[str, Any] = Field(description="{currentTask, lastSeen, sessionCount, ...}")
    created_at: int | None
    updated_at: int | None


class ProfileResult(Camel):
    profile_id: str | None
    orchestrator_id: str
    name: str | None
    profile: ProfileOut | None = Field(description="Null when there is no such profile.")


class SummaryOut(Camel):
    orchestrator_id: str
    instance_id: str | None
    summary: str
    profile_id: str


class PeerOut(Camel):
    id: str = Field(description="The role.")
    instance_id: str = Field(description="The instance, or the role itself for a role's own entry.")
    name: str
    role: str = Field(description="static.role of its profile.")
    workspace: str
    current_task: str = Field(description="dynamic.currentTask, or 'idle'.")
    last_seen: str | None = Field(description="ISO-8601: newest of its profile's lastSeen and updates, and its "
                                              "messages.")
    session_count: int | float
    reachable: bool = Field(description="Seen in the last 15 minutes.")
    profile_id: str | None = Field(description="Null for an instance known only from its messages.")


class PeersOut(Camel):
    items: list[PeerOut]
    next_cursor: str | None


class RecipientOut(Camel):
    role: str
    instance_id: str | None
    receipt_id: str | None
    state: str = Field(description="pending, delivered or read.")
    delivered_at: int | None
    read_at: int | None
    acknowledged_at: int | None = Field(None, description="When it acknowledged (acknowledge_message), Unix ms.")


class StatusOut(Camel):
    message_id: str
    retracted: bool
    retracted_at: int | None
    recipients: list[RecipientOut]


class SearchHitOut(Camel):
    message_id: str
    sender: str = Field(validation_alias="from", serialization_alias="from",
                        description="Sender role (for a thread message, the agent's name).")
    from_instance_id: str | None
    channel: str | None = Field(description="The channel it was sent to; null for a thread message.")
    thread_id: str | None
    content: str
    created_at: int
    session_day: int
    seq: int = Field(description="Position in this node's arrival order; usable as 'since'.")
    from_node: NodeOut | None = Field(None, description="The machine that sent it (the node that signed it).")


class SearchOut(Camel):
    query: str
    hits: list[SearchHitOut] = Field(description="Best match first.")


class WhoamiOut(Camel):
    node_id: str
    fleet_id: str | None
    role: str | None
    instance_id: str | None


class AgentOut(Snake):
    agent_id: str
    name: str
    created: bool = Field(description="False when an agent of that name already existed (it is returned).")


class DeletedOut(Snake):
    agent_id: str
    name: str
    deleted: bool


class ThreadOut(Snake):
    thread_id: str
    participants: list[str] = Field(description="Participant names.")
    participant_ids: list[str]


class ThreadInfoOut(Snake):
    thread_id: str
    participants: list[str]
    message_count: int
    latest_activity: str | None
    latest_message: ThreadMessageOut | None


class ThreadStatusOut(Snake):
    thread_id: str
    agent_name: str
    is_participant: bool
    cursor: int = Field(description="Highest seq this agent has read.")
    unread_count: int
    unread_from_others: int
    has_unread: bool
    message_count: int
    latest_activity: str | None


class AppendOut(Snake):
    thread_id: str
    sender_name: str
    seq: int


class ThreadMessageOut(Snake):
    seq: int
    id: str
    sender: str = Field(description="Sender's agent name.")
    sender_id: str
    content: str
    created: str


class PollOut(Snake):
    thread_id: str
    messages: list[ThreadMessageOut]
    cursor: int = Field(description="Pass as after_seq next time.")


class HasUnreadOut(Snake):
    thread_id: str
    agent_name: str
    has_unread: bool


class MarkReadOut(Snake):
    thread_id: str
    agent_name: str
    seq: int
    unread_count: int


