"""Profiles as VantagePeers has them: static and dynamic objects, merged key by key across the fleet."""

from __future__ import annotations

import pytest

from replica import InvalidArgument, Replica
from tests.conftest import pull

DELTA_STATIC = {"role": "Spécialiste des pipelines de données", "workspace": "/home/user/projects",
                "capabilities": ["etl", "sql", "python"]}


def test_setting_one_key_keeps_every_other(mem: Replica) -> None:
    """dynamic.currentTask alone keeps dynamic.sessionCount and all of static; unknown keys are kept."""
    mem.update_profile("delta", name="Delta", static=DELTA_STATIC,
                       dynamic={"currentTask": "Configuration initiale", "lastSeen": 1, "sessionCount": 1})
    p = mem.update_profile("delta", dynamic={"currentTask": "ETL run", "mood": {"level": 3}})
    assert p.static == DELTA_STATIC
    assert p.dynamic == {"currentTask": "ETL run", "lastSeen": 1, "sessionCount": 1, "mood": {"level": 3}}
    assert mem.update_profile("delta", dynamic={"mood": None}).dynamic.get("mood") is None  # None removes a key


def test_concurrent_updates_of_different_keys_both_survive() -> None:
    """Two machines setting different keys of one profile at once keep both after sync, in either order."""
    a, b = Replica.open(), Replica.open()
    a.update_profile("delta", static=DELTA_STATIC, dynamic={"sessionCount": 1})
    pull(b, a)
    a.update_profile("delta", dynamic={"currentTask": "on a"})
    b.update_profile("delta", dynamic={"sessionCount": 2})
    pull(a, b)
    pull(b, a)
    for r in (a, b):
        p = r.get_profile("delta")
        assert p is not None
        assert (p.dynamic["currentTask"], p.dynamic["sessionCount"], p.static) == ("on a", 2, DELTA_STATIC)
    assert a.state_digest() == b.state_digest()


def test_names_match_by_key_and_keep_their_first_spelling() -> None:
    """"Delta" and "DELTA" are one profile; it shows the spelling of its first write on every replica."""
    a, b = Replica.open(wall=lambda: 10_000), Replica.open(wall=lambda: 20_000)
    b.update_profile("DELTA", name="later")
    a.update_profile("Delta", name="first")
    pull(a, b)
    pull(b, a)
    for r in (a, b):
        [p] = r.list_profiles()
        assert (p.orchestrator_id, p.name) == ("Delta", "later")  # first written: Delta; newest name: later
        assert r.get_profile("delta") == p == r.get_profile(" DELTA ")
    a.update_profile("Zoé", name="composed")
    zoe = a.get_profile("zoé")
    assert zoe is not None and a.get_profile("ZOE\u0301") == zoe and a.get_profile("zoe") is None


def test_instance_profiles_are_their_own(mem: Replica) -> None:
    """set_summary with an instance writes that instance's profile; the role's stays as it was."""
    mem.update_profile("alpha", dynamic={"currentTask": "role-wide"})
    inst = mem.set_summary("alpha", "Standardizing tool descriptions", "alpha-vps", "EOD-INDEX 2026-08-14")
    assert inst.instance_id == "alpha-vps" and inst.dynamic["currentTask"] == "Standardizing tool descriptions"
    assert inst.dynamic["endOfDayIndex"] == "EOD-INDEX 2026-08-14" and isinstance(inst.dynamic["lastSeen"], int)
    role = mem.get_profile("alpha")
    assert role is not None and role.dynamic["currentTask"] == "role-wide"
    assert [(p.orchestrator_id, p.instance_id) for p in mem.list_profiles()] == [("alpha", None), ("alpha", "alpha-vps")]
    assert mem.get_profile("alpha", "ALPHA-VPS") == inst
    assert inst.profile_id != role.profile_id and inst.profile_id.startswith("pf_")


def test_a_text_stands_for_role_or_current_task(mem: Replica) -> None:
    """A whole text (peerd's older profiles) is static.role or dynamic.currentTask."""
    p = mem.update_profile("old", static="runs CI", dynamic="waiting for shard 3")
    assert (p.static, p.dynamic) == ({"role": "runs CI"}, {"currentTask": "waiting for shard 3"})


def test_nothing_to_set_creates_a_missing_profile_only(mem: Replica) -> None:
    """With no field, a new profile is created (lastSeen now); an existing one is left untouched."""
    before = mem.max_lseq()
    p = mem.update_profile("newcomer")
    assert set(p.dynamic) == {"lastSeen"} and mem.max_lseq() == before + 1
    assert mem.update_profile("newcomer") == p and mem.max_lseq() == before + 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"static": {"capabilities": "etl"}}, "static.capabilities must be a list of strings"),
    ({"static": {"role": 5}}, "static.role must be a string"),
    ({"dynamic": {"sessionCount": -1}}, "dynamic.sessionCount must be an integer between 0"),
    ({"dynamic": {"sessionCount": 2**53}}, "dynamic.sessionCount must be an integer between 0"),
    ({"dynamic": {"lastSeen": float("nan")}}, "dynamic.lastSeen must be a Unix-ms time"),
    ({"dynamic": {"x": float("inf")}}, "must be a JSON value"),
    ({"dynamic": {"x": object()}}, "must be a JSON value"),
    ({"dynamic": {"a.b": 1}}, "without '.'"),
    ({"dynamic": {"": 1}}, "1 to 128 characters"),
    ({"static": ["role"]}, "static must be an object"),
    ({"dynamic": {"big": "x" * 900_001}}, "larger than 900000 bytes"),
])
def test_bad_profile_values_are_refused_and_change_nothing(mem: Replica, kwargs: dict[str, object], match: str) -> None:
    """VantagePeers' keys must have its types; values must be JSON; nothing is written on a bad call."""
    mem.update_profile("delta", name="Delta")
    before = mem.state_digest()
    with pytest.raises(InvalidArgument, match=match):
        mem.update_profile("delta", **kwargs)  # type: ignore[arg-type]
    assert mem.state_digest() == before


def test_a_change_too_large_for_one_op_is_refused(mem: Replica) -> None:
    """Keys that would make one op over 1 MiB are refused before anything is written (peers would refuse it)."""
    before = mem.state_digest()
    with pytest.raises(InvalidArgument, match="the limit is 1048576"):
        mem.update_profile("delta", dynamic={f"k{i}": "x" * 600_000 for i in range(2)})
    assert mem.state_digest() == before
