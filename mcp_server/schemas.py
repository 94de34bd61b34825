"""Argument and result models of the MCP tools, and their published JSON schemas.

Invariants:
* Argument names on the wire are exactly the names agents already use
  (``from``, ``instanceId``, ``receiptIds``, ``thread_id``...): pydantic aliases
  carry them, and only the aliases are accepted.
* Unknown arguments are refused (``extra="forbid"``), so a misspelt optional
  argument is an error rather than silently ignored.
* Published input schemas are plain and portable: no titles, optional
  arguments are simply not required (never ``null`` unions).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from replica.api import DEFAULT_LIMIT, MAX_LIMIT
from replica.checks import MAX_SEQ

MAX_WAIT_SECONDS = 300.0

_ROLE = "Required unless this session is bound to a role."
_WAIT = f"Seconds to block until something arrives when nothing is there yet (0-{MAX_WAIT_SECONDS:g})."


class Args(BaseModel):
    """Base of argument models: aliases only, no extras, JSON-string lists accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, hide_input_in_errors=True)


def _json_list(value: object) -> object:
    """Some clients send arrays as JSON text; accept ``'["a","b"]'`` as well as ``["a","b"]``."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


NameList = Annotated[list[str], BeforeValidator(_json_list)]


# -- messaging -------------------------------------------------------------------------


class SendMessageArgs(Args):
    sender: str | None = Field(None, alias="from", description=f"Your role name. {_ROLE}")
    channel: str = Field(description="A role, a comma-separated list of roles, or 'broadcast'.")
    content: str = Field(description="The message text.")
    instance_id: str | None = Field(
        None, alias="instanceId", description="Deliver only to this instance of the target role(s)."
    )
    from_instance_id: str | None = Field(
        None, alias="fromInstanceId", description="Your instance id; defaults to the session's bound instance."
    )


class CheckMessagesArgs(Args):
    recipient: str | None = Field(None, description=f"Your role name. {_ROLE}")
    recipient_instance_id: str | None = Field(
        None, alias="recipientInstanceId", description="Your instance id; defaults to the session's bound instance."
    )
    since: int | None = Field(
        None, ge=0, description="Only messages after this cursor (a 'cursor' or message 'seq' from an earlier call)."
    )
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Most messages to return.")
    wait: float = Field(0.0, ge=0, description=_WAIT)


class MarkAsReadArgs(Args):
    receipt_ids: NameList = Field(
        alias="receiptIds", min_length=1, max_length=MAX_LIMIT, description="Receipt ids from check_messages."
    )


class NoArgs(Args):
    pass


class UpdateProfileArgs(Args):
    orchestrator_id: str | None = Field(
        None, alias="orchestratorId", description=f"The role whose profile to set. {_ROLE}"
    )
    name: str | None = Field(None, description="Display name.")
    static: str | None = Field(None, description="What this agent is and does (rarely changes).")
    dynamic: str | None = Field(None, description="What this agent is doing now.")


class GetProfileArgs(Args):
    orchestrator_id: str | None = Field(
        None, alias="orchestratorId", description=f"The role whose profile to read. {_ROLE}"
    )


class MessageStatusArgs(Args):
    message_id: str = Field(alias="messageId", description="A message id returned by send_message.")


class SearchMessagesArgs(Args):
    query: str = Field(description="Words to look for; every word must match (case-insensitive, no operators).")
    sender: str | None = Field(None, alias="from", description="Only messages from this role.")
    channel: str | None = Field(
        None, description="Only messages addressed to this role (broadcasts and role lists included)."
    )
    since: int | None = Field(None, ge=0, description="Only messages after this cursor (a message 'seq').")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Most messages to return.")


# -- agents and threads ------------------------------------------------------------------


class CreateAgentArgs(Args):
    name: str = Field(description="The agent's name; an existing agent of that name is returned.")


class DeleteAccountArgs(Args):
    agent_id: str = Field(description="The agent id returned by create_agent.")


class CreateThreadArgs(Args):
    participant_names: NameList = Field(
        min_length=2, max_length=MAX_LIMIT, description="Names of at least two existing agents."
    )


class ThreadAgentArgs(Args):
    thread_id: str = Field(description="The thread id.")
    agent_name: str = Field(description="The agent's name.")


class ThreadArgs(Args):
    thread_id: str = Field(description="The thread id.")


class AppendArgs(Args):
    thread_id: str = Field(description="The thread id.")
    sender_name: str = Field(description="Name of the posting agent; it must be a participant.")
    content: str = Field(description="The message text.")


class PollArgs(Args):
    thread_id: str = Field(description="The thread id.")
    after_seq: int = Field(0, ge=0, le=MAX_SEQ,
                           description="Only messages with seq greater than this (0 = from the start).")
    limit: int = Field(MAX_LIMIT, ge=1, le=MAX_LIMIT, description="Most messages to return.")
    wait: float = Field(0.0, ge=0, description=_WAIT)


class MarkReadArgs(Args):
    thread_id: str = Field(description="The thread id.")
    agent_name: str = Field(description="The reading agent's name.")
    seq: int = Field(ge=0, le=MAX_SEQ, description="Mark every thread message with seq up to this one read.")


# -- results -----------------------------------------------------------------------------


class Camel(BaseModel):
    """Result models of the messaging tools: camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True)


class Snake(BaseModel):
    """Result models of the thread tools: snake_case on the wire, like their arguments."""


class SentOut(Camel):
    id: str = Field(description="Message id; pass it to message_status.")
    sender: str = Field(validation_alias="from", serialization_alias="from")
    from_instance_id: str | None
    channel: str
    instance_id: str | None
    recipients: list[str] = Field(description="Roles the message is addressed to ('broadcast' for everyone).")
    created: str
    seq: int
    unknown_recipients: list[str] = Field(
        default_factory=list, description="Addressed roles never seen in the fleet (no profile, never sent, never "
        "checked an inbox): likely a typo. The message is stored all the same and waits for them.")
    known_roles: list[str] | None = Field(
        None, description="When some recipients are unknown: roles this node knows, closest spellings first.")


class InboxItem(Camel):
    id: str
    receipt_id: str = Field(description="Pass to mark_as_read once handled.")
    sender: str
    sender_instance_id: str | None
    channel: str
    target_instance_id: str | None
    content: str
    created: str
    seq: int
    delivered_at: str | None
    read_at: str | None


class InboxOut(Camel):
    recipient: str
    recipient_instance_id: str | None
    messages: list[InboxItem]
    cursor: int = Field(description="Pass as 'since' to skip what this call returned.")


class MarkedOut(Camel):
    marked: int = Field(description="How many receipts became read by this call.")


class PeerOut(Camel):
    id: str
    instance_id: str | None
    name: str | None
    summary: str | None
    last_seen: str | None
    reachable: bool


class PeersOut(Camel):
    peers: list[PeerOut]


class ProfileOut(Camel):
    orchestrator_id: str
    name: str | None
    static: str | None
    dynamic: str | None
    updated: str | None


class RecipientOut(Camel):
    role: str
    instance_id: str | None
    receipt_id: str | None
    state: str = Field(description="pending, delivered or read.")
    delivered_at: str | None
    read_at: str | None


class StatusOut(Camel):
    message_id: str
    recipients: list[RecipientOut]


class SearchHitOut(Camel):
    id: str
    sender: str = Field(description="Sender role (for a thread message, the agent's name).")
    sender_instance_id: str | None
    channel: str | None = Field(description="The channel it was sent to; null for a thread message.")
    thread_id: str | None
    content: str
    created: str
    seq: int = Field(description="Position in this node's arrival order; usable as 'since'.")


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


# -- schema publishing -------------------------------------------------------------------


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The published inputSchema: aliases, no titles, no null unions or null defaults."""
    schema: dict[str, Any] = _tidy(model.model_json_schema(by_alias=True), nullable=False)
    return schema


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The published outputSchema: aliases, no titles; nullable fields stay nullable."""
    schema: dict[str, Any] = _tidy(model.model_json_schema(by_alias=True, mode="serialization"), nullable=True)
    return schema


def _tidy(schema: Any, *, nullable: bool) -> Any:
    if isinstance(schema, list):
        return [_tidy(s, nullable=nullable) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _tidy(v, nullable=nullable) for k, v in schema.items() if k != "title"}
    if "properties" in schema:  # property names are data, not keywords: keep "title" etc.
        out["properties"] = {k: _tidy(v, nullable=nullable) for k, v in schema["properties"].items()}
    any_of = out.get("anyOf")
    if not nullable and isinstance(any_of, list) and {"type": "null"} in any_of:
        rest = [s for s in any_of if s != {"type": "null"}]
        del out["anyOf"]
        out = {**(rest[0] if len(rest) == 1 else {"anyOf": rest}), **out}
    if not nullable and "default" in out and out["default"] is None:
        del out["default"]
    return out
