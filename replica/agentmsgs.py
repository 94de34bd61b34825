"""AgentMsgs' Python API over a peerd replica: ``App``, ``InMemoryStore``, ``SQLiteStore``.

Code written for AgentMsgs runs with only its import lines changed::

    from replica.agentmsgs import App, InMemoryStore, SQLiteStore

Invariants:
* ``App`` is a thin layer over ``Replica``: every method is argument
  resolution, one or a few ``Replica`` calls, and conversion into the objects
  AgentMsgs returns. No SQL here; every rule (membership, read state,
  per-thread ``seq``, the error texts) is the replica's.
* Agents and threads are objects (``agent.id``, ``agent.name``,
  ``thread.participants``); methods take an ``Agent``, an agent id or an agent
  name wherever they take an agent, and a ``Thread`` or a thread id wherever
  they take a thread.
* ``Message.seq`` is the message's number within its thread in this replica's
  arrival order (1, 2, 3, ...), as ``poll(after_seq)`` and ``mark_read`` use it.
* Errors are the replica's: ``InvalidArgument`` is a ``ValueError`` whose text
  starts as AgentMsgs documents it (``need >=2 participants``, ``agent name
  taken``, ``sender not in thread``); ``NotFound`` (a ``LookupError``) for an
  unknown agent or thread where AgentMsgs gives no ``None`` rule.
* ``SQLiteStore(path)`` is a peerd replica file: a home's ``replica.db`` is that
  node (its ``node.key``), so what the App writes syncs to the fleet as soon as
  the home's daemon runs; any other file gets its own node key beside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Self

from replica import models, open_file
from replica.api import MAX_LIMIT, Replica
from replica.errors import InvalidArgument, NotFound


@dataclass(frozen=True)
class Agent:
    """A named agent. ``id`` is a pure function of the name, the same on every replica."""

    id: str
    name: str


@dataclass(frozen=True)
class Thread:
    id: str
    participants: tuple[Agent, ...]
    created_at: datetime | None

    @property
    def participant_ids(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.participants)


@dataclass(frozen=True)
class Message:
    id: str
    thread_id: str
    seq: int
    sender: Agent
    content: str
    created_at: datetime


@dataclass(frozen=True)
class ThreadInfo:
    """``latest_activity``: when the newest message was written (the thread's creation if it has none)."""

    thread_id: str
    participants: tuple[Agent, ...]
    message_count: int
    latest_activity: datetime | None


@dataclass(frozen=True)
class ThreadReadState:
    """``cursor``: the highest seq the agent has read (0: nothing read)."""

    thread_id: str
    agent_id: str
    cursor: int
    unread_count: int
    unread_from_others_count: int


AgentRef = Agent | str
ThreadRef = Thread | str


class InMemoryStore:
    """A replica in this process's memory: gone when the process exits, shared with nobody."""

    def __init__(self) -> None:
        self.replica = Replica.open(":memory:")

    def close(self) -> None:
        self.replica.close()


class SQLiteStore:
    """A peerd replica file (created if missing; SQLite WAL, safe to share between processes)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.replica = open_file(self.path)

    def close(self) -> None:
        self.replica.close()


def _when(iso: str | None) -> datetime | None:
    return None if iso is None else datetime.fromisoformat(iso)


def _thread_id(ref: ThreadRef) -> str:
    return ref.id if isinstance(ref, Thread) else ref


class App:
    """The AgentMsgs application API over one replica."""

    def __init__(self, store: InMemoryStore | SQLiteStore | Replica | None = None) -> None:
        self.store = store if store is not None else InMemoryStore()
        self.replica: Replica = self.store if isinstance(self.store, Replica) else self.store.replica

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- agents ------------------------------------------------------------------------

    def create_agent(self, name: str) -> Agent:
        """A new agent; ``ValueError('agent name taken')`` if a live agent has that name."""
        return self._agent_by_id(self.replica.create_agent(name))

    def get_or_create_agent(self, name: str) -> Agent:
        return self._agent_by_id(self.replica.get_or_create_agent(name))

    def get_agent(self, agent: AgentRef) -> Agent | None:
        """The live agent with this id or name, or ``None``."""
        found = self._lookup(agent)
        return found if found is not None and self._alive(found.id) else None

    def list_agents(self) -> list[Agent]:
        return [Agent(a.id, a.name) for a in self.replica.list_agents()]

    def delete_agent(self, agent: AgentRef) -> None:
        """Delete an agent: it can no longer join or post (``delete_account`` of the MCP tools)."""
        self.replica.delete_agent(self._agent(agent).id)

    # -- threads -----------------------------------------------------------------------

    def create_thread(self, *agents: AgentRef) -> Thread:
        """A new thread; ``ValueError('need >=2 participants')`` with fewer than two agents."""
        tid = self.replica.create_thread(*(self._agent(a).id for a in agents))
        return self._thread(tid)

    def get_thread(self, thread_id: ThreadRef) -> Thread | None:
        found = self.replica.get_thread(_thread_id(thread_id))
        return None if found is None else self._thread_of(found)

    def find_threads(self, *agents: AgentRef) -> list[Thread]:
        """Threads having every given agent among their participants, oldest first."""
        tids = self.replica.find_threads(*(self._agent(a).id for a in agents))
        return [self._thread(t) for t in tids]

    def join_thread(self, thread_id: ThreadRef, agent: AgentRef) -> Thread:
        tid = _thread_id(thread_id)
        self.replica.join_thread(tid, self._agent(agent).id)
        return self._thread(tid)

    def leave_thread(self, thread_id: ThreadRef, agent: AgentRef) -> Thread:
        tid = _thread_id(thread_id)
        self.replica.leave_thread(tid, self._agent(agent).id)
        return self._thread(tid)

    # -- messages and read state -------------------------------------------------------

    def append(self, thread_id: ThreadRef, sender: AgentRef, content: str) -> Message:
        """Post as ``sender``; ``ValueError('sender not in thread')`` unless it is a participant."""
        who = self._agent(sender)
        msg = self.replica.append(_thread_id(thread_id), who.id, content)
        return self._message(msg, {who.id: who})

    def poll(self, thread_id: ThreadRef, after_seq: int = 0, limit: int | None = None) -> list[Message]:
        """The thread's messages with ``seq > after_seq``, oldest first (all of them unless ``limit``)."""
        tid = _thread_id(thread_id)
        out: list[Message] = []
        senders: dict[str, Agent] = {}
        after = after_seq
        while limit is None or len(out) < limit:
            want = MAX_LIMIT if limit is None else min(MAX_LIMIT, limit - len(out))
            page = self.replica.poll(tid, after, want)
            out += [self._message(m, senders) for m in page]
            if len(page) < want:
                break
            after = page[-1].seq
        return out

    def mark_read(self, thread_id: ThreadRef, agent: AgentRef, seq: int) -> None:
        """Mark the thread's messages up to ``seq`` read for ``agent`` (the cursor never moves back)."""
        self.replica.mark_read(_thread_id(thread_id), self._agent(agent).id, seq)

    def has_unread(self, thread_id: ThreadRef, agent: AgentRef) -> bool:
        """Whether the thread holds messages from other agents that ``agent`` has not read."""
        return self.replica.has_unread(_thread_id(thread_id), self._agent(agent).id)

    def get_thread_info(self, thread_id: ThreadRef) -> ThreadInfo | None:
        info = self.replica.get_thread_info(_thread_id(thread_id))
        if info is None:
            return None
        return ThreadInfo(info.thread_id, self._agents(info.participants), info.message_count,
                          _when(info.latest_activity))

    def get_thread_read_state(self, thread_id: ThreadRef, agent: AgentRef) -> ThreadReadState | None:
        """``None`` for an unknown thread; a valid state (cursor 0, nothing unread) for an empty one."""
        tid, aid = _thread_id(thread_id), self._agent(agent).id
        state = self.replica.get_thread_read_state(tid, aid)
        if state is None:
            return None
        return ThreadReadState(tid, aid, state.cursor, state.unread_count, state.unread_from_others)

    # -- resolution and conversion -----------------------------------------------------

    def _lookup(self, ref: AgentRef) -> Agent | None:
        """The agent a reference names, alive or not: an ``Agent``, an agent id, or a name."""
        if isinstance(ref, Agent):
            return ref
        if not isinstance(ref, str):
            raise InvalidArgument(f"an agent is an Agent, an agent id or a name, not {type(ref).__name__}")
        found = self.replica.get_agent(ref) or self.replica.find_agent(ref)
        return None if found is None else Agent(found.id, found.name)

    def _alive(self, agent_id: str) -> bool:
        found = self.replica.get_agent(agent_id)
        return found is not None and found.alive

    def _agent(self, ref: AgentRef) -> Agent:
        found = self._lookup(ref)
        if found is None:
            raise NotFound(f"unknown agent {ref!r} (create it with get_or_create_agent)")
        return found

    def _agent_by_id(self, agent_id: str) -> Agent:
        found = self.replica.get_agent(agent_id)
        assert found is not None
        return Agent(found.id, found.name)

    def _agents(self, ids: Iterable[str]) -> tuple[Agent, ...]:
        out: list[Agent] = []
        for aid in ids:
            found = self.replica.get_agent(aid)
            out.append(Agent(aid, found.name if found is not None else aid))
        return tuple(out)

    def _thread(self, tid: str) -> Thread:
        found = self.replica.get_thread(tid)
        if found is None:
            raise NotFound(f"unknown thread {tid}")
        return self._thread_of(found)

    def _thread_of(self, thread: models.Thread) -> Thread:
        return Thread(thread.id, self._agents(thread.participants), _when(thread.created))

    def _message(self, msg: models.ThreadMessage, senders: dict[str, Agent]) -> Message:
        sender = senders.get(msg.sender)
        if sender is None:
            sender = senders[msg.sender] = self._agents([msg.sender])[0]
        created = _when(msg.created)
        assert created is not None
        return Message(msg.id, msg.thread_id, msg.seq, sender, msg.content, created)


__all__ = ["Agent", "App", "InMemoryStore", "Message", "SQLiteStore", "Thread", "ThreadInfo", "ThreadReadState"]
