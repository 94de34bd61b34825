"""The tools: argument checks and one call into the replica API each; the VantagePeers tools are
here, the AgentMsgs ones in ``mcp_server.threadtools``, the views in ``mcp_server.views``.

Invariants:
* A handler validates everything it can before it writes; a bad call raises
  ``InvalidArgument`` or ``NotFound`` (replica's error hierarchy) and leaves the
  replica unchanged.
* Replica calls never wait on the event loop: each handler hands one small synchronous function
  to ``Call.run``, which runs a ``QUICK`` tool's on the loop unless the replica is busy, and
  every other on a worker thread.
* Session binding fills in the caller's role and instance; explicit arguments
  win (``mcp_server.calls``). The bound instance applies only to the bound role.
* Results use VantagePeers' names and forms (``messageId``, ``from``, ``createdAt`` in Unix
  ms...): messages, receipts and profiles come from ``replica.service`` in ``replica.wire``'s
  vocabulary, the same for every door; the results of the hot tools are plain ``Wire`` dicts,
  already in the output model's wire form (a model would only be dumped again).
* ``since`` is read by ``replica.stamps.parse_since`` against this replica's
  newest position and this machine's clock: a cursor or an arrival time, or
  ``invalid_argument``; never an empty inbox by mistake.
* ``wait`` blocks through the ``Waiter`` (the process's change feed, no
  polling), capped at ``MAX_WAIT_SECONDS``; the change mark is taken before
  each look.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mcp.types import ToolAnnotations
from pydantic import BaseModel

from mcp_server import schemas as s
from mcp_server.acktools import ACK_TOOLS
from mcp_server.calls import (
    Call,
    Env,
    FleetIdProvider,
    SessionBinding,
    ToolSpec,
    Wire,
    instance_of,
    role_of,
    wait_for_data,
)
from mcp_server.leasetools import LEASE_TOOLS
from mcp_server.threadtools import (
    append,
    create_agent,
    create_thread,
    delete_account,
    has_unread,
    join_thread,
    leave_thread,
    mark_read,
    poll,
    thread_info,
    thread_status,
)
from mcp_server.views import (
    decode_cursor,
    encode_cursor,
    merge_peers,
    peers_page,
    profile_result,
)
from replica import Profile, Replica
from replica.api import now_ms
from replica.service import Service
from replica.stamps import ms_of_iso
from replica.wire import message_view, ms

__all__ = ["TOOLS", "Call", "Env", "FleetIdProvider", "SessionBinding", "ToolSpec", "Wire", "merge_peers"]

INBOX_BYTES = 40_000  # VantagePeers' byte budget of one check_messages page (at least one message)


async def send_message(call: Call, a: s.SendMessageArgs) -> Wire:
    sender = role_of(a.sender, call.bind, "from")
    from_inst = instance_of(a.from_instance_id, sender, call.bind)
    def send(svc: Service) -> Wire:
        return svc.send(sender, a.channel, a.content, instance=a.instance_id, from_instance=from_inst,
                        session_day=a.session_day, tenant=a.tenant_id, ack_required=a.ack_required).wire()

    return await call.serve(send)


async def check_messages(call: Call, a: s.CheckMessagesArgs) -> Wire:
    role = role_of(a.recipient, call.bind, "recipient")
    inst = instance_of(a.recipient_instance_id, role, call.bind)

    first: list[object] = []  # the first look's warning: a role never seen is known once it has looked

    def read(svc: Service) -> Wire:
        out = svc.inbox(role, inst, a.since, a.limit, max_bytes=INBOX_BYTES, tenant=a.tenant_id, now_ms=now_ms())
        first.extend([out["warning"]] if out["warning"] and not first else [])
        return {**out, "warning": first[0]} if first else out

    async def look() -> Wire:
        return await call.serve(read)

    return await wait_for_data(call, look, lambda out: bool(out["messages"]), a.wait)


async def mark_as_read(call: Call, a: s.MarkAsReadArgs) -> Wire:
    return (await call.serve(Service.mark, a.receipt_ids, a.caller_orchestrator)).wire()


async def message_status(call: Call, a: s.MessageStatusArgs) -> Wire:
    return await call.serve(Service.status, a.message_id)


def _broadcast_status(r: Replica, mid: str, limit: int) -> s.BroadcastStatusOut:
    m = r.get_message(mid)
    receipts = [
        s.BroadcastReceiptOut(recipient=x.role, recipient_instance_id=x.instance, read=x.read_at is not None,
                              read_at=ms(x.read_at), delivered_at=ms(x.delivered_at), receipt_id=x.receipt_id,
                              acknowledged_at=ms(x.acked_at))
        for x in r.message_status(mid)
    ]
    return s.BroadcastStatusOut(message_id=m.id, sender=m.sender, channel=m.channel, created_at=ms_of_iso(m.created),
                                receipts=receipts[:limit], truncated=len(receipts) > limit,
                                retracted=m.retracted is not None)


async def list_broadcast_status(call: Call, a: s.BroadcastStatusArgs) -> s.BroadcastStatusOut:
    return await call.run(_broadcast_status, a.message_id, a.limit)


async def get_message(call: Call, a: s.MessageIdArgs) -> Wire:
    return await call.serve(Service.message, a.message_id)


def _list_messages(r: Replica, a: s.ListMessagesArgs) -> Wire:
    page = r.list_messages(session_day=a.session_day, from_=a.sender, tenant_id=a.tenant_id,
                           before=decode_cursor(a.cursor, "before"), limit=a.limit)
    return {"items": [message_view(m) for m in page.messages],
            "nextCursor": None if page.before is None else encode_cursor({"before": page.before})}


async def list_messages(call: Call, a: s.ListMessagesArgs) -> Wire:
    return await call.run(_list_messages, a)


async def delete_message(call: Call, a: s.DeleteMessageArgs) -> Wire:
    caller = role_of(a.caller_orchestrator, call.bind, "callerOrchestrator")
    return await call.serve(Service.retract, a.message_id, caller)


async def search_messages(call: Call, a: s.SearchMessagesArgs) -> Wire:
    def search(svc: Service) -> Wire:
        return svc.search(a.query, from_=a.sender, channel=a.channel, since=a.since, limit=a.limit)

    return await call.serve(search)


def _keyword_search(r: Replica, a: s.KeywordSearchArgs) -> Wire:
    hits = r.search_messages(a.query, from_=a.sender, exact_channel=a.channel, session_day=a.session_day,
                             tenant_id=a.tenant_id, limit=a.limit, prefix=True)
    return {"query": a.query, "items": [message_view(r.get_message(h.id)) for h in hits if h.thread is None]}


async def search_messages_by_keyword(call: Call, a: s.KeywordSearchArgs) -> Wire:
    return await call.run(_keyword_search, a)


# -- profiles and peers -----------------------------------------------------------------------


def _list_peers(r: Replica, a: s.ListPeersArgs) -> Wire:
    peers = merge_peers(r.list_profiles(), r.recent_senders(), now_ms())
    return peers_page(peers, decode_cursor(a.cursor, "after"), a.limit)


async def list_peers(call: Call, a: s.ListPeersArgs) -> Wire:
    return await call.run(_list_peers, a)


def _object(value: BaseModel | str | None) -> object:
    """A static/dynamic argument as the replica takes it: the keys given (aliases), or a text."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_unset=True)
    return value


async def update_profile(call: Call, a: s.UpdateProfileArgs) -> s.ProfileResult:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")

    def update(r: Replica) -> Profile:
        return r.update_profile(oid, a.name, _object(a.static), _object(a.dynamic), instance_id=a.instance_id)

    return profile_result(oid, await call.run(update))


async def get_profile(call: Call, a: s.GetProfileArgs) -> Wire | None:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")
    return await call.serve(Service.profile, oid, a.instance_id)


async def set_summary(call: Call, a: s.SetSummaryArgs) -> s.SummaryOut:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")
    inst = instance_of(a.instance_id, oid, call.bind)
    p = await call.run(Replica.set_summary, oid, a.summary, inst, a.end_of_day_index)
    return s.SummaryOut(orchestrator_id=oid, instance_id=inst, summary=a.summary, profile_id=p.profile_id)


async def whoami(call: Call, _a: s.NoArgs) -> s.WhoamiOut:
    replica = call.env.replica()
    fleet = call.env.fleet_id() if call.env.fleet_id is not None else None
    return s.WhoamiOut(node_id=replica.node_id, fleet_id=fleet, role=call.bind.role, instance_id=call.bind.instance)


# -- agents and threads ----------------------------------------------------------------------


# -- the registry ------------------------------------------------------------------------------

_READ = ToolAnnotations(read_only_hint=True)
_ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False)
_SET = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
_DROP = ToolAnnotations(read_only_hint=False, destructive_hint=True)

_TABLE: tuple[ToolSpec[Any, Any], ...] = (
    ToolSpec("send_message", "Send a message to a role, a comma-separated list of roles, an instance, or "
             "'broadcast'; returns its messageId.", s.SendMessageArgs, s.SentOut, send_message, _ADD),
    ToolSpec("check_messages", "Fetch your unread messages (oldest first) with their receipt ids; set wait "
             "to block until one arrives. Thread messages: poll.", s.CheckMessagesArgs, s.InboxOut, check_messages,
             _ADD),
    ToolSpec("mark_as_read", "Mark messages read by the receiptIds check_messages gave you (not messageIds), "
             "so they are not returned again. Threads: mark_read.", s.MarkAsReadArgs, s.MarkedOut, mark_as_read,
             _SET),
    ToolSpec("delete_message", "Retract a message you sent: every node drops its content and it leaves "
             "every inbox and search.", s.DeleteMessageArgs, s.RetractedOut, delete_message, _DROP),
    ToolSpec("get_message", "Fetch one message by its messageId, with channel, sender, sessionDay and tenant.",
             s.MessageIdArgs, s.MessageOut, get_message, _READ),
    ToolSpec("list_messages", "List messages newest first, read or not, filtered by sessionDay, sender or "
             "tenant; page with cursor.", s.ListMessagesArgs, s.MessagePageOut, list_messages, _READ),
    ToolSpec("list_broadcast_status", "Show each recipient's read state for a message (broadcast or not).",
             s.BroadcastStatusArgs, s.BroadcastStatusOut, list_broadcast_status, _READ),
    ToolSpec("search_messages_by_keyword", "Keyword search of channel messages (VantagePeers'; words as "
             "prefixes), best first; filter by sender, exact channel, sessionDay, tenant.", s.KeywordSearchArgs,
             s.KeywordOut, search_messages_by_keyword, _READ),
    ToolSpec("set_summary", "Say what you are working on now (your profile's currentTask, and lastSeen); "
             "shown by list_peers.", s.SetSummaryArgs, s.SummaryOut, set_summary, _SET),
    ToolSpec("list_peers", "List the roles and instances this node knows, with role, current task, last seen "
             "and whether they look reachable.", s.ListPeersArgs, s.PeersOut, list_peers, _READ),
    ToolSpec("update_profile", "Create or update a profile: name, static {role, workspace, capabilities}, "
             "dynamic {currentTask, ...}; merged key by key.", s.UpdateProfileArgs, s.ProfileResult,
             update_profile, _SET),
    ToolSpec("get_profile", "Read a role's profile: {orchestratorId, name, static {role, workspace, "
             "capabilities}, dynamic {currentTask, lastSeen, sessionCount}}; null if it has none.",
             s.GetProfileArgs, None, get_profile, _READ),
    ToolSpec("message_status", "Show, for each recipient of a message, whether it is pending, delivered "
             "or read.", s.MessageStatusArgs, s.StatusOut, message_status, _READ),
    ToolSpec("search_messages", "Full-text search of every message held here, threads too (all words "
             "must match), best first; for channel messages by day or tenant: search_messages_by_keyword.",
             s.SearchMessagesArgs, s.SearchOut, search_messages, _READ),
    ToolSpec("whoami", "Show this node's id, its fleet id and the role and instance this session is "
             "bound to.", s.NoArgs, s.WhoamiOut, whoami, _READ),
    ToolSpec("create_agent", "Get or create a named agent for threads; returns its agent_id.",
             s.CreateAgentArgs, s.AgentOut, create_agent, _SET),
    ToolSpec("delete_account", "Delete an agent by its agent_id; it can no longer join threads.",
             s.DeleteAccountArgs, s.DeletedOut, delete_account, _DROP),
    ToolSpec("create_thread", "Start a thread between two or more registered agents, given by name; "
             "returns its thread_id.", s.CreateThreadArgs, s.ThreadOut, create_thread, _ADD),
    ToolSpec("join_thread", "Add a registered agent, by name, to a thread.",
             s.ThreadAgentArgs, s.ThreadOut, join_thread, _SET),
    ToolSpec("leave_thread", "Remove an agent, by name, from a thread.",
             s.ThreadAgentArgs, s.ThreadOut, leave_thread, _DROP),
    ToolSpec("thread_info", "Show a thread's participants, message count, latest activity and latest message.",
             s.ThreadArgs, s.ThreadInfoOut, thread_info, _READ),
    ToolSpec("thread_status", "Show an agent's read position and unread counts in a thread.",
             s.ThreadAgentArgs, s.ThreadStatusOut, thread_status, _READ),
    ToolSpec("append", "Post a message to a thread as one of its participants; returns its seq.",
             s.AppendArgs, s.AppendOut, append, _ADD),
    ToolSpec("poll", "Read a thread's messages after a seq, oldest first; set wait to block until a new "
             "one arrives. Channel mail: check_messages.", s.PollArgs, s.PollOut, poll, _READ),
    ToolSpec("has_unread", "Tell whether a thread holds messages from others that the agent has not read.",
             s.ThreadAgentArgs, s.HasUnreadOut, has_unread, _READ),
    ToolSpec("mark_read", "Mark an agent's thread messages up to seq as read (channel mail: mark_as_read).",
             s.MarkReadArgs, s.MarkReadOut, mark_read, _SET),
    *LEASE_TOOLS,
    *ACK_TOOLS,
)

# The hot calls, each a few short statements on the replica: tried on the event loop first, and
# handed to a worker thread only when the replica is busy (``mcp_server.calls``). Searches, lists
# and everything else always run on a worker thread.
QUICK = frozenset({"send_message", "check_messages", "mark_as_read", "message_status", "get_message", "get_profile",
                   "list_peers", "set_summary", "whoami", "append", "poll", "has_unread", "mark_read", "thread_status"})
TOOLS: tuple[ToolSpec[Any, Any], ...] = tuple(replace(t, quick=t.name in QUICK) for t in _TABLE)
