"""Pure rules of pairing: verification and one-time codes, the pairing desk, durations, naming a
node to remove, the key ring, whether a home may move fleets, other fleets on the LAN."""

from __future__ import annotations

import argparse
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.cli.pairing import parse_duration
from peerd.config import Config, fleet_id, new_fleet_key
from peerd.errors import SealError
from peerd.keyring import MAX_PREVIOUS, derive
from peerd.lan import OtherFleets
from peerd.pairapi import resolve_node
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError
from peerd.pairing.desk import Desk, DeskError, Limiter
from peerd.pairing.guest import HomeState, may_enter
from peerd.seal import seal
from replica import InvalidArgument, NotFound

keys = st.binary(min_size=32, max_size=32)
nonces = st.binary(min_size=16, max_size=16)
fleets = st.text("0123456789abcdef", min_size=16, max_size=16)


# -- codes ----------------------------------------------------------------------------------------


@given(fleets, keys, keys, nonces, nonces)
def test_the_verification_code_is_six_stable_digits(fleet: str, a: bytes, b: bytes, na: bytes, nb: bytes) -> None:
    code = codes.verification_code(fleet, a, b, na, nb)
    assert len(code) == 6 and code.isdigit() and code == codes.verification_code(fleet, a, b, na, nb)


def test_the_verification_code_depends_on_every_input() -> None:
    """Varying any one input (fleet, either key, either nonce) spreads the code over the 10^6 values."""
    base = ["0123456789abcdef", os.urandom(32), os.urandom(32), os.urandom(16), os.urandom(16)]
    fresh = [lambda i: f"{i:016x}", lambda _i: os.urandom(32), lambda _i: os.urandom(32),
             lambda _i: os.urandom(16), lambda _i: os.urandom(16)]
    for position, make in enumerate(fresh):
        seen = set()
        for i in range(100):
            args = list(base)
            args[position] = make(i)
            seen.add(codes.verification_code(*args))
        assert len(seen) >= 95, (position, len(seen))


def test_codes_people_type_are_read_leniently() -> None:
    """Spaces, dashes, case and look-alike letters are forgiven; anything else is refused."""
    assert codes.parse_verification("123 456") == codes.parse_verification("123-456") == "123456"
    assert codes.parse_verification("12345") is None and codes.parse_verification("12345a") is None
    assert codes.parse_code("AB3D-EFGH") == "ab3defgh"
    assert codes.parse_code("ol1i abcd") == "0111abcd"
    assert codes.parse_code("abc") is None and codes.parse_code("abcd-efg!") is None


@given(st.text(codes.ALPHABET, min_size=8, max_size=8))
def test_a_shown_code_parses_back(code: str) -> None:
    assert codes.parse_code(codes.show_code(code)) == code


def test_a_new_code_avoids_ids_in_use() -> None:
    """Its id (first two characters) is never one already taken; only the alphabet is used."""
    taken = {a + b for a in codes.ALPHABET for b in codes.ALPHABET} - {"zz"}
    code = codes.new_code(taken)
    assert code[:2] == "zz" and all(c in codes.ALPHABET for c in code) and len(code) == codes.CODE_CHARS


@given(keys, keys, keys, fleets)
def test_pake_keys_are_distinct_and_bound_to_both_nodes(shared: bytes, a: bytes, b: bytes, fleet: str) -> None:
    cb, ca, box = codes.pake_keys(shared, a, b, fleet)
    assert len({cb, ca, box}) == 3
    if a != b:
        assert codes.pake_keys(shared, b, a, fleet) != (cb, ca, box)


def test_a_commitment_binds_the_nonce_and_the_joiner() -> None:
    j, n = os.urandom(32), os.urandom(16)
    assert codes.commit(j, n) == codes.commit(j, n)
    assert codes.commit(j, os.urandom(16)) != codes.commit(j, n) != codes.commit(os.urandom(32), n)


# -- the desk -------------------------------------------------------------------------------------


def test_the_desk_caps_pending_requests_overall_and_per_source() -> None:
    desk = Desk(max_pending=4, per_source=2, limiter=Limiter(burst=100))
    for i in range(2):
        desk.open_ask(os.urandom(32), f"n{i}", "10.0.0.1", b"c" * 32, 0.0)
    with pytest.raises(DeskError, match="from this address") as per:
        desk.open_ask(os.urandom(32), "n", "10.0.0.1", b"c" * 32, 0.0)
    for i in range(2):
        desk.open_ask(os.urandom(32), f"m{i}", f"10.0.0.{i + 2}", b"c" * 32, 0.0)
    with pytest.raises(DeskError, match="too many join requests waiting") as total:
        desk.open_ask(os.urandom(32), "n", "10.0.0.9", b"c" * 32, 0.0)
    assert per.value.status == total.value.status == 429 and len(desk.asks) == 4


def test_requests_expire_and_say_so() -> None:
    """Past ask_ttl a request is gone; asking for it says it expired (410), not 'unknown'."""
    desk = Desk(ask_ttl=10.0)
    ask = desk.open_ask(os.urandom(32), "n", "h", b"c" * 32, 0.0)
    desk.ask(ask.id, 9.9)
    with pytest.raises(DeskError, match="expired") as info:
        desk.ask(ask.id, 10.0)
    assert info.value.status == 410
    with pytest.raises(DeskError) as unknown:
        desk.ask(os.urandom(16), 10.0)
    assert unknown.value.status == 404


def test_a_reveal_must_match_the_commitment() -> None:
    desk = Desk()
    joiner, nonce = os.urandom(32), os.urandom(16)
    bad = desk.open_ask(joiner, "n", "h", codes.commit(joiner, nonce), 0.0)
    with pytest.raises(DeskError, match="does not match"):
        desk.reveal(bad.id, os.urandom(16), "f" * 16, os.urandom(32), 0.0)
    assert bad.id not in desk.asks
    good = desk.open_ask(joiner, "n", "h", codes.commit(joiner, nonce), 0.0)
    member = os.urandom(32)
    ask = desk.reveal(good.id, nonce, "f" * 16, member, 0.0)
    assert ask.code == codes.verification_code("f" * 16, member, joiner, ask.nonce_a, nonce)


def test_two_requests_showing_one_code_are_both_held_back() -> None:
    """A second request with the same code (someone passing for the first) makes the code ambiguous."""
    desk = Desk()
    for name in ("real", "fake"):
        j, n = os.urandom(32), os.urandom(16)
        ask = desk.open_ask(j, name, name, codes.commit(j, n), 0.0)
        desk.reveal(ask.id, n, "f" * 16, b"m" * 32, 0.0)
        ask.code = "123456"
    with pytest.raises(DeskError, match="2 requests show code 123 456") as info:
        desk.approve("123456", b"answer", 0.0)
    assert info.value.status == 409 and all(a.state == "waiting" for a in desk.asks.values())


def test_a_code_is_tried_at_most_max_attempts_times() -> None:
    desk = Desk(max_attempts=3)
    code = desk.add_code(60.0, 0.0)
    for _ in range(3):
        desk.try_code(code.id, 1.0)
    with pytest.raises(DeskError, match="tried 3 times") as info:
        desk.try_code(code.id, 1.0)
    assert info.value.status == 410


def test_a_code_expires() -> None:
    desk = Desk()
    code = desk.add_code(5.0, 0.0)
    with pytest.raises(DeskError, match="expired"):
        desk.try_code(code.id, 5.0)


def test_the_limiter_allows_a_burst_then_a_steady_rate() -> None:
    lim = Limiter(burst=3, rate=1.0)
    assert [lim.allow("a", 0.0) for _ in range(4)] == [True, True, True, False]
    assert lim.allow("b", 0.0)  # each source has its own bucket
    assert lim.allow("a", 1.0) and not lim.allow("a", 1.0)


# -- durations, naming nodes ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("2d", 172800),
                                               ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1m", "0", "soon", "1w"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_a_node_is_named_by_an_id_prefix_or_its_name() -> None:
    a, b = bytes.fromhex("ab" * 32), bytes.fromhex("ac" * 32)
    names = {a: "laptop", b: "desk"}
    assert resolve_node("abab", [a, b], names) == a
    assert resolve_node("Desk", [a, b], names) == b
    with pytest.raises(InvalidArgument, match="names 2 nodes"):
        resolve_node("a", [a, b], {a: "a", b: "a"})
    with pytest.raises(NotFound, match="known nodes: laptop"):
        resolve_node("tablet", [a, b], names)


# -- keys, homes, other fleets --------------------------------------------------------------------


def test_the_key_ring_seals_with_the_winning_key_and_opens_older_ones() -> None:
    k1, k2, k3 = new_fleet_key(), new_fleet_key(), new_fleet_key()
    ring = derive(k1, [], [k2, k3], k3, epoch=2)
    assert ring.current == k3 and ring.previous == (k2, k1) and ring.fleet_id == fleet_id(k3)
    assert ring.open(seal(k1, b"old"))[1] == k1 and ring.open(seal(k3, b"new")) == (b"new", k3)
    with pytest.raises(SealError):
        ring.open(seal(new_fleet_key(), b"stranger"))
    removed = derive(k1, [], [k2], None, epoch=2, removed=True)
    assert removed.current == k1 and removed.removed


def test_the_key_ring_keeps_a_bounded_past() -> None:
    old = [new_fleet_key() for _ in range(MAX_PREVIOUS + 5)]
    ring = derive(old[0], old[1:], [], None)
    assert len(ring.previous) == MAX_PREVIOUS and ring.current not in ring.previous


def test_a_home_moves_fleets_only_when_nothing_would_be_lost() -> None:
    cfg = Config(name="n", fleet_key=new_fleet_key())
    other = fleet_id(new_fleet_key())
    may_enter(HomeState(None, 0, 0), other, force=False)
    may_enter(HomeState(cfg, 5, 0), cfg.fleet_id, force=False)  # same fleet: always
    may_enter(HomeState(cfg, 0, 0), other, force=False)  # a fleet of one: nothing to lose
    with pytest.raises(PairingError, match="--force"):
        may_enter(HomeState(cfg, 2, 0), other, force=False)
    may_enter(HomeState(cfg, 2, 0), other, force=True)
    with pytest.raises(PairingError, match="key rotations"):
        may_enter(HomeState(cfg, 0, 1), other, force=True)


def test_other_fleets_are_told_once_and_reported_by_fleet() -> None:
    seen = OtherFleets()
    assert seen.saw("f1", "n1", "alpha", "10.0.0.1:7733", 0.0)
    assert not seen.saw("f1", "n2", None, "10.0.0.2:7733", 1.0)
    assert seen.saw("f2", "n3", "gamma", "10.0.0.3:7733", 2.0)
    report = seen.report(3.0)
    assert [r["fleet_id"] for r in report] == ["f2", "f1"]
    assert [n["address"] for n in report[1]["nodes"]] == ["10.0.0.2:7733", "10.0.0.1:7733"]
    seen.forget_fleets({"f1"})
    seen.gone("n3")
    assert seen.report(3.0) == []
