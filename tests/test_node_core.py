"""The node's decisions as pure code: the call table across a key rotation, the push queues, the
gossip schedule and the core's events and commands, with no network, clock or thread."""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from peerd import calling
from peerd.calling import CallBug, CaughtUp, Context, Deliver, Fail, Send, State, TellRotation, Told
from peerd.core import NodeCore, Say, StartDrain, StartRound, Wake
from peerd.errors import PeerError
from peerd.outbox import Outbox
from peerd.protocol import Learnt, Outcome, PeerRecord, RoundResult, answers
from peerd.schedule import Schedule

ME = b"me" * 4
MEMBER = Context(can_tell=True, removed=False)


def _run(*events: calling.Event, ctx: Context = MEMBER) -> list[calling.Action]:
    state, actions = State.SENT, []
    for event in events:
        state, action = calling.step(state, event, ctx)
        actions.append(action)
    assert state is State.DONE or not isinstance(actions[-1], Deliver | Fail)
    return actions


def test_a_reply_is_delivered_and_a_refusal_fails_with_its_reason() -> None:
    """The plain paths: one send, one answer."""
    assert _run(answers.Replied({"t": "same"})) == [Deliver({"t": "same"})]
    assert _run(answers.Refused("no")) == [Fail("refused our request: no")]
    assert _run(answers.Unreadable("garbled")) == [Fail("garbled")]


def test_a_peer_on_an_old_key_is_told_of_the_rotation_then_asked_again() -> None:
    """403 -> tell the rotation -> send again -> the reply; told nothing -> not in the same fleet."""
    assert _run(answers.WrongKey(), Told(True), answers.Replied({"t": "ok"})) == [
        TellRotation(), Send(), Deliver({"t": "ok"})]
    assert _run(answers.WrongKey(), Told(False)) == [TellRotation(), Fail(calling.WRONG_FLEET)]
    assert _run(answers.WrongKey(), ctx=Context(can_tell=False, removed=False)) == [Fail(calling.WRONG_FLEET)]
    assert _run(answers.WrongKey(), ctx=Context(can_tell=False, removed=True)) == [Fail(calling.REMOVED)]


def test_a_rotation_we_missed_is_applied_then_the_request_sent_again() -> None:
    """rekey -> catch up -> send again; a rotation that gives us no key ends it."""
    assert _run(answers.Rekey([b"op"]), CaughtUp(True), answers.Replied({"t": "ok"})) == [
        calling.CatchUp([b"op"]), Send(), Deliver({"t": "ok"})]
    assert _run(answers.Rekey([b"op"]), CaughtUp(False)) == [calling.CatchUp([b"op"]), Fail(calling.NO_KEY)]
    removed = Context(can_tell=True, removed=True)
    assert _run(answers.Rekey([]), CaughtUp(False), ctx=removed)[-1] == Fail(calling.REMOVED)


def test_a_request_is_sent_at_most_twice() -> None:
    """After the retry, a second 403 or rotation ends the request: no loop."""
    assert _run(answers.WrongKey(), Told(True), answers.WrongKey())[-1] == Fail(calling.WRONG_FLEET)
    assert _run(answers.Rekey([]), CaughtUp(True), answers.Rekey([]))[-1] == Fail(calling.NO_KEY)
    sends = [a for a in _run(answers.WrongKey(), Told(True), answers.WrongKey()) if isinstance(a, Send)]
    assert len(sends) == 1  # plus the first send, which starts every request


def test_an_event_a_state_does_not_expect_is_a_bug() -> None:
    """The table has no silent default: a reply while telling a rotation is a CallBug."""
    with pytest.raises(CallBug, match="telling on Replied"):
        calling.step(State.TELLING, answers.Replied({}), MEMBER)
    with pytest.raises(CallBug):
        calling.step(State.DONE, answers.WrongKey(), MEMBER)


@pytest.mark.parametrize(("status", "msg", "meaning"), [
    (200, {"t": "same"}, answers.Replied({"t": "same"})),
    (403, None, answers.WrongKey()),
    (400, {"t": "error", "e": "bad"}, answers.Refused("bad")),
    (200, {"t": "error", "e": "bad"}, answers.Refused("bad")),
    (503, {"t": "error", "e": "busy"}, answers.Refused("busy")),
    (200, {"t": "rekey", "o": [b"x"]}, answers.Rekey([b"x"])),
    (200, {"t": "rekey", "o": "nope"}, answers.Unreadable("answered with a malformed key rotation")),
    (400, {"t": "rekey", "o": [b"x"]}, answers.Refused("400")),
    (200, None, answers.Unreadable("sent an unreadable reply (HTTP 200): no body")),
])
def test_what_an_answer_means(status: int, msg: dict[str, object] | None, meaning: answers.Meaning) -> None:
    """Each status and body maps to one meaning; a rotation counts only on a 200."""
    assert answers.meaning(status, msg) == meaning


def test_the_outbox_batches_within_the_budget_and_caps_each_queue() -> None:
    """A drain starts once per idle queue; batches fit the budget (at least one op); past the cap
    the oldest ops go."""
    box = Outbox(limit=5, budget=10)
    assert box.add("p", [b"a" * 4, b"b" * 4]) is True
    assert box.add("p", [b"c" * 4]) is False  # a drain is on
    assert box.take("p") == [b"a" * 4, b"b" * 4] and box.take("p") == [b"c" * 4]
    assert box.take("p") is None and box.add("p", [b"d"]) is True  # the drain ended: the next add starts one
    box.add("p", [bytes([i]) for i in range(10)])
    assert box.queued("p") == 5 and box.take("p") == [bytes([i]) for i in range(5, 10)]
    box.add("q", [b"x" * 50])
    assert box.take("q") == [b"x" * 50]  # a single op over the budget still goes
    box.add("q", [b"y"])
    box.failed("q")
    assert box.take("q") is None


def test_the_schedule_backs_off_while_idle_and_snaps_back_when_busy() -> None:
    """1.5x per idle tick up to the cap, jittered +/-20 %; busy or woken: the base again."""
    sched = Schedule(1.0, 10.0, random.Random(7))
    waits = [sched.ticked(failing=False) for _ in range(8)]
    assert all(a < b for a, b in itertools.pairwise(waits[:5]))  # growing while idle (seeded jitter)
    assert 8.0 <= waits[-1] <= 12.0  # at the cap
    sched.busy()
    assert 0.8 <= sched.ticked(failing=False) <= 1.2
    sched.ticked(failing=False)
    sched.woken()
    assert sched.interval == 1.0
    assert 0.8 <= sched.ticked(failing=True) <= 1.2
    assert [Schedule(1, 1, random.Random()).exchange_due()] == [True]


def _core(**kw: object) -> NodeCore:
    return NodeCore(ME, fanout=2, budget=1 << 20, base=1.0, cap=15.0, rng=random.Random(1),
                    first_release_takes=lambda raws: [r for r in raws if r != b"newer"], **kw)  # type: ignore[arg-type]


def test_a_tick_starts_rounds_with_new_peers_and_never_with_a_busy_or_removed_one() -> None:
    """New candidates are tried at once; a peer in a round is not picked again; a removed one never."""
    core = _core()
    assert core.candidate("10.0.0.1", 1, "seed", node=b"a" * 8, wire=None, now=0.0) == [Wake()]
    core.candidate("10.0.0.2", 1, "seed", node=b"b" * 8, wire=None, now=0.0)
    rounds = core.tick(0.0)
    assert {c.peer.addr for c in rounds if isinstance(c, StartRound)} == {"10.0.0.1:1", "10.0.0.2:1"}
    assert all(c.exchange for c in rounds if isinstance(c, StartRound))  # the first tick exchanges too
    assert core.tick(0.1) == []  # both still in their rounds
    core.round_over(core.table.peers["10.0.0.1:1"], found_work=True)
    core.set_removed(frozenset({b"b" * 8}))
    core.round_over(core.table.peers["10.0.0.2:1"], found_work=False)
    assert [c.peer.addr for c in core.tick(0.2) if isinstance(c, StartRound)] == ["10.0.0.1:1"]


def _live(core: NodeCore, name: bytes, wire: frozenset[int] | None) -> None:
    addr = f"10.0.0.{name[0]}"
    core.candidate(addr, 1, "seed", node=name * 8, wire=wire, now=0.0)
    core.replied(core.table.peers[f"{addr}:1"], name * 8, 0.0)


def test_a_push_goes_to_live_peers_and_a_first_release_peer_gets_only_what_it_takes() -> None:
    """Push on write: one drain per idle peer; a wire-2 (or not yet known) peer's batch leaves out
    what it would refuse; a forward never goes back to its sender."""
    core = _core()
    _live(core, b"\x01", frozenset({2, 3}))
    _live(core, b"\x02", frozenset({2}))
    drains = core.push([b"mail", b"newer"], exclude=None)
    assert {c.peer.addr for c in drains if isinstance(c, StartDrain)} == {"10.0.0.1:1", "10.0.0.2:1"}
    assert core.outbox.take("10.0.0.1:1") == [b"mail", b"newer"]
    assert core.outbox.take("10.0.0.2:1") == [b"mail"]
    out = core.answered(Outcome({}, new=1, forward=[b"fwd"]), sender=b"\x02" * 8, now=1.0)
    assert Wake() in out and core.counters["forwarded_ops"] == 1
    assert core.outbox.queued("10.0.0.2:1") == 0 and core.outbox.queued("10.0.0.1:1") == 1


def test_failures_are_told_once_until_it_works_again() -> None:
    """A failing round is told once per streak, its recovery once; a bug of ours carries its traceback."""
    core = _core()
    _live(core, b"\x01", None)
    peer = core.table.peers["10.0.0.1:1"]
    first = core.round_failed(peer, PeerError("down"), 1.0)
    assert first == [Say(logging.WARNING, "sync with 10.0.0.1:1 failed: down")]
    assert core.round_failed(peer, PeerError("down"), 2.0) == []
    done = core.round_done(peer, RoundResult(same=True, ours={}), {}, {}, 3.0)
    assert done == [Say(logging.INFO, "sync: 10.0.0.1:1 works again")] and core.counters["rounds"] == 1
    bug = ValueError("oops")
    told = core.peer_failed(peer, "push", bug, 4.0)
    assert len(told) == 1 and told[0].exc is bug and core.counters["internal_errors"] == 1
    assert core.peer_failed(peer, "push", ValueError("again"), 5.0) == []


def test_an_exchange_teaches_peers_and_names() -> None:
    """Records become candidates (and wake the node); names go to the peers they name."""
    core = _core()
    _live(core, b"\x01", None)
    learnt = Learnt((PeerRecord("10.0.0.9", 7, b"\x09" * 8, "nine"),), ((b"\x01" * 8, "one"),))
    out = core.exchanged(core.table.peers["10.0.0.1:1"], learnt, 1.0)
    assert Wake() in out and "10.0.0.9:7" in core.table.peers
    assert core.table.peers["10.0.0.1:1"].name == "one"
    removed = _core()
    removed.set_removed(frozenset({b"\x09" * 8}))
    assert removed.candidate("10.0.0.9", 7, "exchange", node=b"\x09" * 8, wire=None, now=0.0) == []
