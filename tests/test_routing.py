"""Routing: who sees a message (pure rules and the replica's inbox query agree)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from replica import Replica
from replica.routing import Envelope, parse_channel, visible_to


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


envelopes = st.builds(Envelope, sender=names, sender_instance=insts, channel=channels, target_instance=insts)


@given(sent=st.lists(envelopes, min_size=1, max_size=8), role=names, inst=insts, data=st.data())
def test_both_inbox_queries_match_pure_rule_over_many_messages(
    sent: list[Envelope], role: str, inst: str | None, data: st.DataObject
) -> None:
    """The unread inbox and the whole inbox (read ones too, latest ``limit``) hold exactly the
    messages the pure rule shows (role, inst), in arrival order, whatever is read."""
    with Replica.open() as r:
        for i, e in enumerate(sent):
            r.send_message(e.sender, e.channel or "", str(i), instance_id=e.target_instance,
                           from_instance_id=e.sender_instance)
        visible = [str(i) for i, e in enumerate(sent) if visible_to(e, role, inst)]
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
