"""Profiles and agents: who is who, as last-writer-wins registers.

Invariants:
* A profile belongs to a role, or to one instance of a role, matched by name
  key. Its ``name`` and each key of its ``static`` and ``dynamic`` objects is
  its own register (``static.role``, ``dynamic.currentTask``...): writing one
  never touches the others, on this machine or across the fleet. A key set to
  None is removed. A whole text for ``static`` or ``dynamic`` (what older
  nodes wrote) is ``static.role`` or ``dynamic.currentTask`` (``ops.TEXT_KEYS``).
* Values are JSON; the keys VantagePeers defines must have its types
  (``profile_writes``). Nothing is written as a default: defaults are filled in
  when a profile is shown, so a default never overwrites a value set elsewhere.
* An agent's id is a pure function of its name's key (``ids.agent_id_for``
  over ``names.name_key``), so every replica derives the same id without
  coordination and names match case-insensitively after NFC; the name as first
  written is kept for display. Deleting an agent only clears its ``alive``
  register, so the name can be taken again and gets the same id back.
* ``find_agent`` is the one way a name becomes an agent. An agent registered
  before names were keyed (its id derived from the exact spelling) is still
  found by any spelling of its name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from replica import hlc as hlcmod
from replica.checks import check_content, check_name, required_name
from replica.core import ReplicaCore, iso
from replica.errors import InvalidArgument, NotFound
from replica.ids import agent_id_for
from replica.lww import join_key
from replica.models import Agent, Profile
from replica.names import name_key
from replica.ops import MAX_CONTENT_BYTES, PROFILE_GROUPS, TEXT_KEYS, profile_field, split_profile_field
from replica.registers import register_key
from replica.stamps import MAX_SAFE_INT

_PROFILE = (
    "SELECT p.id, p.role, p.inst, p.first_hlc, p.updated, l.f, l.v FROM profiles p"
    " LEFT JOIN lww l ON l.tbl = 'prof' AND l.k = p.id"
)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_time(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SAFE_INT


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SAFE_INT


# VantagePeers' types for the keys it defines; other keys take any JSON value.
KNOWN_KEYS: dict[tuple[str, str], tuple[Callable[[object], bool], str]] = {
    ("static", "role"): (_is_str, "a string"),
    ("static", "workspace"): (_is_str, "a string"),
    ("static", "capabilities"): (_is_str_list, "a list of strings"),
    ("dynamic", "currentTask"): (_is_str, "a string"),
    ("dynamic", "endOfDayIndex"): (_is_str, "a string"),
    ("dynamic", "lastSeen"): (_is_time, f"a Unix-ms time between 0 and {MAX_SAFE_INT}"),
    ("dynamic", "sessionCount"): (_is_count, f"an integer between 0 and {MAX_SAFE_INT}"),
}


def _json_value(group: str, key: str, value: object) -> str:
    what = f"{group}.{key}"
    rule = KNOWN_KEYS.get((group, key))
    if rule is not None and not rule[0](value):
        raise InvalidArgument(f"{what} must be {rule[1]}")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        raise InvalidArgument(f"{what} must be a JSON value (finite numbers only)") from None
    if len(text.encode("utf-8", "surrogatepass")) > MAX_CONTENT_BYTES:
        raise InvalidArgument(f"{what} is larger than {MAX_CONTENT_BYTES} bytes")
    return text


def profile_writes(key: list[str], group: str, value: object) -> list[list[Any]]:
    """The register writes that set ``group`` (``static`` or ``dynamic``) of the profile ``key``
    from an object (each key its own register; None removes a key) or a text (``ops.TEXT_KEYS``)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = {TEXT_KEYS[group]: value}
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{group} must be an object (or a text)")
    writes: list[list[Any]] = []
    for k, v in value.items():
        if not isinstance(k, str) or split_profile_field(profile_field(group, k)) is None:
            raise InvalidArgument(f"{group} key {str(k)[:40]!r} must be 1 to 128 characters, without '.' "
                                  "or control characters")
        writes.append(["prof", key, profile_field(group, k), None if v is None else _json_value(group, k, v)])
    return writes


def profile_id(key: list[str]) -> str:
    """A profile's id: a pure function of its (role, instance) keys, the same on every replica."""
    return "pf_" + hashlib.blake2b(join_key(key).encode(), digest_size=8, person=b"peerd-prof").hexdigest()


@functools.lru_cache(maxsize=4096)
def _field(field: str) -> tuple[str, str] | None:
    """``split_profile_field``, remembered: a fleet's profiles use a few field names over and over."""
    return split_profile_field(field)


@functools.lru_cache(maxsize=4096)
def _id_of(pid: str) -> str:
    """``profile_id`` of a stored profile id (its keys joined), remembered."""
    return profile_id(pid.split("\x1f"))


def _profile(rows: list[Any]) -> Profile:
    """One profile from its rows (the profile, joined with each of its registers)."""
    pid, role, inst, first, updated = rows[0][:5]
    name: str | None = None
    groups: dict[str, dict[str, Any]] = {g: {} for g in PROFILE_GROUPS}
    for r in rows:
        field, value = r[5], r[6]
        if field == "name":
            name = value
        elif field is not None and value is not None and (split := _field(field)) is not None:
            groups[split[0]][split[1]] = json.loads(value)
    return Profile(role, name, groups["static"], groups["dynamic"], iso(updated), inst,
                   hlcmod.to_iso(first), _id_of(pid))


class Profiles(ReplicaCore):
    # -- profiles ------------------------------------------------------------------

    def _profile_key(self, orchestrator_id: str, instance_id: str | None) -> list[str]:
        oid = required_name(orchestrator_id, "orchestratorId")
        inst = check_name(instance_id, "instanceId", optional=True)
        return [oid, inst] if inst else [oid]

    def update_profile(self, orchestrator_id: str, name: str | None = None, static: object = None,
                       dynamic: object = None, *, instance_id: str | None = None) -> Profile:
        """Set the given fields of a role's profile (or one instance's); ``static`` and ``dynamic``
        are objects merged key by key (a text is ``static.role`` or ``dynamic.currentTask``).
        Fields and keys left out keep their value. With nothing to set, a missing profile is
        created (its ``dynamic.lastSeen`` is set to now) and an existing one is left as it is."""
        key = self._profile_key(orchestrator_id, instance_id)
        writes = [] if name is None else [["prof", key, "name", check_content(name, "name")]]
        writes += profile_writes(key, "static", static) + profile_writes(key, "dynamic", dynamic)
        if not writes and self.get_profile(*key) is None:
            writes = [["prof", key, profile_field("dynamic", "lastSeen"), json.dumps(self._wall())]]
        if writes:
            _, seen = self._first_seen(key[0], self._wall())
            self._set(seen + writes)
        profile = self.get_profile(*key)
        assert profile is not None
        return profile

    def set_summary(self, orchestrator_id: str, summary: str, instance_id: str | None = None,
                    end_of_day_index: str | None = None) -> Profile:
        """VantagePeers' live status: ``dynamic.currentTask`` = ``summary`` and ``dynamic.lastSeen``
        = now (and ``dynamic.endOfDayIndex`` if given) on the role's or the instance's profile."""
        dynamic: dict[str, object] = {"currentTask": check_content(summary, "summary"), "lastSeen": self._wall()}
        if end_of_day_index is not None:
            dynamic["endOfDayIndex"] = check_content(end_of_day_index, "endOfDayIndex")
        return self.update_profile(orchestrator_id, dynamic=dynamic, instance_id=instance_id)

    def get_profile(self, orchestrator_id: str, instance_id: str | None = None) -> Profile | None:
        """A role's profile (or one instance's), or None if there is none."""
        pid = join_key(register_key("prof", self._profile_key(orchestrator_id, instance_id)))
        with self._store.read() as cur:
            rows = cur.execute(f"{_PROFILE} WHERE p.id = ?", (pid,)).fetchall()
        return _profile(rows) if rows else None

    def list_profiles(self) -> list[Profile]:
        """Every profile, roles' and instances', by role then instance (matching keys). Read again
        only after a commit (``_remembered``): the profiles are shared, not to be changed."""
        return list(self._remembered("profiles", self._read_profiles))

    def _read_profiles(self) -> list[Profile]:
        with self._store.read() as cur:
            rows = cur.execute(f"{_PROFILE} ORDER BY p.rkey, p.ikey").fetchall()
        by_id: dict[str, list[Any]] = {}
        for r in rows:
            by_id.setdefault(r[0], []).append(r)
        return [_profile(group) for group in by_id.values()]

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
