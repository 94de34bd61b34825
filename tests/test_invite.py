"""Invite tokens (single-use, expiring, no fleet key) and the issuer's records of them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.config import decode_fleet_key
from peerd.errors import ConfigError
from peerd.invite import (
    INVITE_PREFIX,
    MAX_ATTEMPTS,
    Invite,
    InviteRefused,
    check_record,
    issue,
    make_invite,
    parse_invite,
    records,
    redeem,
)
from peerd.pairing.codes import secret_digest

INV = Invite(b"i" * 8, b"s" * 16, 2_000_000_000, ("alpha.local:7733",), "0123456789abcdef")
TOKEN = make_invite(INV)


@given(st.binary(min_size=8, max_size=8), st.binary(min_size=16, max_size=16), st.integers(0, 2**40),
       st.lists(st.sampled_from(["10.0.0.1:7733", "box.lan:9", "[::1]:7000"]), min_size=1, unique=True))
def test_tokens_round_trip(iid: bytes, secret: bytes, expires: int, seeds: list[str]) -> None:
    """parse_invite gives back exactly what make_invite was given."""
    inv = Invite(iid, secret, expires, tuple(seeds), "0123456789abcdef")
    assert parse_invite(make_invite(inv)) == inv


def test_a_token_holds_no_fleet_key_and_survives_line_wraps() -> None:
    """The token is id, secret, expiry, seeds and fleet id; whitespace from mail wraps is ignored."""
    assert TOKEN.startswith(INVITE_PREFIX)
    wrapped = "\n  ".join(TOKEN[i : i + 20] for i in range(0, len(TOKEN), 20))
    assert parse_invite(wrapped) == INV


def test_an_old_token_with_the_key_inside_is_refused_clearly() -> None:
    """peerd1: tokens carried the fleet key; they are refused with the way forward."""
    with pytest.raises(ConfigError, match=r"old invite \(peerd1:\).*peerd join --lan"):
        parse_invite("peerd1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")


@pytest.mark.parametrize(("token", "reason"), [
    ("", "not a peerd invite"),
    ("hello", "not a peerd invite"),
    ("peerd9:abc", "not known to this peerd"),
    ("peerd2:!!!", "outside url-safe base64"),
    ("peerd2:AAAA", "damaged or incomplete"),
    ("peerd2:" + "A" * 5000, "too long"),
])
def test_malformed_tokens_say_what_is_wrong(token: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        parse_invite(token)


def test_a_damaged_token_is_caught_by_its_check() -> None:
    """Changing any one character of the body is reported as damage, never a wrong invite."""
    body = TOKEN[len(INVITE_PREFIX) :]
    for i in range(0, len(body) - 1, 7):
        char = "B" if body[i] != "B" else "C"
        with pytest.raises(ConfigError):
            parse_invite(INVITE_PREFIX + body[:i] + char + body[i + 1 :])


def test_a_token_is_not_a_fleet_key() -> None:
    with pytest.raises(ConfigError, match="this is an invite"):
        decode_fleet_key(TOKEN)


def test_check_record_names_each_refusal() -> None:
    """Unknown, used, expired and burnt records are refused with a status and a reason."""
    now = 1000.0
    cases = [
        (None, 404, "did not make"),
        ({"expires": 2000, "used": {"at": 900, "by": "bob"}}, 410, "used already \\(by bob"),
        ({"expires": 999}, 410, "expired"),
        ({"expires": 2000, "attempts": MAX_ATTEMPTS}, 410, "void"),
    ]
    for rec, status, reason in cases:
        with pytest.raises(InviteRefused, match=reason) as info:
            check_record(rec, now)
        assert info.value.status == status
    check_record({"expires": 2000, "used": None, "attempts": 0}, now)


def test_issue_records_a_digest_never_the_secret(tmp_path: Path) -> None:
    """The home keeps the secret's digest (mode 0600); the token alone holds the secret."""
    token, inv = issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=60)
    rec = records(tmp_path)[inv.id.hex()]
    assert rec["digest"] == secret_digest(inv.secret).hex() and inv.secret.hex() not in (tmp_path / "invites.json").read_text()
    assert (tmp_path / "invites.json").stat().st_mode & 0o777 == 0o600
    assert parse_invite(token) == inv


def test_issue_refuses_unreachable_seeds_and_silly_expiry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="listening address"):
        issue(tmp_path, ["0.0.0.0:7733"], "0123456789abcdef")
    with pytest.raises(ConfigError, match="lasts from"):
        issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=0)
    assert records(tmp_path) == {}


def test_redeem_is_single_use_even_when_two_joiners_race(tmp_path: Path) -> None:
    """Two threads redeem one invite at once: exactly one wins, the other is told it was used."""
    _token, inv = issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=60)
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def go(name: str) -> None:
        start.wait()
        try:
            redeem(tmp_path, inv.id, lambda digest: digest == secret_digest(inv.secret), name)
            outcomes.append("ok")
        except InviteRefused as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=go, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("ok") == 1, outcomes
    assert next(o for o in outcomes if o != "ok").startswith("this invite was used already (by ")


def test_a_wrong_proof_counts_and_enough_of_them_void_the_invite(tmp_path: Path) -> None:
    """Each wrong secret is an attempt; after MAX_ATTEMPTS even the right one is refused."""
    _token, inv = issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=60)
    for _ in range(MAX_ATTEMPTS):
        with pytest.raises(InviteRefused, match="does not match"):
            redeem(tmp_path, inv.id, lambda _d: False, "guesser")
    with pytest.raises(InviteRefused, match="void"):
        redeem(tmp_path, inv.id, lambda _d: True, "owner")


def test_records_long_expired_are_dropped(tmp_path: Path) -> None:
    """An invite expired for over a week leaves no record behind."""
    issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=60, now=time.time() - 9 * 86400)
    _token, fresh = issue(tmp_path, ["10.0.0.1:7733"], "0123456789abcdef", ttl=60)
    assert list(records(tmp_path)) == [fresh.id.hex()]
