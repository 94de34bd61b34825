"""Profiles and agents: who is who, as last-writer-wins registers.

Invariants:
* A profile is three independent registers (name, static, dynamic) per
  orchestrator id: writing one never touches the others.
* An agent's id is a pure function of its name's key (``checks.agent_id_for``
  over ``names.name_key``), so every replica derives the same id without
  coordination and names match case-insensitively after NFC; the name as first
  written is kept for display. Deleting an agent only clears its ``alive``
  register, so the name can be taken again and gets the same id back.
* ``find_agent`` is the one way a name becomes an agent. An agent registered
  before names were keyed (its id derived from the exact spelling) is still
  found by any spelling of its name.
"""

from __future__ import annotations

from replica.checks import agent_id_for, check_content, required_name
from replica.core import ReplicaCore, iso
from replica.errors import InvalidArgument, NotFound
from replica.models import Agent, Profile
from replica.names import name_key

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

    def find_agent(self, name: str) -> Agent | None:
        """The agent called ``name`` (any case, any Unicode form), a live one first; None if none."""
        clean = required_name(name, "agent name")
        canonical = self.get_agent(agent_id_for(clean))
        if canonical is not None and canonical.alive:
            return canonical
        return self._legacy_agent(name_key(clean), canonical) or canonical

    def _legacy_agent(self, key: str, canonical: Agent | None) -> Agent | None:
        """A live agent whose id came from an older, unkeyed spelling of the name (rare: looked
        for only when the keyed id finds no live agent)."""
        skip = canonical.id if canonical is not None else ""
        for agent in self.list_agents():
            if agent.id != skip and name_key(agent.name) == key:
                return agent
        return None

    def create_agent(self, name: str) -> str:
        """Register ``name``; ``InvalidArgument('agent name taken')`` if a live agent has it."""
        clean = required_name(name, "agent name")
        found = self.find_agent(clean)
        if found is not None and found.alive:
            raise InvalidArgument("agent name taken")
        aid = agent_id_for(clean)
        self._set([["agent", [aid], "name", clean], ["agent", [aid], "alive", True]])
        return aid

    def get_or_create_agent(self, name: str) -> str:
        found = self.find_agent(name)
        return found.id if found is not None and found.alive else self.create_agent(name)

    def delete_agent(self, agent_id: str) -> None:
        aid = required_name(agent_id, "agent id")
        if not self._alive(aid):
            raise NotFound(f"unknown agent {aid}")
        self._set([["agent", [aid], "alive", False]])
