"""Membership as a CRDT on real replicas: whatever order membership ops and messages reach each
replica in, with duplicates and partitions, once every replica has exchanged everything through the
protocol's own rounds, every replica holds the same membership, the same fleet key and the same
messages, and nothing a removed node wrote above its cutoff (nor anything of a node nobody let in)
is held anywhere but on its own replica."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from peerd import protocol
from replica import InvalidArgument, NotFound, Replica
from replica import membership as mem
from replica.ops import parse_message_id

FLEET = "0" * 16
BUDGET = 4096


@dataclass
class World:
    """Replicas of one fleet (the first is its founder; every replica trusts it), and what each
    wrote: nodes ``0..n-1`` are let in by the founder up front unless ``outsiders`` says not."""

    reps: list[Replica]
    rnd: random.Random
    sent: dict[str, int] = field(default_factory=dict)  # message id -> writer index

    @classmethod
    def make(cls, n: int, outsiders: int, rnd: random.Random) -> World:
        reps = [Replica.open() for _ in range(n + outsiders)]
        founder = reps[0]
        for r in reps:
            r.set_fleet_roots(frozenset({founder.node_key}))
        for r in reps[1:n]:
            founder.admit_node(r.node_key, f"n{reps.index(r)}", FLEET)
        for r in reps[n:]:  # a node that holds the fleet key, and let itself in
            r.admit_node(r.node_key, "stranger", FLEET)
        return cls(reps, rnd)

    def close(self) -> None:
        for r in self.reps:
            r.close()

    # -- what nodes do ---------------------------------------------------------------------------------

    def act(self, step: tuple[str, int, int]) -> None:
        what, i, j = step
        me, other = self.reps[i % len(self.reps)], self.reps[j % len(self.reps)]
        try:
            if what == "send":
                self.sent[me.send_message(f"r{i}", "team", f"from {i}").id] = i % len(self.reps)
            elif what == "remove" and me is not other:
                me.remove_node(other.node_key, os.urandom(32), FLEET)
            elif what == "admit" and me is not other:
                me.admit_node(other.node_key, f"n{j}", FLEET)
            elif what == "rotate":
                me.rotate(os.urandom(32), FLEET)
            elif what == "deliver":
                self.deliver(me, other)
            elif what == "round" and me is not other:
                self.round(me, other)
        except (InvalidArgument, NotFound):
            pass  # a node that may not do this here (removed, not a member, not known): nothing written

    def deliver(self, src: Replica, dst: Replica) -> None:
        """Some of what ``src`` holds, in a shuffled order with repeats, as a partial push would bring."""
        held = [raw for _l, raw in src.ops_after(0, 100_000) if raw]
        batch = self.rnd.sample(held, self.rnd.randint(0, len(held))) if held else []
        batch += batch[: self.rnd.randint(0, len(batch))]
        self.rnd.shuffle(batch)
        for k in range(0, len(batch), 5):
            dst.apply(batch[k:k + 5])

    def round(self, a: Replica, b: Replica) -> None:
        """One round of the protocol's own, ``a`` asking ``b``."""
        protocol.drive(protocol.client_round(a, budget=BUDGET), lambda m: protocol.serve(b, m, BUDGET))

    # -- everything, everywhere ------------------------------------------------------------------------

    def exchange(self) -> None:
        """Rounds between every pair, the protocol's own, until nothing moves."""
        for _ in range(20):
            before = [(r.state_digest(), r.fleet_digest()) for r in self.reps]
            for a in self.reps:
                for b in self.reps:
                    if a is not b:
                        self.round(a, b)
            if [(r.state_digest(), r.fleet_digest()) for r in self.reps] == before:
                return
        raise AssertionError("rounds never settled")


steps = st.lists(st.tuples(st.sampled_from(["send", "send", "remove", "admit", "rotate", "deliver", "round"]),
                           st.integers(0, 5), st.integers(0, 5)), max_size=24)


def _held(rep: Replica) -> list[tuple[str, int]]:
    """(id, seq) of every message ``rep`` holds and shows (a retracted row shows none)."""
    out = []
    for m in rep.message_log(None, 1000).messages:
        parsed = parse_message_id(m.id)
        assert parsed is not None
        out.append((m.id, parsed[1]))
    return out


def _shown(rep: Replica, st_: mem.Standing, sent: dict[str, int], reps: list[Replica]) -> set[str]:
    """The messages ``rep`` holds that the standing lets count (its own barred ones are its own)."""
    out = set()
    for mid, seq in _held(rep):
        writer = reps[sent[mid]].node_key
        if writer == rep.node_key and mem.barred(st_, writer, seq, b""):
            continue
        out.add(mid)
    return out


@settings(max_examples=40)
@given(st.integers(2, 4), st.integers(0, 1), steps, st.randoms(use_true_random=False))
def test_every_replica_decides_alike_whatever_the_order(n: int, outsiders: int, plan: list[tuple[str, int, int]],
                                                        rnd: random.Random) -> None:
    """Random admissions, removals (mutual and cyclic among them), rotations and messages by members,
    removed nodes and a stranger holding the fleet key, delivered in pieces in random orders: after a
    full exchange, one membership, one key, one set of messages, and nothing barred held by another."""
    world = World.make(n, outsiders, rnd)
    try:
        for step in plan:
            world.act(step)
        world.exchange()
        standings = [r.fleet_view().standing for r in world.reps]
        first = standings[0]
        for s in standings[1:]:
            assert (s.removed, s.admitted, s.void, s.winner) == (first.removed, first.admitted, first.void,
                                                                 first.winner)
        shown = [_shown(r, first, world.sent, world.reps) for r in world.reps]
        assert all(s == shown[0] for s in shown[1:])
        for rep in world.reps:
            for mid, seq in _held(rep):
                writer = world.reps[world.sent[mid]].node_key
                assert writer == rep.node_key or not mem.barred(first, writer, seq, rep.node_key), (
                    f"{mid} is held by another replica though its writer is barred from it")
        if first.winner is not None:
            keys = {r.fleet_keys().current for r in world.reps if r.node_key in first.winner.entries}
            assert len(keys) == 1 and None not in keys
    finally:
        world.close()


def test_a_stranger_with_the_fleet_key_gets_nothing_stored() -> None:
    """An op of a node no member let in (it admitted itself) is refused: nothing of it but its
    membership ops, which count for nothing, is stored; once a member lets it in, it comes with the
    next round."""
    world = World.make(2, 1, random.Random(1))
    try:
        founder, member, stranger = world.reps
        stranger.send_message("deployer", "team", "rm -rf /")
        result = member.apply([raw for _l, raw in stranger.ops_after(0)])
        assert result.refused == 1 and result.new == 1  # the self-admit is kept, the message refused
        assert member.check_messages("team").messages == []
        world.exchange()
        assert all(r.check_messages("team").messages == [] for r in (founder, member))
        founder.admit_node(stranger.node_key, "now a member", FLEET)
        world.exchange()
        assert [m.content for m in member.check_messages("team").messages] == ["rm -rf /"]
    finally:
        world.close()
