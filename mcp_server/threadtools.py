"""The AgentMsgs tools: agents and threads (create, join, leave, append, poll, read marks).

Invariants: a handler validates everything it can before it writes and leaves the replica
unchanged on a bad call (``InvalidArgument``, ``NotFound``); each hands one small synchronous
function to ``Call.run``; agents are named by name, as AgentMsgs' tools take them.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_server import schemas as s
from mcp_server.calls import Call, Wire, clean_name, wait_for_data
from replica import (
    Agent,
    InvalidArgument,
    NotFound,
    Replica,
)


def _known_agent(r: Replica, name: str, what: str, *, alive: bool = True) -> tuple[str, Agent]:
    clean = clean_name(name, what)
    agent = r.find_agent(clean)
    if agent is None or (alive and not agent.alive):
        raise NotFound(f"unknown agent {clean!r} (register it with create_agent)")
    return clean, agent


def agent_names(r: Replica, ids: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for aid in dict.fromkeys(ids):
        agent = r.get_agent(aid)
        out[aid] = agent.name if agent is not None else aid
    return out


def _thread_out(r: Replica, tid: str) -> s.ThreadOut:
    thread = r.get_thread(tid)
    if thread is None:
        raise NotFound(f"unknown thread {tid!r}")
    names = agent_names(r, thread.participants)
    return s.ThreadOut(thread_id=tid, participants=[names[a] for a in thread.participants],
                       participant_ids=list(thread.participants))


def _require_thread(r: Replica, tid: str) -> list[str]:
    thread = r.get_thread(tid)
    if thread is None:
        raise NotFound(f"unknown thread {tid!r}")
    return thread.participants


# -- views: replica values as the tools show them (pure) ------------------------------------


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
    return _thread_out(r, r.create_thread(*ids))  # the thread rules (>= 2 participants) are replica's


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
    names = agent_names(r, info.participants)
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
    names = agent_names(r, [m.sender for m in msgs])
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
