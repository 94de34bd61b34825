"""The tools: argument checks and one call into the replica API each.

Invariants:
* A handler validates everything it can before it writes; a bad call raises
  ``InvalidArgument`` or ``NotFound`` (replica's error hierarchy) and leaves the
  replica unchanged.
* Replica calls never run on the event loop: each handler hands one small
  synchronous function to ``Call.run`` (a worker thread).
* Session binding fills in the caller's role and instance; explicit arguments
  win. The bound instance applies only to the bound role.
* ``wait`` blocks through the ``Waiter`` (the process's change feed, no
  polling), capped at ``MAX_WAIT_SECONDS``; the change mark is taken before
  each look.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from mcp.types import ToolAnnotations
from pydantic import BaseModel

from mcp_server import schemas as s
from mcp_server.waiter import Waiter
from replica import Agent, InvalidArgument, NotFound, Profile, RecipientCheck, Replica, SenderSeen, SentMessage

RECENT = timedelta(minutes=15)

T = TypeVar("T")
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
    handler: Callable[[Call, A], Awaitable[R]]
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
    return bind.instance if bind.role is not None and role == bind.role.strip() else None


def clean_name(name: str, what: str) -> str:
    clean = name.strip()
    if not clean:
        raise InvalidArgument(f"{what} must be a non-empty string")
    return clean


def seen_recently(stamp: str | None, now: datetime) -> bool:
    if stamp is None:
        return False
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return False
    return now - when <= RECENT


def capped_wait(seconds: float) -> float:
    return min(seconds, s.MAX_WAIT_SECONDS)


async def wait_for_data(call: Call, look: Callable[[], Awaitable[T]], found: Callable[[T], bool],
                        wait: float) -> T:
    """``look()`` now; if nothing is ``found`` and ``wait`` > 0, look again after each change.
    A wake with no change means the host is closing: the call returns what it has."""
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


# -- messaging -----------------------------------------------------------------------------


def _send_checked(r: Replica, sender: str, a: s.SendMessageArgs,
                  from_inst: str | None) -> tuple[RecipientCheck, SentMessage]:
    """Which recipients were never seen (asked before the send, which makes the sender known), and the send."""
    check = r.recipient_check(a.channel)
    return check, r.send_message(sender, a.channel, a.content, a.instance_id, from_inst)


async def send_message(call: Call, a: s.SendMessageArgs) -> s.SentOut:
    sender = role_of(a.sender, call.bind, "from")
    from_inst = instance_of(a.from_instance_id, sender, call.bind)
    check, sent = await call.run(_send_checked, sender, a, from_inst)
    return s.SentOut(id=sent.id, sender=sender, from_instance_id=from_inst, channel=a.channel.strip(),
                     instance_id=a.instance_id, recipients=list(sent.recipients), created=sent.created,
                     seq=sent.seq, unknown_recipients=list(check.unknown_recipients),
                     known_roles=list(check.known_roles) if check.unknown_recipients else None)


async def check_messages(call: Call, a: s.CheckMessagesArgs) -> s.InboxOut:
    role = role_of(a.recipient, call.bind, "recipient")
    inst = instance_of(a.recipient_instance_id, role, call.bind)

    async def look() -> s.InboxOut:
        inbox = await call.run(Replica.check_messages, role, inst, a.since, a.limit)
        items = [
            s.InboxItem(id=m.id, receipt_id=m.receipt_id, sender=m.sender, sender_instance_id=m.sender_instance,
                        channel=m.channel, target_instance_id=m.target_instance, content=m.content,
                        created=m.created, seq=m.seq, delivered_at=m.delivered_at, read_at=m.read_at)
            for m in inbox.messages
        ]
        return s.InboxOut(recipient=role, recipient_instance_id=inst, messages=items, cursor=inbox.cursor)

    return await wait_for_data(call, look, lambda out: bool(out.messages), a.wait)


async def mark_as_read(call: Call, a: s.MarkAsReadArgs) -> s.MarkedOut:
    return s.MarkedOut(marked=await call.run(Replica.mark_as_read, a.receipt_ids))


async def message_status(call: Call, a: s.MessageStatusArgs) -> s.StatusOut:
    rows = await call.run(Replica.message_status, a.message_id)
    recipients = [
        s.RecipientOut(role=x.role, instance_id=x.instance, receipt_id=x.receipt_id,
                       state=x.state, delivered_at=x.delivered_at,
                       read_at=x.read_at)
        for x in rows
    ]
    return s.StatusOut(message_id=a.message_id.strip(), recipients=recipients)


def _search(r: Replica, a: s.SearchMessagesArgs) -> s.SearchOut:
    hits = r.search_messages(a.query, from_=a.sender, channel=a.channel, since=a.since, limit=a.limit)
    names = _names(r, [h.sender for h in hits if h.thread is not None])
    items = [
        s.SearchHitOut(id=h.id, sender=names.get(h.sender, h.sender) if h.thread is not None else h.sender,
                       sender_instance_id=h.sender_instance, channel=h.channel, thread_id=h.thread,
                       content=h.content, created=h.created, seq=h.seq)
        for h in hits
    ]
    return s.SearchOut(query=a.query, hits=items)


async def search_messages(call: Call, a: s.SearchMessagesArgs) -> s.SearchOut:
    return await call.run(_search, a)


def merge_peers(profiles: Sequence[s.ProfileOut], senders: Sequence[SenderSeen], now: datetime) -> list[s.PeerOut]:
    """Profiles give every role seen; senders (who sent when, on any machine of the fleet)
    add instances and liveness, replacing a role's profile-only entry."""
    peers: dict[tuple[str, str | None], s.PeerOut] = {}
    for p in profiles:
        peers[(p.orchestrator_id, None)] = s.PeerOut(
            id=p.orchestrator_id, instance_id=None, name=p.name, summary=p.dynamic or p.static,
            last_seen=p.updated, reachable=seen_recently(p.updated, now))
    names = {p.orchestrator_id: p for p in profiles}
    for x in senders:
        base = names.get(x.role)
        peers.pop((x.role, None), None)
        peers[(x.role, x.instance)] = s.PeerOut(
            id=x.role, instance_id=x.instance, name=base.name if base else None,
            summary=base.dynamic or base.static if base else None,
            last_seen=x.last_seen, reachable=seen_recently(x.last_seen, now))
    return [peers[k] for k in sorted(peers, key=lambda k: (k[0], k[1] or ""))]


def _profile_out(p: Profile) -> s.ProfileOut:
    return s.ProfileOut(orchestrator_id=p.orchestrator_id, name=p.name, static=p.static, dynamic=p.dynamic,
                        updated=p.updated)


async def list_peers(call: Call, _a: s.NoArgs) -> s.PeersOut:
    profiles = [_profile_out(p) for p in await call.run(Replica.list_profiles)]
    senders = await call.run(Replica.recent_senders)
    return s.PeersOut(peers=merge_peers(profiles, senders, datetime.now(UTC)))


async def update_profile(call: Call, a: s.UpdateProfileArgs) -> s.ProfileOut:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")
    return _profile_out(await call.run(Replica.update_profile, oid, a.name, a.static, a.dynamic))


async def get_profile(call: Call, a: s.GetProfileArgs) -> s.ProfileOut:
    oid = role_of(a.orchestrator_id, call.bind, "orchestratorId")
    profile = await call.run(Replica.get_profile, oid)
    if profile is None:
        raise NotFound(f"no profile for {oid!r} (update_profile creates one)")
    return _profile_out(profile)


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
    latest = _poll(r, tid, info.message_count - 1, 1).messages if info.message_count else []
    return s.ThreadInfoOut(thread_id=info.thread_id, participants=[names[p] for p in info.participants],
                           message_count=info.message_count, latest_activity=info.latest_activity,
                           latest_message=latest[0] if latest else None)


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


def _poll(r: Replica, tid: str, after: int, limit: int) -> s.PollOut:
    msgs = r.poll(tid, after, limit)
    names = _names(r, [m.sender for m in msgs])
    items = [s.ThreadMessageOut(seq=m.seq, id=m.id, sender=names[m.sender], sender_id=m.sender,
                                content=m.content, created=m.created) for m in msgs]
    return s.PollOut(thread_id=tid, messages=items, cursor=max((m.seq for m in msgs), default=after))


async def poll(call: Call, a: s.PollArgs) -> s.PollOut:
    async def look() -> s.PollOut:
        return await call.run(_poll, a.thread_id, a.after_seq, a.limit)

    return await wait_for_data(call, look, lambda out: bool(out.messages), a.wait)


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
    ToolSpec("send_message", "Send a message to a role, a comma-separated list of roles, or 'broadcast'; "
             "returns its id.", s.SendMessageArgs, s.SentOut, send_message, _ADD),
    ToolSpec("check_messages", "Fetch your unread messages (oldest first) with their receipt ids; "
             "set wait to block until one arrives.", s.CheckMessagesArgs, s.InboxOut, check_messages, _ADD),
    ToolSpec("mark_as_read", "Mark messages read by the receipt ids check_messages gave you, so they are "
             "not returned again.", s.MarkAsReadArgs, s.MarkedOut, mark_as_read, _SET),
    ToolSpec("list_peers", "List the agents (roles) this node knows, with summary, last seen time and "
             "whether they look reachable.", s.NoArgs, s.PeersOut, list_peers, _READ),
    ToolSpec("update_profile", "Set your profile's name, static description or dynamic status; fields you "
             "leave out keep their value.", s.UpdateProfileArgs, s.ProfileOut, update_profile, _SET),
    ToolSpec("get_profile", "Read a role's profile: name, static description and dynamic status.",
             s.GetProfileArgs, s.ProfileOut, get_profile, _READ),
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
