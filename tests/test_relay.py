"""The return path's pure parts: its rules (``peerd.relaying``), its frames (``peerd.protocol.link``),
who gets pushes (``PeerTable.push_targets``), and the peer port's addresses (``peerd.linkio``)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.cli.format import relay_lines
from peerd.core import NodeCore, StartDrain, Wake
from peerd.doctor import relay_finding
from peerd.errors import DaemonError
from peerd.linkio import plain_address
from peerd.peers import Peer, PeerTable
from peerd.protocol import Envelope, ProtocolError, encode, link, stamp
from peerd.relaying import (
    REFUSED_WAIT,
    STEADY,
    Candidate,
    Connect,
    Drop,
    Held,
    Relays,
    backoff,
    reachability,
)
from peerd.transport import Answer, Channel, HttpTransport

ME = b"m" * 8


def cands(*names: str, source: str = "seed") -> list[Candidate]:
    return [Candidate(f"{n}:1", n.encode().ljust(8, b"_"), source) for n in names]


def test_the_config_decides_reachability_before_any_probe() -> None:
    assert reachability(False, True) is False
    assert reachability(True, False) is True
    assert reachability("auto", None) is None
    assert reachability("auto", False) is False


def test_links_open_only_when_needed_and_to_at_most_two_members() -> None:
    r = Relays(random.Random(1))
    assert r.plan(0.0, cands("s", "p", "q")) == []
    r.set_need(True)
    first = r.plan(0.0, cands("s", "p", "q"))
    assert len(first) == 2
    assert r.plan(0.0, cands("s", "p", "q")) == []  # two are connecting already
    for c in first:
        r.up(c.addr, 1.0)
    assert {t.addr for t in r.via()} == {c.addr for c in first}
    assert set(r.set_need(False)) == {Drop(c.addr) for c in first}
    assert r.plan(2.0, cands("s", "p", "q")) == []


def test_seeds_are_preferred_and_a_dead_relay_is_replaced_by_another_at_once() -> None:
    r = Relays(random.Random(2), want=1)
    r.set_need(True)
    pool = [*cands("x", source="exchange"), *cands("s")]
    assert r.plan(0.0, pool) == [Connect("s:1")]
    r.up("s:1", 0.0)
    r.down("s:1", 5.0, "the member stops")
    assert r.plan(5.0, pool) == [Connect("x:1")]  # s waits its backoff; x at once


def test_a_link_that_held_is_opened_again_at_once_and_one_that_ends_early_backs_off() -> None:
    """A lost NAT mapping closes a link that worked: its member is linked again with no wait; if
    that fails, or a link ends soon after it came up (a member that flaps), the backoff applies."""
    r = Relays(random.Random(4), want=1)
    r.set_need(True)
    pool = [*cands("x", source="exchange"), *cands("s")]
    assert r.plan(0.0, pool) == [Connect("s:1")]
    r.up("s:1", 0.0)
    r.down("s:1", STEADY, "link lost: connection reset")
    assert r.next_due(STEADY) == 0.0
    assert r.plan(STEADY, pool) == [Connect("s:1")]  # the same member, at once
    r.down("s:1", STEADY + 0.01, "cannot link: connection refused")
    assert r.plan(STEADY + 0.01, pool) == [Connect("x:1")]  # s waits its backoff now; x at once
    r.up("x:1", 20.0)
    r.down("x:1", 20.0 + STEADY / 2, "closed")
    assert r.targets["x:1"].next_try - (20.0 + STEADY / 2) >= 0.8 * backoff(1) > 0


@given(st.lists(st.sampled_from(["up", "down", "refused", "plan"]), max_size=40), st.integers(0, 2**16))
def test_never_more_links_than_wanted_nor_two_to_one_member(steps: list[str], seed: int) -> None:
    rng = random.Random(seed)
    r = Relays(rng)
    r.set_need(True)
    pool = [*cands("s", "p", "q"), Candidate("s2:1", b"s_______", "exchange")]  # s at a second address
    now = 0.0
    for step in steps:
        now += rng.uniform(0, 40)
        targets = list(r.targets.values())
        if step == "plan" or not targets:
            r.plan(now, pool)
        else:
            t = rng.choice(targets)
            if step == "up" and t.connecting:
                r.up(t.addr, now)
            elif step in ("down", "refused") and (t.up or t.connecting):
                r.down(t.addr, now, "gone", refused=step == "refused")
        active = r.active()
        assert len(active) <= r.want
        assert len({t.node for t in active}) == len(active)
        assert not any(t.up and t.connecting for t in r.targets.values())


def test_backoff_grows_to_a_cap_and_a_refusal_waits_longer() -> None:
    assert backoff(0) == 0.0
    assert backoff(1) < backoff(3) <= backoff(50) <= 60.0
    assert backoff(1, refused=True) >= REFUSED_WAIT


def test_held_links_stay_within_the_caps_and_a_member_linking_again_replaces_its_link() -> None:
    held = Held(per_source=2, total=3)
    assert held.admit(b"a" * 8, "10.0.0.1") is None
    assert held.admit(b"b" * 8, "10.0.0.1") is None
    assert held.admit(b"c" * 8, "10.0.0.1") == "this member relays for 2 members at 10.0.0.1 already"
    assert held.admit(b"a" * 8, "10.0.0.1") is None  # again: replaces, takes no second place
    assert held.admit(b"d" * 8, "10.0.0.2") is None
    assert held.admit(b"e" * 8, "10.0.0.3") == "this member relays for 3 members already"
    held.release(b"a" * 8)
    assert held.admit(b"e" * 8, "10.0.0.3") is None
    assert held.admit(b"z" * 8, "x") is not None and len(held.links) == 3


def test_members_we_relay_for_get_every_push_beside_the_fanout() -> None:
    table = PeerTable(ME, random.Random(3))
    for i in range(10):
        peer = table.add(f"10.0.0.{i}", 7733, "seed", bytes([i]) * 8)
        assert peer is not None
        table.succeeded(peer, 1.0, None)
    linked = frozenset({bytes([7]) * 8, bytes([8]) * 8})
    for _ in range(20):
        targets = table.push_targets(2, always=linked)
        assert {p.node for p in targets} >= linked and len(targets) == 4
    assert bytes([7]) * 8 not in {p.node for p in table.push_targets(2, exclude=bytes([7]) * 8, always=linked)}


@given(st.integers(0, link.MAX_ID), st.integers(100, 599), st.binary(max_size=64))
def test_frames_read_back_as_written(rid: int, status: int, body: bytes) -> None:
    assert link.parse_frame(link.call(rid, body)) == link.Call(rid, body)
    assert link.parse_frame(link.answer(rid, status, body)) == link.Reply(rid, status, body)
    assert link.parse_frame(link.hello(body)) == link.Hello(body)


@pytest.mark.parametrize("data", [b"", b"\x02\x00", b"\x03\x00\x00\x00\x01\x00", b"\x09abc"])
def test_frames_that_are_none_of_ours_are_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        link.parse_frame(data)


def test_a_hello_names_its_member_and_port() -> None:
    env = link.read_hello(encode(stamp(link.link_message(), me=ME, port=7733)))
    assert (env.sender, env.port) == (ME, 7733)
    with pytest.raises(ProtocolError):
        link.read_hello(encode({"t": "link"}))
    assert link.close_reason(link.FULL, "this member relays for 2 members already").startswith("relay full: ")


def test_ipv4_callers_on_the_dual_stack_port_are_told_as_ipv4() -> None:
    assert plain_address("::ffff:10.77.1.2") == "10.77.1.2"
    assert plain_address("fd77:1::11") == "fd77:1::11"
    assert plain_address("10.0.0.1") == "10.0.0.1"
    assert plain_address("") == ""


RELAYED = {"reachable": False, "setting": "auto", "relaying_for": [], "waiting": [],
           "via": [{"address": "10.0.0.1:7733", "node_id": "ab" * 8, "name": "server", "up_for": 3.0}]}


def test_status_and_doctor_say_who_relays_for_whom() -> None:
    assert relay_lines(RELAYED) == ["reach   other members cannot call this one",
                                    "relay   relayed by server (10.0.0.1:7733): they push to this member down its links"]
    lonely = {**RELAYED, "via": [], "waiting": [{"address": "10.0.0.1:7733", "last_error": "relay full: 32"}]}
    finding = relay_finding(lonely)
    assert finding is not None and finding.status == "warn" and "relay full: 32" in finding.detail
    server = {"reachable": True, "setting": "auto", "via": [], "waiting": [],
              "relaying_for": [{"address": "192.0.2.7:7733", "node_id": "cd" * 8, "name": "laptop"}]}
    assert getattr(relay_finding(server), "detail", None) == "other members can call this one; relaying for laptop"
    assert relay_finding({**server, "relaying_for": []}) is None
    assert relay_lines(server) == ["reach   other members can call this one",
                                   "relay   relaying for laptop (192.0.2.7:7733)"]
    assert relay_lines({**server, "relaying_for": []}) == []
    assert relay_lines({**RELAYED, "setting": False})[0].endswith("(reachable in config.toml)")


def test_a_linked_member_is_reachable_through_its_link_and_gets_every_push_until_it_unlinks() -> None:
    core = NodeCore(ME, fanout=1, budget=1 << 20, base=1.0, cap=15.0, rng=random.Random(1),
                    first_release_takes=list)
    for i in range(5):
        core.candidate(f"10.0.0.{i}", 7733, "seed", node=bytes([i]) * 8, wire=frozenset({3}), now=0.0)
        core.table.succeeded(core.table.peers[f"10.0.0.{i}:7733"], 0.0, None)
    laptop = b"L" * 8
    cmds = core.linked("192.0.2.9", Envelope(sender=laptop, port=7733, wire=frozenset({3})), 1.0)
    assert Wake() in cmds and core.relayed == {laptop: "192.0.2.9:7733"}
    assert core.table.peers["192.0.2.9:7733"].reachable
    lap = core.table.peers["192.0.2.9:7733"]

    def pushed_to(raw: bytes, exclude: bytes | None = None) -> list[Peer]:
        drains = [d for d in core.push([raw], exclude=exclude) if isinstance(d, StartDrain)]
        for d in drains:
            while core.outbox.take(d.peer.addr) is not None:  # each drain done before the next push
                pass
        return [d.peer for d in drains]

    for n in range(10):
        targets = pushed_to(b"op%d" % n)
        assert lap in targets and len(targets) == 2  # the fanout's one, and the linked member
    assert lap not in pushed_to(b"x", exclude=laptop)  # what it sent is not sent back
    core.fanout = 0
    assert pushed_to(b"y") == []  # push_fanout = 0: no pushes, linked members included
    core.fanout = 1
    core.unlinked(laptop, "closed")
    assert core.relayed == {}
    assert sum(lap in pushed_to(b"z%d" % n) for n in range(30)) < 30  # one live peer among six again


class _Recorder:
    """A transport ``Server`` that remembers who called."""

    def __init__(self) -> None:
        self.remotes: list[str] = []

    async def answer(self, body: bytes, remote: str) -> Answer:
        self.remotes.append(remote)
        return Answer(200, b"ok")

    async def join(self, body: bytes, remote: str) -> Answer:
        return Answer(404, b"")

    def refuse(self, remote: str, why: str) -> None:
        pass

    async def link(self, channel: Channel, remote: str) -> None:
        pass


async def test_the_peer_port_takes_ipv4_and_ipv6_callers_by_default_and_names_a_taken_port() -> None:
    server, rec = HttpTransport(max_body=1024, total=5), _Recorder()
    port = await server.listen(rec, "::", 0)
    client = HttpTransport(max_body=1024, total=5)
    try:
        assert (await client.post(f"127.0.0.1:{port}", b"x")).body == b"ok"
        assert (await client.post(f"[::1]:{port}", b"x")).body == b"ok"
        assert rec.remotes == ["127.0.0.1", "::1"]
        with pytest.raises(DaemonError, match=rf"cannot listen for peers on \[::\]:{port}: .*in use"):
            await HttpTransport(max_body=1024, total=5).listen(rec, "::", port)
    finally:
        await client.close()
        await server.close()


def test_a_link_to_a_member_learnt_second_hand_gives_way_to_a_seed() -> None:
    r = Relays(random.Random(4), want=1)
    r.set_need(True)
    other = cands("x", source="exchange")
    assert r.plan(0.0, other) == [Connect("x:1")]
    r.up("x:1", 0.0)
    assert r.plan(1.0, other) == []
    assert r.plan(2.0, [*other, *cands("s")]) == [Drop("x:1")]
    r.down("x:1", 2.0, "dropped for a seed")
    assert r.plan(2.0, [*other, *cands("s")]) == [Connect("s:1")]
    r.up("s:1", 2.5)
    assert r.plan(3.0, [*other, *cands("s")]) == []  # no flapping back
