"""Routing: who sees a message (pure rules and the replica's inbox query agree)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replica import InvalidArgument, Replica, firstseen
from replica.names import name_key
from replica.routing import DAY_MS, Envelope, broadcast_floor, parse_channel, visible_to
from tests.conftest import pull


def inbox(r: Replica, role: str, inst: str | None = None) -> list[str]:
    return [m.content for m in r.check_messages(role, inst).messages]


def test_parse_channel_trims_dedupes_and_absorbs_broadcast() -> None:
    """Comma lists are trimmed and de-duplicated; 'broadcast' anywhere means broadcast."""
    assert parse_channel(" tau , phi,tau,, ") == ("tau", "phi")
    assert parse_channel("tau, broadcast") == ("broadcast",)
    assert parse_channel(" , ") == ()


def test_direct_message_reaches_only_its_role(mem: Replica) -> None:
    """A message to one role is seen by that role and nobody else."""
    mem.send_message("alpha", "beta", "hi beta")
    assert inbox(mem, "beta") == ["hi beta"]
    assert inbox(mem, "gamma") == []
    assert inbox(mem, "alpha") == []


def test_role_list_reaches_each_listed_role(mem: Replica) -> None:
    """'tau, phi' reaches tau and phi, each with its own receipt."""
    mem.send_message("alpha", "tau, phi", "to both")
    tau = mem.check_messages("tau").messages
    phi = mem.check_messages("phi").messages
    assert [m.content for m in tau] == ["to both"] and [m.content for m in phi] == ["to both"]
    assert tau[0].receipt_id != phi[0].receipt_id
    assert inbox(mem, "rho") == []


def test_broadcast_reaches_every_role_but_not_sender_instance(mem: Replica) -> None:
    """A broadcast reaches every role, even one never seen before, but not its sender."""
    mem.send_message("alpha", "broadcast", "all hands", from_instance_id="a1")
    assert inbox(mem, "beta") == ["all hands"]
    assert inbox(mem, "brand-new-role") == ["all hands"]
    assert inbox(mem, "alpha", "a1") == []
    assert inbox(mem, "alpha", "a2") == ["all hands"]


def test_broadcast_reaches_role_whose_profile_appears_later(mem: Replica) -> None:
    """A role that registers a profile after the broadcast still gets it."""
    mem.send_message("alpha", "broadcast", "early news")
    mem.update_profile("late", name="Late Role")
    assert inbox(mem, "late") == ["early news"]


def test_instance_target_reaches_only_that_instance(mem: Replica) -> None:
    """With a target instance, only that instance of the role sees the message."""
    mem.send_message("alpha", "beta", "just b2", instance_id="b2")
    assert inbox(mem, "beta", "b1") == []
    assert inbox(mem, "beta") == []
    assert inbox(mem, "beta", "b2") == ["just b2"]


def test_untargeted_message_gives_each_instance_its_own_receipt(mem: Replica) -> None:
    """Every instance of a role sees an untargeted message and reads it independently."""
    mem.send_message("alpha", "beta", "for all betas")
    b1 = mem.check_messages("beta", "b1").messages
    b2 = mem.check_messages("beta", "b2").messages
    assert b1[0].receipt_id != b2[0].receipt_id
    mem.mark_as_read([b1[0].receipt_id])
    assert inbox(mem, "beta", "b1") == []
    assert inbox(mem, "beta", "b2") == ["for all betas"]


def test_sender_own_instance_not_served_its_message_to_own_role(mem: Replica) -> None:
    """Sending to one's own role reaches sibling instances but not oneself."""
    mem.send_message("beta", "beta", "note to the team", from_instance_id="b1")
    assert inbox(mem, "beta", "b1") == []
    assert inbox(mem, "beta", "b2") == ["note to the team"]


def test_names_match_whatever_their_case_or_unicode_form(mem: Replica) -> None:
    """"TAU" reaches tau, "tau, TAU" is one role, a decomposed "hélios" is "HÉLIOS", BROADCAST is broadcast."""
    assert parse_channel(" tau , TAU, Phi") == ("tau", "Phi")
    assert parse_channel("tau, BroadCast") == ("broadcast",)
    mem.send_message("alpha", "TAU", "upper")
    mem.send_message("alpha", "he\u0301lios", "decomposed")
    mem.send_message("ALPHA", "alpha, Beta", "to a list", from_instance_id="A1")
    mem.send_message("alpha", "BROADCAST", "everyone")
    assert inbox(mem, "tau") == ["upper", "everyone"]
    assert inbox(mem, "HÉLIOS") == ["decomposed", "everyone"]
    assert inbox(mem, "beta") == ["to a list", "everyone"]
    assert inbox(mem, "Alpha", "a1") == ["everyone"]  # "to a list" came from ALPHA/A1: itself
    assert inbox(mem, "alpha") == ["to a list"]  # "everyone" came from alpha with no instance: itself


def test_a_channel_entry_naming_an_instance_reaches_that_instance(mem: Replica) -> None:
    """VantagePeers' instance DM: channel "sigma-vps" reaches role sigma's instance sigma-vps only."""
    mem.send_message("alpha", "sigma-vps", "to the vps")
    mem.send_message("alpha", "kappa, Sigma-VPS", "to kappa and the vps")
    assert inbox(mem, "sigma", "sigma-vps") == ["to the vps", "to kappa and the vps"]
    assert inbox(mem, "sigma", "sigma-laptop") == []
    assert inbox(mem, "sigma") == []
    assert inbox(mem, "kappa") == ["to kappa and the vps"]
    assert inbox(mem, "other", "sigma-vps") == []  # the address names sigma's instance, not other's


names = st.sampled_from(["a", "A", "b", "É", "e\u0301"])
insts = st.one_of(st.none(), st.sampled_from(["1", "I", "a-1", "A-1", "b-x"]))
channels = st.sampled_from(["a", "A", "b", "a,b", "b, É", "e\u0301, a", "a-1", "B-x, É", "broadcast", "BROADCAST"])


@given(sender=names, sender_inst=insts, channel=channels, target=insts, role=names, inst=insts)
def test_inbox_query_matches_pure_rule(
    sender: str, sender_inst: str | None, channel: str, target: str | None, role: str, inst: str | None
) -> None:
    """The SQL inbox query returns a message exactly when the pure routing rule says so, whatever the
    case and Unicode form of the names."""
    with Replica.open() as r:
        r.send_message(sender, channel, "x", instance_id=target, from_instance_id=sender_inst)
        expected = visible_to(Envelope(sender, sender_inst, channel, target), role, inst)
        assert (len(r.check_messages(role, inst).messages) == 1) == expected


DAY = DAY_MS
BASE = 1_800_000_000_000  # a wall time (ms) the clock of these tests starts from

envelopes = st.builds(Envelope, sender=names, sender_instance=insts, channel=channels, target_instance=insts,
                      thread=st.none(), created_ms=st.just(0))


@given(sent=st.lists(st.tuples(envelopes, st.integers(0, 30 * DAY)), min_size=1, max_size=8), role=names, inst=insts,
       history_days=st.integers(0, 10), profile_at=st.one_of(st.none(), st.integers(0, 40 * DAY)),
       check_at=st.integers(0, 40 * DAY), data=st.data())
def test_both_inbox_queries_match_pure_rule_over_many_messages(
    sent: list[tuple[Envelope, int]], role: str, inst: str | None, history_days: int, profile_at: int | None,
    check_at: int, data: st.DataObject,
) -> None:
    """The unread inbox and the whole inbox (read ones too, latest ``limit``) hold exactly the
    messages the pure rule shows (role, inst), in arrival order, whatever is read: broadcasts only
    from the history before the role was first seen (its first message, profile or check)."""
    sent = sorted(sent, key=lambda s: s[1])  # a replica's messages are created in clock order
    clock = [BASE]
    with Replica.open(wall=lambda: clock[0], broadcast_history_ms=history_days * DAY) as r:
        for i, (e, at) in enumerate(sent):
            clock[0] = BASE + at
            r.send_message(e.sender, e.channel or "", str(i), instance_id=e.target_instance,
                           from_instance_id=e.sender_instance)
        sightings = [firstseen.Sighting(name_key(e.sender), BASE + at, firstseen.SENT) for e, at in sent]
        if profile_at is not None:  # a wall clock never runs back behind the replica's hybrid clock
            clock[0] = max(clock[0], BASE + profile_at)
            r.update_profile(role, name="R")
            sightings.append(firstseen.Sighting(name_key(role), clock[0], firstseen.PROFILE))
        clock[0] = max(clock[0], BASE + check_at)
        first = firstseen.first_times(firstseen.merge({}, sightings)).get(name_key(role), clock[0])  # else now
        floor = broadcast_floor(first, history_days * DAY)
        visible = [str(i) for i, (e, at) in enumerate(sent)
                   if visible_to(e._replace(created_ms=BASE + at), role, inst, floor)]
        unread = r.check_messages(role, inst).messages
        assert [m.content for m in unread] == visible
        read = data.draw(st.lists(st.sampled_from(unread), unique=True), label="read") if unread else []
        if read:
            r.mark_as_read([m.receipt_id for m in read])
        done = {m.content for m in read}
        assert [m.content for m in r.check_messages(role, inst).messages] == [v for v in visible if v not in done]
        whole = r.inbox_all(role, inst).messages
        assert [m.content for m in whole] == visible
        assert {m.content for m in whole if m.read_at is not None} == done
        limit = data.draw(st.integers(1, 8), label="limit")
        assert [m.content for m in r.inbox_all(role, inst, limit=limit).messages] == visible[-limit:]


# -- broadcast history ------------------------------------------------------------------------------


def clocked(history_days: int = 7) -> tuple[Replica, list[int]]:
    clock = [BASE]
    return Replica.open(wall=lambda: clock[0], broadcast_history_ms=history_days * DAY), clock


def test_a_new_role_gets_recent_broadcasts_but_not_old_ones() -> None:
    """A role first seen now finds last week's broadcasts unread, not last month's; the old one
    stays in the log and in search."""
    r, clock = clocked()
    with r:
        r.send_message("lead", "broadcast", "merge freeze thursday")
        clock[0] += 20 * DAY
        r.send_message("lead", "broadcast", "release on friday")
        clock[0] += 3 * DAY
        assert inbox(r, "newcomer") == ["release on friday"]
        assert [m.content for m in r.inbox_all("newcomer").messages] == ["release on friday"]
        assert [m.content for m in r.message_log().messages] == ["merge freeze thursday", "release on friday"]
        assert [h.content for h in r.search_messages("freeze")] == ["merge freeze thursday"]


def test_first_check_fixes_the_roles_history_for_later_checks() -> None:
    """The first check records when the role was first seen, so a broadcast that was recent then
    stays in its inbox later (the window does not slide with the clock)."""
    r, clock = clocked()
    with r:
        r.send_message("lead", "broadcast", "hello all")
        clock[0] += 6 * DAY
        assert inbox(r, "ops") == ["hello all"]  # delivered, not read
        clock[0] += 30 * DAY
        assert inbox(r, "ops") == ["hello all"]
        assert inbox(r, "other") == []  # first seen only now


def test_role_first_seen_by_a_profile_or_a_message_gets_the_broadcasts_of_then() -> None:
    """A role whose profile was set, or that sent a message, long ago keeps the broadcasts of the
    week before that, whenever it first checks."""
    r, clock = clocked()
    with r:
        r.send_message("lead", "broadcast", "kickoff")
        clock[0] += 2 * DAY
        r.update_profile("planner", name="Planner")
        r.send_message("coder", "lead", "ready")
        clock[0] += 60 * DAY
        assert inbox(r, "planner") == ["kickoff"]
        assert inbox(r, "coder") == ["kickoff"]


def test_broadcast_reaches_role_whose_profile_appears_within_the_history() -> None:
    """DESIGN: a broadcast reaches a role whose profile appeared after it was sent (within the history)."""
    r, clock = clocked(history_days=1)
    with r:
        r.send_message("lead", "broadcast", "news")
        clock[0] += DAY - 1
        r.update_profile("late", name="Late")
        clock[0] += 10 * DAY
        assert inbox(r, "late") == ["news"]
        assert [s.role for s in r.message_status(r.message_log().messages[0].id)] == ["late"]


def test_an_earlier_sighting_from_a_peer_brings_back_the_broadcasts_of_then() -> None:
    """Replica b first sees the role now; a peer that saw it a month earlier tells b so, and the
    broadcast of that time joins the role's inbox on b (first-seen times only move earlier)."""
    a, clock_a = clocked()
    b, clock_b = clocked()
    with a, b:
        a.send_message("lead", "broadcast", "old news")
        pull(b, a)
        clock_b[0] += 40 * DAY
        assert inbox(b, "ops") == []
        clock_a[0] += DAY
        assert inbox(a, "ops") == ["old news"]
        pull(b, a)
        assert inbox(b, "ops") == ["old news"]


def test_message_status_counts_only_roles_whose_inbox_holds_the_broadcast() -> None:
    """A broadcast's expected recipients are the roles with a profile that can see it."""
    r, clock = clocked()
    with r:
        r.update_profile("early", name="E")
        mid = r.send_message("lead", "broadcast", "old").id
        clock[0] += 30 * DAY
        r.update_profile("late", name="L")
        assert [s.role for s in r.message_status(mid)] == ["early"]


def test_broadcast_history_must_be_a_non_negative_int() -> None:
    """A bad history setting is refused when the replica is opened."""
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidArgument):
            Replica.open(broadcast_history_ms=bad)  # type: ignore[arg-type]


# -- unknown recipients ------------------------------------------------------------------------------


def test_recipient_check_names_roles_never_seen_and_suggests_known_ones(mem: Replica) -> None:
    """A role with no profile and no message sent is unknown, or unconfirmed if it only checked its
    inbox; confirmed roles come with the closest spelling first; a broadcast names no unknown role."""
    mem.update_profile("reviewer", name="R")
    mem.send_message("planner", "bob", "hi")  # bob is addressed, not seen
    mem.check_messages("coder")
    mem.send_message("qa", "planner", "hi")
    check = mem.recipient_check("bob, revewer, coder, qa")
    assert check.unknown_recipients == ("bob", "revewer", "coder") and check.unconfirmed == ("coder",)
    assert check.known_roles[0] == "reviewer" and set(check.known_roles) == {"planner", "qa", "reviewer"}
    assert mem.recipient_check("qa").to_dict() == {"unknown_recipients": (), "known_roles": (), "unconfirmed": ()}
    assert mem.recipient_check("broadcast").unknown_recipients == ()
    with pytest.raises(InvalidArgument):
        mem.recipient_check(" ")


def test_hint_puts_close_spellings_first_and_follows_what_is_known() -> None:
    """The hint is remembered, but per question: a role that becomes known changes the answer, and
    the cap holds."""
    known = ["coder", "planner", "reviewer"]
    assert firstseen.hint(["revewer"], known) == ["reviewer", "coder", "planner"]
    assert firstseen.hint(["revewer"], known) == ["reviewer", "coder", "planner"]  # asked again
    assert firstseen.hint(["revewer"], ["coder", "planner", "reveiwer", "reviewer"])[:2] == ["reviewer", "reveiwer"]
    assert firstseen.hint(["x"], [f"r{i}" for i in range(80)], cap=5) == ["r0", "r1", "r2", "r3", "r4"]
    out = firstseen.hint(["revewer"], known)
    out.append("mutated")  # a caller's list is its own: the remembered answer is not changed
    assert firstseen.hint(["revewer"], known) == ["reviewer", "coder", "planner"]


def test_an_instance_address_of_a_known_role_is_not_an_unknown_recipient(mem: Replica) -> None:
    """"sigma-vps" names an instance of a role this replica knows: no typo warning; "sigmx-vps" gets one."""
    mem.update_profile("Sigma", name="Sigma")
    assert mem.recipient_check("SIGMA-vps, sigma").unknown_recipients == ()
    assert mem.recipient_check("sigmx-vps").unknown_recipients == ("sigmx-vps",)
