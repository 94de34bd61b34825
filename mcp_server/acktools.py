"""Acknowledgements under mcp_agent_mail's names: ``acknowledge_message`` (its arguments and result
shape) and ``overdue_acks``, its ack-overdue view as a tool.

Invariants: ``agent_name`` is a role (the session's bound role when omitted) and ``project_key`` is
accepted and unused (a message belongs to the fleet, not to a project); each handler makes one call
into the replica (``replica.acks``), which leaves the replica unchanged on a bad call.
"""

from __future__ import annotations

from typing import Any

from mcp.types import ToolAnnotations
from pydantic import Field, model_validator

from mcp_server.calls import Call, ToolSpec, instance_of, role_of
from mcp_server.results import Snake
from mcp_server.schemas import Args
from replica import Replica
from replica.acks import MAX_OVERDUE, AckResult, OverdueAck

_UNUSED = "Accepted for mcp_agent_mail clients; unused."


class AcknowledgeArgs(Args):
    message_id: str = Field(description="The message to acknowledge (messageId is accepted too).")
    agent_name: str | None = Field(None, description="Your role. Required unless this session is bound to a role.")
    project_key: str | None = Field(None, description=_UNUSED)
    registration_token: str | None = Field(None, description=_UNUSED)
    format: str | None = Field(None, description=_UNUSED)

    @model_validator(mode="before")
    @classmethod
    def _vantagepeers_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "messageId" in data and "message_id" not in data:
            data = {("message_id" if k == "messageId" else k): v for k, v in data.items()}
        return data


class OverdueArgs(Args):
    ttl_seconds: int = Field(3600, ge=0, le=365 * 86400,
                             description="How long an acknowledgement may take before it is overdue.")
    sender: str | None = Field(None, description="Only messages this role sent (default: every sender).")
    limit: int = Field(100, ge=1, le=MAX_OVERDUE)


class AcknowledgeOut(Snake):
    message_id: str
    acknowledged: bool
    acknowledged_at: str | None
    read_at: str | None


class OverdueOut(Snake):
    ttl_seconds: int
    count: int
    messages: list[dict[str, Any]] = Field(description="Oldest first: {message_id, from, channel, created_ts, "
                                                        "age_seconds, waiting_for: [{role, instance_id, state}]}.")


async def acknowledge_message(call: Call, a: AcknowledgeArgs) -> AcknowledgeOut:
    role = role_of(a.agent_name, call.bind, "agent_name")
    inst = instance_of(None, role, call.bind)
    done: AckResult = await call.run(Replica.acknowledge, a.message_id, role, inst)
    return AcknowledgeOut(message_id=done.message_id, acknowledged=done.acknowledged,
                          acknowledged_at=done.acknowledged_at, read_at=done.read_at)


def overdue_out(found: list[OverdueAck], ttl: int) -> OverdueOut:
    return OverdueOut(ttl_seconds=ttl, count=len(found), messages=[
        {"message_id": o.message_id, "from": o.sender, "channel": o.channel, "created_ts": o.created,
         "age_seconds": o.age_seconds,
         "waiting_for": [{"role": w.role, "instance_id": w.instance, "state": w.state} for w in o.waiting_for]}
        for o in found])


async def overdue_acks(call: Call, a: OverdueArgs) -> OverdueOut:
    def look(r: Replica) -> list[OverdueAck]:
        return r.overdue_acks(a.ttl_seconds, sender=a.sender, limit=a.limit)

    return overdue_out(await call.run(look), a.ttl_seconds)


ACK_TOOLS: tuple[ToolSpec[Any, Any], ...] = (
    ToolSpec("acknowledge_message", "Acknowledge a message addressed to you (it asked with ack_required); "
             "also marks it read.", AcknowledgeArgs, AcknowledgeOut, acknowledge_message,
             ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)),
    ToolSpec("overdue_acks", "List messages that asked for an acknowledgement longer than ttl_seconds ago and "
             "the recipients that have not acknowledged.", OverdueArgs, OverdueOut, overdue_acks,
             ToolAnnotations(read_only_hint=True)),
)
