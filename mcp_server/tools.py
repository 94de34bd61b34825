"""The tools: argument checks and one call into the replica API each.

Invariants:
* A handler validates everything it can before it writes; a bad call raises
  ``InvalidArgument`` or ``NotFound`` (replica's error hierarchy) and leaves the
  replica unchanged.
* Replica calls never run on the event loop: each handler hands one small
  synchronous function to ``Call.run`` (a worker thread).
* Session binding fills in the caller's role and instance; explicit arguments
  win. The bound instance applies only to the bound role.
* Results use VantagePeers' names and forms (``messageId``, ``from``,
  ``createdAt`` in Unix ms...); the views from replica values to results are
  pure functions (``message_out``, ``profile_out``, ``merge_peers``...). The results of the
  hot tools (``send_message``, ``check_messages``, ``poll``, ``list_peers``) are built as plain
  ``Wire`` dicts, already in the output model's wire form (names, order, JSON values): a model
  would only be dumped again.
* ``since`` is read by ``replica.stamps.parse_since`` against this replica's
  newest position and this machine's clock: a cursor or an arrival time, or
  ``invalid_argument``; never an empty inbox by mistake.
* ``wait`` blocks through the ``Waiter`` (the process's change feed, no
  polling), capped at ``MAX_WAIT_SECONDS``; the change mark is taken before
  each look.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from mcp.types import ToolAnnotations
from pydantic import BaseModel

from mcp_server import schemas as s
from replica import (
    Agent,
    Inbox,
    InboxMessage,
    InvalidArgument,
    MessageRecord,
    NotFound,
    Profile,
    RecipientCheck,
    Replica,
    SenderSeen,
    SentMessage,
)
from replica.api import now_ms
from replica.feed import Waiter
from replica.names import name_key, same_name
from replica.stamps import iso_ms, ms_of_iso, parse_since

RECENT_MS = 15 * 60 * 1000  # "reachable": seen in the last 15 minutes
INBOX_BYTES = 40_000  # VantagePeers' byte budget of one check_messages page (at least one message)

T = TypeVar("T")
Wire = dict[str, Any]  # a result in its output model's wire form (aliases, field order, JSON values)
A = TypeVar("A", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class SessionBinding:
    """The role and instance a session speaks for, when known."""

    role: str | None = None
    instance: str | None = None


FleetIdProvider = Callable[[], "str | None"]


@dataclass(frozen=True)
class Env:
    """What every call of one server shares."""

    replica: Callable[[], Replica]
    waiter: Waiter
    bind: SessionBinding
    fleet_id: FleetIdProvider | None = None
    bugs_told: set[tuple[str, str]] = field(default_factory=set)  # (tool, exception type) logged with a traceback


@dataclass(frozen=True)
class Call:
    """One tool call: the server's environment and this request's binding."""

    env: Env
    bind: SessionBinding

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(replica, *args)`` on a worker thread."""
        return await asyncio.to_thread(fn, self.env.replica(), *args)


@dataclass(frozen=True)
class ToolSpec(Generic[A, R]):
    name: str
    description: str
    args: type[A]
    out: type[R]
    handler: Callable[[Call, A], Awaitable[R | Wire]]
    annotations: ToolAnnotations


# -- small pure helpers -------------------------------------------------------------------


def role_of(explicit: str | None, bind: SessionBinding, what: str) -> str:
    if explicit is not None:
        return explicit.strip()
    if bind.role:
        return bind.role
    raise InvalidArgument(
        f"'{what}' is required: this session is not bound to a role "
        "(pass it, or bind the session with --role / X-Peerd-Role / ?role=)"
    )


def instance_of(explicit: str | None, role: str, bind: SessionBinding) -> str | None:
    if explicit is not None:
        return explicit
    return bind.instance if bind.role is not None and same_name(role, bind.role) else None


def clean_name(name: str, what: str) -> str:
    clean = name.strip()
    if not clean:
        raise InvalidArgument(f"{what} must be a non-empty string")
    return clean


def capped_wait(seconds: float) -> float:
    return min(seconds, s.MAX_WAIT_SECONDS)


async def wait_for_data(call: Call, look: Callable[[], Awaitable[T]], found: Callable[[T], bool],
                        wait: float) -> T:
    """``look()`` now; if nothing is ``found`` and ``wait`` > 0, look again after each change.
    A wake with no change means the host is closing: the call returns what it has. With no
    ``wait`` it is one look (no change mark, so no second trip to the worker thread)."""
    if wait <= 0:
        return await look()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + capped_wait(wait)
    mark = await call.run(Replica.max_lseq)
    while True:
        result = await look()
        left = deadline - loop.time()
        if found(result) or left <= 0:
            return result
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await call.env.waiter.wait_beyond(mark)
        now = await call.run(Replica.max_lseq)
        if now <= mark:
            return result
        mark = now


# -- replica-side bodies (run on a worker thread) -----------------------------------------


def _known_agent(r: Replica, name: str, what: str, *, alive: bool = True) -> tuple[str, Agent]:
    clean = clean_name(name, what)
    agent = r.find_agent(clean)
    if agent is None or (alive and not agent.alive):
        raise NotFound(f"unknown agent {clean!r} (register it with create_agent)")
    return clean, agent


def _names(r: Replica, ids: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for aid in dict.fromkeys(ids):
        agent = r.get_agent(aid)
        out[aid] = agent.name if agent is not None else aid
    return out


def _thread_out(r: Replica, tid: str) -> s.ThreadOut:
    thread = r.get_thread(tid)
    if thread is None:
        raise NotFound(f"unknown thread {tid!r}")
    names = _names(r, thread.participants)
    return s.ThreadOut(thread_id=tid, participants=[names[a] for a in thread.participants],
                       participant_ids=list(thread.participants))


def _require_thread(r: Replica, tid: str) -> list[str]:
    thread = r.get_thread(tid)
    if thread is None:
        raise NotFound(f"unknown thread {tid!r}")
    return thread.participants


# -- views: replica values as the tools show them (pure) ------------------------------------


def ms(stamp: str | None) -> int | None:
    """A replica time (ISO-8601, millisecond precision) as Unix ms, as VantagePeers shows times."""
    return None if stamp is None else ms_of_iso(stamp)


def encode_cursor(payload: dict[str, Any]) -> str:
    """An opaque page cursor: base64url of JSON, no padding (VantagePeers' form)."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(token: str | None, key: str) -> Any:
    """The ``key`` of a cursor this server returned, or None for no cursor (absent or empty)."""
    if not token:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidArgument("invalid cursor: not a cursor this tool returned") from None
    if not isinstance(payload, dict) or key not in payload:
        raise InvalidArgument("invalid cursor: not a cursor of this tool")
    return payload[key]


def message_out(m: MessageRecord) -> s.MessageOut:
    return s.MessageOut(message_id=m.id, sender=m.sender, from_instance_id=m.sender_instance, channel=m.channel,
                        instance_id=m.target_instance, thread_id=m.thread, content=m.content,
                        created_at=ms_of_iso(m.created), session_day=m.session_day, tenant_id=m.tenant, seq=m.seq,
                        retracted=m.retracted is not None, retracted_at=ms(m.retracted))


def inbox_item(m: InboxMessage) -> Wire:
    """``s.InboxItem`` in wire form."""
    return {"messageId": m.id, "receiptId": m.receipt_id, "from": m.sender, "fromInstanceId": m.sender_instance,
            "channel": m.channel, "instanceId": m.target_instance, "content": m.content,
            "createdAt": ms_of_iso(m.created), "deliveredAt": ms(m.delivered_at), "readAt": ms(m.read_at),
            "seq": m.seq}


def profile_out(p: Profile) -> s.ProfileOut:
    """A profile with VantagePeers' defaults for what was never written (shown, not stored)."""
    static = {**p.static, **{k: v for k, v in (("role", ""), ("workspace", ""), ("capabilities", []))
                             if k not in p.static}}
    dynamic = {**p.dynamic, **{k: v for k, v in (("lastSeen", ms(p.updated)), ("sessionCount", 0))
                               if k not in p.dynamic}}
    return s.ProfileOut(orchestrator_id=p.orchestrator_id, instance_id=p.instance_id,
                        name=p.name if p.name is not None else p.instance_id or p.orchestrator_id,
                        static=static, dynamic=dynamic, created_at=ms(p.created), updated_at=ms(p.updated))


def profile_result(oid: str, p: Profile | None) -> s.ProfileResult:
    if p is None:
        return s.ProfileResult(profile_id=None, orchestrator_id=oid, name=None, profile=None)
    out = profile_out(p)
    return s.ProfileResult(profile_id=p.profile_id, orchestrator_id=p.orchestrator_id, name=out.name, profile=out)


def _number(value: object) -> int | float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _text(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _peer(p: Profile, instance: str | None, seen_ms: int | None, now_ms: int, *, own: bool) -> Wire:
    """One peer entry (``s.PeerOut`` in wire form) built on profile ``p`` (the entry's own, or its
    role's when ``own`` is false), with ``profile_out``'s defaults (lastSeen: its last update)."""
    static, dynamic = p.static, p.dynamic
    shown = dynamic["lastSeen"] if "lastSeen" in dynamic else ms(p.updated)
    last = max((t for t in (seen_ms, _number(shown) or None) if t is not None), default=None)
    name = p.name if p.name is not None else p.instance_id or p.orchestrator_id
    return {"id": p.orchestrator_id, "instanceId": instance or p.orchestrator_id,
            "name": name if own else instance or name, "role": _text(static.get("role")),
            "workspace": _text(static.get("workspace")), "currentTask": _text(dynamic.get("currentTask"), "idle"),
            "lastSeen": None if last is None else iso_ms(int(last)),
            "sessionCount": _number(dynamic.get("sessionCount", 0)),
            "reachable": last is not None and now_ms - last <= RECENT_MS, "profileId": p.profile_id if own else None}


PeerKey = tuple[str, str]


def merge_peers(profiles: Sequence[Profile], senders: Sequence[SenderSeen],
                now_ms: int) -> list[tuple[PeerKey, Wire]]:
    """One entry per profile (a role's, an instance's) and per sender (role, instance) without one,
    by (role, instance) key: what a profile says, and when the newest of its lastSeen, its updates
    and its messages was. A sender without a profile shows its role's profile, if any."""
    by_key = {(name_key(p.orchestrator_id), name_key(p.instance_id or "")): p for p in profiles}
    seen = {(name_key(x.role), name_key(x.instance or "")): x for x in senders}
    peers: dict[PeerKey, Wire] = {}
    for key, p in by_key.items():
        sender = seen.get(key)
        peers[key] = _peer(p, p.instance_id, ms(sender.last_seen) if sender else None, now_ms, own=True)
    for key, x in seen.items():
        if key in peers:
            continue
        base = by_key.get((key[0], ""))
        if base is None:
            peers[key] = {"id": x.role, "instanceId": x.instance or x.role, "name": x.instance or x.role, "role": "",
                          "workspace": "", "currentTask": "idle", "lastSeen": x.last_seen, "sessionCount": 0,
                          "reachable": now_ms - (ms(x.last_seen) or 0) <= RECENT_MS, "profileId": None}
        else:
            peers[key] = _peer(base, x.instance, ms(x.last_seen), now_ms, own=False)
    return [(k, peers[k]) for k in sorted(peers)]


def peers_page(peers: list[tuple[PeerKey, Wire]], after: object, limit: int) -> Wire:
    """The ``limit`` peers after the key ``after`` (a [role, instance] key) of an earlier page."""
    if after is not None and not (isinstance(after, list) and len(after) == 2 and all(isinstance(x, str)
                                                                                         for x in after)):
        raise InvalidArgument("invalid cursor: not a cursor of list_peers")
    start = 0 if after is None else next((i for i, (k, _p) in enumerate(peers) if k > (after[0], after[1])),
                                         len(peers))
    page = peers[start:start + limit]
    more = start + limit < len(peers)
    return {"items": [p for _k, p in page], "nextCursor": encode_cursor({"after": list(page[-1][0])}) if more else None}


# -- messaging -----------------------------------------------------------------------------


def _send_checked(r: Replica, sender: str, a: s.SendMessageArgs,
                  from_inst: str | None) -> tuple[RecipientCheck, SentMessage, MessageRecord]:
    """Which recipients were never seen (asked before the send, which makes the sender known), the
    send, and the message as stored (its session day and tenant)."""
    check = r.recipient_check(a.channel)
    sent = r.send_message(sender, a.channel, a.content, a.instance_id, from_inst, session_day=a.session_day,
                          tenant_id=a.tenant_id)
    return check, sent, r.get_message(sent.id)


async def send_message(call: Call, a: s.SendMessageArgs) -> Wire:
    sender = role_of(a.sender, call.bind, "from")
    from_inst = instance_of(a.from_instance_id, sender, call.bind)
    check, sent, m = await call.run(_send_checked, sender, a, from_inst)
    return {"messageId": sent.id, "from": sender, "channel": a.channel.strip(), "fromInstanceId": from_inst,
            "instanceId": a.instance_id, "recipients": list(sent.recipients), "createdAt": ms_of_iso(sent.created),
            "sessionDay": m.session_day, "tenantId": m.tenant, "seq": sent.seq,
            "unknownRecipients": list(check.unknown_recipients),
            "knownRoles": list(check.known_roles) if check.unknown_recipients else None}


async def check_messages(call: Call, a: s.CheckMessagesArgs) -> Wire:
    role = role_of(a.recipient, call.bind, "recipient")
    inst = instance_of(a.recipient_instance_id, role, call.bind)

    def read(r: Replica) -> Inbox:
        since = parse_since(a.since, now_ms=now_ms(), newest=r.max_lseq())
        return r.check_messages(role, inst, since.cursor, a.limit, arrived_after_ms=since.arrived_after_ms,
                                max_bytes=INBOX_BYTES, tenant_id=a.tenant_id)

    async def look() -> Wire:
        inbox = await call.run(read)
        return {"recipient": role, "recipientInstanceId": inst, "messages": [inbox_item(m) for m in inbox.messages],
                "cursor": inbox.cursor, "truncated": inbox.truncated,
                "nextSince": inbox.cursor if inbox.truncated else None}

    return await wait_for_data(call, look, lambda out: bool(out["messages"]), a.wait)


async def mark_as_read(call: Call, a: s.MarkAsReadArgs) -> s.MarkedOut:
    done = await call.run(Replica.mark_receipts, a.receipt_ids, a.caller_orchestrator)
    return s.MarkedOut(marked_as_read=done.marked, marked=done.marked, unknown=done.unknown, not_yours=done.not_yours)


def _status(r: Replica, mid: str) -> s.StatusOut:
    m = r.get_message(mid)
    recipients = [
        s.RecipientOut(role=x.role, instance_id=x.instance, receipt_id=x.receipt_id, state=x.state,
                       delivered_at=ms(x.delivered_at), read_at=ms(x.read_at))
        for x in r.message_status(mid)
    ]
    return s.StatusOut(message_id=m.id, retracted=m.retracted is not None, retracted_at=ms(m.retracted),
                       recipients=recipients)


async def message_status(call: Call, a: s.MessageStatusArgs) -> s.StatusOut:
    return await call.run(_status, a.message_id)


def _broadcast_status(r: Replica, mid: str, limit: int) -> s.BroadcastStatusOut:
    m = r.get_message(mid)
    receipts = [
        s.BroadcastReceiptOut(recipient=x.role, recipient_instance_id=x.instance, read=x.read_at is not None,
                              read_at=ms(x.read_at), delivered_at=ms(x.delivered_at), receipt_id=x.receipt_id)
        for x in r.message_status(mid)
    ]
    return s.BroadcastStatusOut(message_id=m.id, sender=m.sender, channel=m.channel, created_at=ms_of_iso(m.created),
                                receipts=receipts[:limit], truncated=len(receipts) > limit,
                                retracted=m.retracted is not None)


async def list_broadcast_status(call: Call, a: s.BroadcastStatusArgs) -> s.BroadcastStatusOut:
    return await call.run(_broadcast_status, a.message_id, a.limit)


async def get_message(call: Call, a: s.MessageIdArgs) -> s.MessageOut:
    return message_out(await call.run(Replica.get_message, a.message_id))


def _list_messages(r: Replica, a: s.ListMessagesArgs) -> s.MessagePageOut:
    page = r.list_messages(session_day=a.session_day, from_=a.sender, tenant_id=a.tenant_id,
                           before=decode_cursor(a.cursor, "before"), limit=a.limit)
    return s.MessagePageOut(items=[message_out(m) for m in page.messages],
                            next_cursor=None if page.before is None else encode_cursor({"before": page.before}))


async def list_messages(call: Call, a: s.ListMessagesArgs) -> s.MessagePageOut:
    return await call.run(_list_messages, a)


def _delete_message(r: Replica, mid: str, caller: str) -> s.RetractedOut:
    m = r.retract_message(mid, caller)
    return s.RetractedOut(deleted=True, message_id=m.id, receipts_deleted=r.receipt_count(m.id),
                          retracted_at=ms(m.retracted))


async def delete_message(call: Call, a: s.DeleteMessageArgs) -> s.RetractedOut:
    caller = role_of(a.caller_orchestrator, call.bind, "callerOrchestrator")
    return await call.run(_delete_message, a.message_id, caller)


def _search(r: Replica, a: s.SearchMessagesArgs) -> s.SearchOut:
    hits = r.search_messages(a.query, from_=a.sender, channel=a.channel, since=a.since, limit=a.limit)
    names = _names(r, [h.sender for h in hits if h.thread is not None])
    items = [
        s.SearchHitOut(message_id=h.id, sender=names.get(h.sender, h.sender) if h.thread is not None else h.sender,
                       from_instance_id=h.sender_instance, channel=h.channel, thread_id=h.thread,
                       content=h.content, created_at=ms_of_iso(h.created), session_day=h.session_day, seq=h.seq)
        for h in hits
    ]
    return s.SearchOut(query=a.query, hits=items)


async def search_messages(call: Call, a: s.SearchMessagesArgs) -> s.SearchOut:
    return await call.run(_search, a)


def _keyword_search(r: Replica, a: s.KeywordSearchArgs) -> s.KeywordOut:
    hits = r.search_messages(a.query, from_=a.sender, exact_channel=a.channel, session_day=a.session_day,
                             tenant_id=a.tenant_id, limit=a.limit, prefix=True)
    return s.KeywordOut(query=a.query, items=[message_out(r.get_message(h.id)) for h in hits if h.thread is None])


async def search_messages_by_keyword(call: Call, a: s.KeywordSearchArgs) -> s.KeywordOut:
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


async def get_profile(call: Call, a: s.GetProfileArgs) -> s.ProfileResult:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")
    return profile_result(oid, await call.run(Replica.get_profile, oid, a.instance_id))


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


def _create_agent(r: Replica, name: str) -> s.AgentOut:
    """Get or create, as AgentMsgs' tool does: a worker calls it on every start."""
    clean = clean_name(name, "name")
    existing = r.find_agent(clean)
    if existing is not None and existing.alive:
        return s.AgentOut(agent_id=existing.id, name=existing.name, created=False)
    return s.AgentOut(agent_id=r.create_agent(clean), name=clean, created=True)


async def create_agent(call: Call, a: s.CreateAgentArgs) -> s.AgentOut:
    return await call.run(_create_agent, a.name)


def _delete_account(r: Replica, agent_id: str) -> s.DeletedOut:
    aid = agent_id.strip()
    agent = r.get_agent(aid) if aid else None
    if agent is None or not agent.alive:
        hint = ""
        if aid:
            named = r.find_agent(aid)
            if named is not None and named.alive:
                hint = f"; the agent named {aid!r} has agent_id {named.id!r}"
        raise NotFound(f"unknown agent_id {aid!r}{hint}")
    r.delete_agent(aid)
    return s.DeletedOut(agent_id=aid, name=agent.name, deleted=True)


async def delete_account(call: Call, a: s.DeleteAccountArgs) -> s.DeletedOut:
    return await call.run(_delete_account, a.agent_id)


def _create_thread(r: Replica, names: list[str]) -> s.ThreadOut:
    ids = [_known_agent(r, n, "participant name")[1].id for n in names]
    if len(set(ids)) < 2:
        raise InvalidArgument("need >=2 participants (two different registered agents)")
    return _thread_out(r, r.create_thread(*ids))


async def create_thread(call: Call, a: s.CreateThreadArgs) -> s.ThreadOut:
    return await call.run(_create_thread, a.participant_names)


def _join_thread(r: Replica, tid: str, name: str) -> s.ThreadOut:
    _require_thread(r, tid)
    _clean, agent = _known_agent(r, name, "agent_name")
    r.join_thread(tid, agent.id)
    return _thread_out(r, tid)


async def join_thread(call: Call, a: s.ThreadAgentArgs) -> s.ThreadOut:
    return await call.run(_join_thread, a.thread_id, a.agent_name)


def _leave_thread(r: Replica, tid: str, name: str) -> s.ThreadOut:
    members = _require_thread(r, tid)
    clean = clean_name(name, "agent_name")
    agent = r.find_agent(clean)
    if agent is None or agent.id not in members:
        raise InvalidArgument(f"agent not in thread: {clean!r} is not a participant of thread {tid!r}")
    r.leave_thread(tid, agent.id)
    return _thread_out(r, tid)


async def leave_thread(call: Call, a: s.ThreadAgentArgs) -> s.ThreadOut:
    return await call.run(_leave_thread, a.thread_id, a.agent_name)


def _thread_info(r: Replica, tid: str) -> s.ThreadInfoOut:
    info = r.get_thread_info(tid)
    if info is None:
        raise NotFound(f"unknown thread {tid!r}")
    names = _names(r, info.participants)
    # Thread seqs run 1..message_count with no gap, so the latest message is the one after count - 1.
    latest = _poll(r, tid, info.message_count - 1, 1)["messages"] if info.message_count else []
    return s.ThreadInfoOut(thread_id=info.thread_id, participants=[names[p] for p in info.participants],
                           message_count=info.message_count, latest_activity=info.latest_activity,
                           latest_message=s.ThreadMessageOut.model_validate(latest[0]) if latest else None)


async def thread_info(call: Call, a: s.ThreadArgs) -> s.ThreadInfoOut:
    return await call.run(_thread_info, a.thread_id)


def _thread_status(r: Replica, tid: str, name: str) -> s.ThreadStatusOut:
    info = r.get_thread_info(tid)
    if info is None:
        raise NotFound(f"unknown thread {tid!r}")
    clean, agent = _known_agent(r, name, "agent_name", alive=False)
    state = r.get_thread_read_state(tid, agent.id)
    if state is None:
        raise NotFound(f"unknown thread {tid!r}")
    return s.ThreadStatusOut(
        thread_id=tid, agent_name=clean, is_participant=agent.id in info.participants, cursor=state.cursor,
        unread_count=state.unread_count, unread_from_others=state.unread_from_others,
        has_unread=state.unread_from_others > 0, message_count=info.message_count,
        latest_activity=info.latest_activity)


async def thread_status(call: Call, a: s.ThreadAgentArgs) -> s.ThreadStatusOut:
    return await call.run(_thread_status, a.thread_id, a.agent_name)


def _append(r: Replica, tid: str, name: str, content: str) -> s.AppendOut:
    members = _require_thread(r, tid)
    clean = clean_name(name, "sender_name")
    agent = r.find_agent(clean)
    if agent is None or agent.id not in members:
        raise InvalidArgument(f"sender not in thread: {clean!r} is not a participant of thread {tid!r} "
                              "(join_thread first)")
    return s.AppendOut(thread_id=tid, sender_name=clean, seq=r.append(tid, agent.id, content).seq)


async def append(call: Call, a: s.AppendArgs) -> s.AppendOut:
    return await call.run(_append, a.thread_id, a.sender_name, a.content)


def _poll(r: Replica, tid: str, after: int, limit: int) -> Wire:
    """``s.PollOut`` in wire form."""
    msgs = r.poll(tid, after, limit)
    names = _names(r, [m.sender for m in msgs])
    items = [{"seq": m.seq, "id": m.id, "sender": names[m.sender], "sender_id": m.sender, "content": m.content,
              "created": m.created} for m in msgs]
    return {"thread_id": tid, "messages": items, "cursor": max((m.seq for m in msgs), default=after)}


async def poll(call: Call, a: s.PollArgs) -> Wire:
    async def look() -> Wire:
        return await call.run(_poll, a.thread_id, a.after_seq, a.limit)

    return await wait_for_data(call, look, lambda out: bool(out["messages"]), a.wait)


def _has_unread(r: Replica, tid: str, name: str) -> s.HasUnreadOut:
    _require_thread(r, tid)
    clean, agent = _known_agent(r, name, "agent_name", alive=False)
    return s.HasUnreadOut(thread_id=tid, agent_name=clean, has_unread=r.has_unread(tid, agent.id))


async def has_unread(call: Call, a: s.ThreadAgentArgs) -> s.HasUnreadOut:
    return await call.run(_has_unread, a.thread_id, a.agent_name)


def _mark_read(r: Replica, tid: str, name: str, seq: int) -> s.MarkReadOut:
    _require_thread(r, tid)
    clean, agent = _known_agent(r, name, "agent_name", alive=False)
    r.mark_read(tid, agent.id, seq)
    state = r.get_thread_read_state(tid, agent.id)
    unread = state.unread_count if state is not None else 0
    return s.MarkReadOut(thread_id=tid, agent_name=clean, seq=seq, unread_count=unread)


async def mark_read(call: Call, a: s.MarkReadArgs) -> s.MarkReadOut:
    return await call.run(_mark_read, a.thread_id, a.agent_name, a.seq)


# -- the registry ------------------------------------------------------------------------------

_READ = ToolAnnotations(read_only_hint=True)
_ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False)
_SET = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
_DROP = ToolAnnotations(read_only_hint=False, destructive_hint=True)

TOOLS: tuple[ToolSpec[Any, Any], ...] = (
    ToolSpec("send_message", "Send a message to a role, a comma-separated list of roles, an instance, or "
             "'broadcast'; returns its messageId.", s.SendMessageArgs, s.SentOut, send_message, _ADD),
    ToolSpec("check_messages", "Fetch your unread messages (oldest first) with their receipt ids; "
             "set wait to block until one arrives.", s.CheckMessagesArgs, s.InboxOut, check_messages, _ADD),
    ToolSpec("mark_as_read", "Mark messages read by the receipt ids check_messages gave you, so they are "
             "not returned again.", s.MarkAsReadArgs, s.MarkedOut, mark_as_read, _SET),
    ToolSpec("delete_message", "Retract a message you sent: every node drops its content and it leaves "
             "every inbox and search.", s.DeleteMessageArgs, s.RetractedOut, delete_message, _DROP),
    ToolSpec("get_message", "Fetch one message by its messageId, with channel, sender, sessionDay and tenant.",
             s.MessageIdArgs, s.MessageOut, get_message, _READ),
    ToolSpec("list_messages", "List messages newest first, read or not, filtered by sessionDay, sender or "
             "tenant; page with cursor.", s.ListMessagesArgs, s.MessagePageOut, list_messages, _READ),
    ToolSpec("list_broadcast_status", "Show each recipient's read state for a message (broadcast or not).",
             s.BroadcastStatusArgs, s.BroadcastStatusOut, list_broadcast_status, _READ),
    ToolSpec("search_messages_by_keyword", "Full-text search of messages, best match first; filter by sender, "
             "exact channel, sessionDay or tenant.", s.KeywordSearchArgs, s.KeywordOut,
             search_messages_by_keyword, _READ),
    ToolSpec("set_summary", "Say what you are working on now (your profile's currentTask, and lastSeen); "
             "shown by list_peers.", s.SetSummaryArgs, s.SummaryOut, set_summary, _SET),
    ToolSpec("list_peers", "List the roles and instances this node knows, with role, current task, last seen "
             "and whether they look reachable.", s.ListPeersArgs, s.PeersOut, list_peers, _READ),
    ToolSpec("update_profile", "Create or update a profile: name, static {role, workspace, capabilities}, "
             "dynamic {currentTask, ...}; merged key by key.", s.UpdateProfileArgs, s.ProfileResult,
             update_profile, _SET),
    ToolSpec("get_profile", "Read a role's profile (name, static identity, dynamic state); profile is null "
             "if it has none.", s.GetProfileArgs, s.ProfileResult, get_profile, _READ),
    ToolSpec("message_status", "Show, for each recipient of a message, whether it is pending, delivered "
             "or read.", s.MessageStatusArgs, s.StatusOut, message_status, _READ),
    ToolSpec("search_messages", "Full-text search over every message this node holds (all words must match), "
             "best match first; filter by sender, channel or cursor.", s.SearchMessagesArgs, s.SearchOut,
             search_messages, _READ),
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
             "one arrives.", s.PollArgs, s.PollOut, poll, _READ),
    ToolSpec("has_unread", "Tell whether a thread holds messages from others that the agent has not read.",
             s.ThreadAgentArgs, s.HasUnreadOut, has_unread, _READ),
    ToolSpec("mark_read", "Mark an agent's thread messages up to seq as read.",
             s.MarkReadArgs, s.MarkReadOut, mark_read, _SET),
)
