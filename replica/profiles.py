"""Profiles and agents: who is who, as last-writer-wins registers.

Invariants:
* A profile is three independent registers (name, static, dynamic) per
  orchestrator id: writing one never touches the others.
* An agent's id is a pure function of its name (``checks.agent_id_for``), so
  every replica derives the same id without coordination; deleting an agent
  only clears its ``alive`` register, so the name can be taken again and gets
  the same id back.
"""

from __future__ import annotations

from replica.checks import agent_id_for, check_content, required_name
from replica.core import ReplicaCore, iso
from replica.errors import InvalidArgument, NotFound
from replica.models import Agent, Profile

_PROFILE = "SELECT id, name, static, dynamic, updated FROM profiles"


class Profiles(ReplicaCore):
    # -- profiles ------------------------------------------------------------------

    def update_profile(self, orchestrator_id: str, name: str | None = None, static: str | None = None,
                       dynamic: str | None = None) -> Profile:
        """Set the given fields; fields left out (None) keep their value."""
        oid = required_name(orchestrator_id, "orchestratorId")
        fields = {"name": name, "static": static, "dynamic": dynamic}
        writes = [["prof", [oid], f, check_content(v, f)] for f, v in fields.items() if v is not None]
        if not writes:
            raise InvalidArgument("give at least one of name, static, dynamic")
        _, seen = self._first_seen(oid, self._wall())
        self._set(seen + writes)
        profile = self.get_profile(oid)
        assert profile is not None
        return profile

    def get_profile(self, orchestrator_id: str) -> Profile | None:
        oid = required_name(orchestrator_id, "orchestratorId")
        with self._store.read() as cur:
            row = cur.execute(f"{_PROFILE} WHERE id = ?", (oid,)).fetchone()
        return None if row is None else Profile(row[0], row[1], row[2], row[3], iso(row[4]))

    def list_profiles(self) -> list[Profile]:
        with self._store.read() as cur:
            rows = cur.execute(f"{_PROFILE} ORDER BY id").fetchall()
        return [Profile(r[0], r[1], r[2], r[3], iso(r[4])) for r in rows]

    # -- agents ----------------------------------------------------------------------

    def get_agent(self, agent_id: str) -> Agent | None:
        aid = required_name(agent_id, "agent id")
        with self._store.read() as cur:
            row = cur.execute("SELECT id, name, alive FROM agents WHERE id = ?", (aid,)).fetchone()
        return None if row is None or row[1] is None else Agent(row[0], row[1], bool(row[2]))

    def list_agents(self) -> list[Agent]:
        with self._store.read() as cur:
            rows = cur.execute("SELECT id, name, alive FROM agents WHERE alive = 1 ORDER BY name").fetchall()
        return [Agent(r[0], r[1], True) for r in rows]

    def _alive(self, agent_id: str) -> bool:
        agent = self.get_agent(agent_id)
        return agent is not None and agent.alive

    def create_agent(self, name: str) -> str:
        """Register ``name``; ``InvalidArgument('agent name taken')`` if it exists."""
        clean = required_name(name, "agent name")
        aid = agent_id_for(clean)
        if self._alive(aid):
            raise InvalidArgument("agent name taken")
        self._set([["agent", [aid], "name", clean], ["agent", [aid], "alive", True]])
        return aid

    def get_or_create_agent(self, name: str) -> str:
        clean = required_name(name, "agent name")
        aid = agent_id_for(clean)
        return aid if self._alive(aid) else self.create_agent(clean)

    def delete_agent(self, agent_id: str) -> None:
        aid = required_name(agent_id, "agent id")
        if not self._alive(aid):
            raise NotFound(f"unknown agent {aid}")
        self._set([["agent", [aid], "alive", False]])
