"""Argument models of the MCP tools (their results are ``mcp_server.results``, re-exported here),
and the published JSON schemas of both.

Invariants:
* Argument names on the wire are exactly the names agents already use
  (``from``, ``instanceId``, ``receiptIds``, ``thread_id``...): pydantic aliases
  carry them, and only the aliases are accepted.
* Unknown arguments are refused (``extra="forbid"``), so a misspelt optional
  argument is an error rather than silently ignored. Every integer argument is
  bounded (at most 2^53 - 1), so none reaches SQLite out of range.
* VantagePeers' argument and result names are used as it spells them
  (``messageId``, ``createdAt`` in Unix ms, ``markedAsRead``...); peerd's own
  extras (``seq``, ``cursor``, ``deliveredAt``, ``reachable``...) come beside them.
* Published input schemas are plain and portable: no titles, optional
  arguments are simply not required (never ``null`` unions).
* Published output schemas are self-contained and quick to check: no ``$ref``
  (definitions are inlined), a nullable scalar, object or list is ``"type": [T, "null"]``
  rather than an ``anyOf``, and the items of a top-level list are described
  shallowly: a list of objects (an inbox, a page, peers) by a description naming
  their fields (docs/mcp.md lists them), a list of strings or numbers (a send's
  ``recipients`` and ``knownRoles``) by a description naming their type. Clients
  validate every result against them (the SDK's client does, with jsonschema,
  one step per item an ``items`` schema would add), so a schema's depth is paid on
  every call; the top-level fields stay typed.
* Every string argument must be valid Unicode (no lone surrogate), so nothing
  an argument carries can fail on its way to SQLite or back out as JSON.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from replica.api import DEFAULT_LIMIT, MAX_LIMIT
from replica.checks import MAX_SEQ
from replica.ops import MAX_CONTENT_BYTES, MAX_SESSION_DAY
from replica.stamps import MAX_SAFE_INT

MAX_WAIT_SECONDS = 300.0
CHECK_LIMIT = 20  # VantagePeers' default page of check_messages
PAGE_LIMIT = 20  # VantagePeers' default page of its lists
MAX_PAGE = 200  # VantagePeers' cap of its lists

_ROLE = "Required unless this session is bound to a role."
_WAIT = f"Seconds to block until something arrives when nothing is there yet (0-{MAX_WAIT_SECONDS:g})."
_TENANT = "A tenant (organisation) slug stored with the message; a fleet is one tenant, so it is only a label."
_FIELDS = "'lite' or 'full' (accepted for VantagePeers clients; results always have every field)."

Fields = Literal["lite", "full"] | None


class Args(BaseModel):
    """Base of argument models: aliases only, no extras, no NaN or infinity, JSON-string lists accepted,
    valid Unicode only."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, hide_input_in_errors=True,
                              allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and not _encodable(text):
                raise ValueError("is not valid Unicode (it holds a lone surrogate)")
        return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    channel: str = Field(description="A role, a comma-separated list of roles, an instance ('tau-laptop'), "
                                     "or 'broadcast'.")
    content: str = Field(description=f"The message text (at most {MAX_CONTENT_BYTES:,} bytes of UTF-8).")
    instance_id: str | None = Field(
        None, alias="instanceId", description="Deliver only to this instance of the target role(s)."
    )
    from_instance_id: str | None = Field(
        None, alias="fromInstanceId", description="Your instance id; defaults to the session's bound instance."
    )
    session_day: int | None = Field(
        None, alias="sessionDay", ge=1, le=MAX_SESSION_DAY,
        description="Project day number (VantagePeers); defaults to the day of sending (day 1 = 2026-03-06 UTC).",
    )
    tenant_id: str | None = Field(None, alias="tenantId", description=_TENANT)
    ack_required: bool = Field(False, description="Ask each recipient to acknowledge it (acknowledge_message); "
                                                  "overdue_acks lists those that have not.")


class CheckMessagesArgs(Args):
    recipient: str | None = Field(None, description=f"Your role name. {_ROLE}")
    recipient_instance_id: str | None = Field(
        None, alias="recipientInstanceId", description="Your instance id; defaults to the session's bound instance."
    )
    since: int | str | None = Field(
        None, description="Only messages that arrived after this: a 'cursor' from an earlier call (below 10^11), "
                          "or a time, as Unix ms (10^11 and up) or ISO-8601.",
    )
    limit: int = Field(CHECK_LIMIT, ge=1, le=MAX_LIMIT, description=f"Most messages to return (default {CHECK_LIMIT}).")
    wait: float = Field(0.0, ge=0, le=MAX_WAIT_SECONDS, description=_WAIT)
    tenant_id: str | None = Field(None, alias="tenantId", description="Only messages of this tenant.")


def _receipt_ids(value: object) -> object:
    """A list, JSON text of a list (some clients send that), or one id as a plain string."""
    value = _json_list(value)
    return [value] if isinstance(value, str) else value


ReceiptIds = Annotated[list[str], BeforeValidator(_receipt_ids), WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                   "maxItems": MAX_LIMIT}],
    "description": "Receipt ids from check_messages (receiptId, not messageId): a list, or one id.",
})]


class MarkAsReadArgs(Args):
    receipt_ids: ReceiptIds = Field(
        alias="receiptIds", min_length=1, max_length=MAX_LIMIT,
        description="Receipt ids from check_messages: a list, or one id.",
    )
    caller_orchestrator: str | None = Field(
        None, alias="callerOrchestrator", description="Your role: only receipts addressed to it are marked."
    )


class MessageIdArgs(Args):
    message_id: str = Field(alias="messageId", description="A message id (from send_message or check_messages).")


class DeleteMessageArgs(Args):
    message_id: str = Field(alias="messageId", description="The id of a message you sent.")
    caller_orchestrator: str | None = Field(
        None, alias="callerOrchestrator", description=f"Your role; it must be the message's sender. {_ROLE}"
    )


class ListMessagesArgs(Args):
    session_day: int | None = Field(None, alias="sessionDay", ge=1, le=MAX_SESSION_DAY,
                                    description="Only messages of this project day.")
    sender: str | None = Field(None, alias="from", description="Only messages from this role.")
    tenant_id: str | None = Field(None, alias="tenantId", description="Only messages of this tenant.")
    limit: int = Field(PAGE_LIMIT, ge=1, le=MAX_PAGE, description=f"Most messages (default {PAGE_LIMIT}).")
    cursor: str | None = Field(None, description="'nextCursor' of the previous page.")
    fields: Fields = Field(None, description=_FIELDS)


class BroadcastStatusArgs(Args):
    message_id: str = Field(alias="messageId", description="A message id (any message, not only broadcasts).")
    limit: int = Field(PAGE_LIMIT, ge=1, le=MAX_PAGE, description=f"Most receipts (default {PAGE_LIMIT}).")
    fields: Fields = Field(None, description=_FIELDS)


class KeywordSearchArgs(Args):
    query: str = Field(description="Words to look for; every word must match, the last one also as a prefix.")
    sender: str | None = Field(None, alias="from", description="Only messages from this role.")
    channel: str | None = Field(None, description="Only messages sent on exactly this channel ('sigma', 'broadcast').")
    tenant_id: str | None = Field(None, alias="tenantId", description="Only messages of this tenant.")
    session_day: int | None = Field(None, alias="sessionDay", ge=1, le=MAX_SESSION_DAY,
                                    description="Only messages of this project day.")
    limit: int = Field(PAGE_LIMIT, ge=1, le=MAX_PAGE, description=f"Most messages (default {PAGE_LIMIT}).")
    fields: Fields = Field(None, description=_FIELDS)


class ListPeersArgs(Args):
    limit: int = Field(PAGE_LIMIT, ge=1, le=MAX_PAGE, description=f"Most peers (default {PAGE_LIMIT}).")
    fields: Fields = Field(None, description=_FIELDS)
    cursor: str | None = Field(None, description="'nextCursor' of the previous page.")


class NoArgs(Args):
    pass


class StaticIn(BaseModel):
    """A profile's static identity; other keys are kept as given."""

    model_config = ConfigDict(extra="allow", hide_input_in_errors=True, defer_build=True)
    role: str | None = Field(None, description="What this orchestrator is for.")
    workspace: str | None = Field(None, description="Where it works.")
    capabilities: list[str] | None = Field(None, description="What it can do, e.g. ['etl', 'sql'].")


class DynamicIn(BaseModel):
    """A profile's session state; other keys are kept as given."""

    model_config = ConfigDict(extra="allow", hide_input_in_errors=True, allow_inf_nan=False, defer_build=True)
    current_task: str | None = Field(None, alias="currentTask", description="What it is doing now.")
    last_seen: int | float | None = Field(None, alias="lastSeen", ge=0, le=MAX_SAFE_INT,
                                          description="Unix ms of its last activity.")
    session_count: int | None = Field(None, alias="sessionCount", ge=0, le=MAX_SAFE_INT)
    end_of_day_index: str | None = Field(None, alias="endOfDayIndex")


class UpdateProfileArgs(Args):
    orchestrator_id: str | None = Field(
        None, alias="orchestratorId", description=f"The role whose profile to set. {_ROLE}"
    )
    instance_id: str | None = Field(None, alias="instanceId", description="Set this instance's own profile instead.")
    name: str | None = Field(None, description="Display name.")
    static: StaticIn | str | None = Field(
        None, description="Static identity {role, workspace, capabilities, ...}: merged key by key.")
    dynamic: DynamicIn | str | None = Field(
        None, description="Session state {currentTask, lastSeen, sessionCount, ...}: merged key by key.")


class GetProfileArgs(Args):
    orchestrator_id: str | None = Field(
        None, alias="orchestratorId", description=f"The role whose profile to read. {_ROLE}"
    )
    instance_id: str | None = Field(None, alias="instanceId", description="Read this instance's own profile.")


class SetSummaryArgs(Args):
    orchestrator_id: str | None = Field(None, alias="orchestratorId", description=f"Your role. {_ROLE}")
    instance_id: str | None = Field(
        None, alias="instanceId", description="Your instance; defaults to the session's bound instance."
    )
    summary: str = Field(description="One or two sentences on your current work.")
    end_of_day_index: str | None = Field(None, alias="endOfDayIndex", description="A durable end-of-day index.")


class MessageStatusArgs(Args):
    message_id: str = Field(alias="messageId", description="A message id returned by send_message.")


class SearchMessagesArgs(Args):
    query: str = Field(description="Words to look for; every word must match (case-insensitive, no operators).")
    sender: str | None = Field(None, alias="from", description="Only messages from this role.")
    channel: str | None = Field(
        None, description="Only messages addressed to this role (broadcasts and role lists included)."
    )
    since: int | None = Field(None, ge=0, le=MAX_SAFE_INT,
                              description="Only messages after this cursor (a message 'seq').")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Most messages to return.")


# -- agents and threads ------------------------------------------------------------------


class CreateAgentArgs(Args):
    name: str = Field(description="The agent's name; an existing agent of that name is returned.")


class DeleteAccountArgs(Args):
    agent_id: str = Field(description="The agent id returned by create_agent.")


class CreateThreadArgs(Args):
    participant_names: NameList = Field(
        max_length=MAX_LIMIT, json_schema_extra={"minItems": 2}, description="Names of at least two existing agents."
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
    wait: float = Field(0.0, ge=0, le=MAX_WAIT_SECONDS, description=_WAIT)


class MarkReadArgs(Args):
    thread_id: str = Field(description="The thread id.")
    agent_name: str = Field(description="The reading agent's name.")
    seq: int = Field(ge=0, le=MAX_SEQ, description="Mark every thread message with seq up to this one read.")


from mcp_server.results import (  # noqa: E402 - re-exported: the tools name them as schemas.X
    AgentOut,
    AppendOut,
    BroadcastReceiptOut,
    BroadcastStatusOut,
    Camel,
    DeletedOut,
    HasUnreadOut,
    InboxItem,
    InboxOut,
    KeywordOut,
    MarkedOut,
    MarkReadOut,
    MessageOut,
    MessagePageOut,
    NodeOut,
    PeerOut,
    PeersOut,
    PollOut,
    ProfileOut,
    ProfileResult,
    RecipientOut,
    RetractedOut,
    SearchHitOut,
    SearchOut,
    SentOut,
    Snake,
    StatusOut,
    SummaryOut,
    ThreadInfoOut,
    ThreadMessageOut,
    ThreadOut,
    ThreadStatusOut,
    WhoamiOut,
)

__all__ = [
    "CHECK_LIMIT", "MAX_PAGE", "MAX_WAIT_SECONDS", "PAGE_LIMIT", "AgentOut", "AppendArgs", "AppendOut",
    "Args", "BroadcastReceiptOut", "BroadcastStatusArgs", "BroadcastStatusOut", "Camel", "CheckMessagesArgs",
    "CreateAgentArgs", "CreateThreadArgs", "DeleteAccountArgs", "DeleteMessageArgs", "DeletedOut",
    "DynamicIn", "GetProfileArgs", "HasUnreadOut", "InboxItem", "InboxOut", "KeywordOut", "KeywordSearchArgs",
    "ListMessagesArgs", "ListPeersArgs", "MarkAsReadArgs", "MarkReadArgs", "MarkReadOut", "MarkedOut",
    "MessageIdArgs", "MessageOut", "MessagePageOut", "MessageStatusArgs", "NoArgs", "NodeOut", "PeerOut", "PeersOut",
    "PollArgs", "PollOut", "ProfileOut", "ProfileResult", "RecipientOut", "RetractedOut", "SearchHitOut",
    "SearchMessagesArgs", "SearchOut", "SendMessageArgs", "SentOut", "SetSummaryArgs", "Snake", "StaticIn",
    "StatusOut", "SummaryOut", "ThreadAgentArgs", "ThreadArgs", "ThreadInfoOut", "ThreadMessageOut",
    "ThreadOut", "ThreadStatusOut", "UpdateProfileArgs", "WhoamiOut", "input_schema", "output_schema",
]


# -- schema publishing -------------------------------------------------------------------


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The published inputSchema: aliases, no titles, no null unions or null defaults."""
    schema: dict[str, Any] = _tidy(model.model_json_schema(by_alias=True), nullable=False)
    return schema


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The published outputSchema: aliases, no titles, no ``$ref``; nullable fields stay nullable."""
    raw = _tidy(model.model_json_schema(by_alias=True, mode="serialization"), nullable=True)
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _shallow_lists(_inline(raw, defs))
    return schema


def _shallow_lists(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each top-level list published without an ``items`` schema, its description
    naming the items' fields (objects) or type (strings, numbers) instead: a client that checks
    results against the schema (the SDK's does, on every call) then checks the list's type once
    instead of walking every item."""
    props = {name: _shallow_items(prop) for name, prop in schema.get("properties", {}).items()}
    return {**schema, "properties": props} if props else schema


_SCALARS = {"string": "Strings.", "integer": "Integers.", "number": "Numbers.", "boolean": "Booleans."}


def _items_said(items: dict[str, Any]) -> str | None:
    """What a description says of a list's items in place of their schema; None: keep the schema."""
    if "properties" in items:
        return f"Objects, each with the fields {', '.join(items['properties'])}."
    return _SCALARS.get(items["type"]) if set(items) == {"type"} and isinstance(items["type"], str) else None


def _shallow_items(prop: dict[str, Any]) -> dict[str, Any]:
    items = prop.get("items")
    listed = isinstance(items, dict) and prop.get("type") in ("array", ["array", "null"])
    if (said := _items_said(items) if isinstance(items, dict) and listed else None) is None:
        return prop
    told = prop.get("description")
    rest = {k: v for k, v in prop.items() if k not in ("items", "description")}
    return {"description": f"{told} {said}" if told else said, **rest}


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with every ``$ref`` to ``defs`` replaced by its definition, and each nullable
    scalar, object or list (``anyOf`` of one typed schema and null) written with a type list: the
    same instances pass, at a fraction of a validator's work."""
    if isinstance(schema, list):
        return [_inline(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = defs[schema["$ref"].removeprefix("#/$defs/")]
        return _inline({**target, **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    out = {k: _inline(v, defs) for k, v in schema.items() if k != "properties"}
    if "properties" in schema:
        out["properties"] = {k: _inline(v, defs) for k, v in schema["properties"].items()}
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of:
        other = next(s for s in any_of if s != {"type": "null"})
        if isinstance(other, dict) and set(other) == {"type"} and isinstance(other["type"], str):
            del out["anyOf"]
            out["type"] = [other["type"], "null"]
        elif isinstance(other, dict) and isinstance(other.get("type"), str) and set(other) - {"type"} <= _TYPED_ONLY:
            rest = {k: v for k, v in out.items() if k != "anyOf"}
            out = {**{k: v for k, v in other.items() if k != "type"}, "type": [other["type"], "null"], **rest}
    return out


# Keywords that only constrain instances of their own type (null passes them), so a nullable object
# or list (``anyOf`` of it and null) is the same schema with ``"type": [T, "null"]``.
_TYPED_ONLY = {"properties", "required", "additionalProperties", "items", "minItems", "maxItems"}


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
