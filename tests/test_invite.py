"""Invite tokens: round trip, clear errors, and joining a home's config."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.config import decode_fleet_key, init_home, load_config, new_fleet_key
from peerd.errors import ConfigError
from peerd.home import config_path
from peerd.invite import INVITE_PREFIX, apply_invite, make_invite, parse_invite

KEY = bytes(range(32))
TOKEN = make_invite(KEY, "alpha.local:7733")


def test_round_trip() -> None:
    """parse_invite returns the key and seeds make_invite was given."""
    assert TOKEN.startswith(INVITE_PREFIX)
    assert parse_invite(TOKEN) == (KEY, ("alpha.local:7733",))


def test_several_seeds_are_canonical_and_deduplicated() -> None:
    """Seeds are stored canonically (default port, IPv6 brackets) without duplicates."""
    token = make_invite(KEY, ["10.0.0.1", "10.0.0.1:7733", "[::1]:9000"])
    assert parse_invite(token) == (KEY, ("10.0.0.1:7733", "[::1]:9000"))


def test_token_is_one_short_line() -> None:
    """A one-seed invite is a single line short enough to paste anywhere."""
    assert len(TOKEN) < 120
    assert TOKEN.isprintable()
    assert " " not in TOKEN


def test_whitespace_from_line_wrapping_is_ignored() -> None:
    """A token broken across lines by a mail or chat client still parses."""
    wrapped = "  " + TOKEN[:20] + "\n" + TOKEN[20:50] + " \r\n\t" + TOKEN[50:] + "\n"
    assert parse_invite(wrapped) == parse_invite(TOKEN)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "not a peerd invite: it should start with 'peerd1:'"),
        ("hello", "not a peerd invite"),
        ("peerd-fleet-AAAA", "not a peerd invite"),
        ("peerd9:" + TOKEN[7:], "invite format 'peerd9' is not known to this peerd"),
        (TOKEN[:-5], "damaged or incomplete"),
        (TOKEN[:8], "damaged or incomplete"),
        (TOKEN + "A", "damaged or incomplete"),
        (TOKEN[:-1] + "+", "characters outside url-safe base64"),
        (INVITE_PREFIX, "characters outside url-safe base64"),
        ("peerd1:" + "A" * 9000, "too long"),
    ],
)
def test_bad_tokens_say_what_is_wrong(token: str, message: str) -> None:
    """Each malformed token gets an error naming its defect."""
    with pytest.raises(ConfigError, match=message):
        parse_invite(token)


@given(st.data())
def test_any_single_character_change_is_detected(data: st.DataObject) -> None:
    """Changing one character of the token body never yields a different key or seeds."""
    index = data.draw(st.integers(len(INVITE_PREFIX), len(TOKEN) - 1), label="index")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    char = data.draw(st.sampled_from(alphabet).filter(lambda c: c != TOKEN[index]))
    with pytest.raises(ConfigError):
        parse_invite(TOKEN[:index] + char + TOKEN[index + 1 :])


def test_make_invite_refuses_unreachable_or_bad_seeds() -> None:
    """A listening-only address or a malformed seed cannot go into an invite."""
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0 is a listening address"):
        make_invite(KEY, "0.0.0.0:7733")
    with pytest.raises(ConfigError, match="seed 'box:x'"):
        make_invite(KEY, "box:x")
    with pytest.raises(ConfigError, match="32 bytes"):
        make_invite(KEY[:16], "box:1")


def test_invite_is_not_a_fleet_key() -> None:
    """Pasting an invite where a fleet key is expected points the user to join."""
    with pytest.raises(ConfigError, match="this is an invite"):
        decode_fleet_key(TOKEN)


def test_join_creates_home_with_key_and_seed(tmp_path: Path) -> None:
    """Joining a fresh home creates it, with the invite's key and seed in config.toml."""
    home = tmp_path / "new"
    cfg = apply_invite(home, TOKEN)
    assert (cfg.fleet_key, cfg.seeds) == (KEY, ("alpha.local:7733",))
    assert load_config(config_path(home)) == cfg


def test_join_same_fleet_adds_seeds_and_keeps_the_rest(tmp_path: Path) -> None:
    """Joining a home of the same fleet adds the seeds and keeps name and other settings."""
    init_home(tmp_path, name="beta", fleet_key=KEY)
    apply_invite(tmp_path, make_invite(KEY, "gamma:1"))
    cfg = apply_invite(tmp_path, TOKEN)
    assert cfg.name == "beta"
    assert cfg.seeds == ("gamma:1", "alpha.local:7733")
    assert load_config(config_path(tmp_path)) == cfg


def test_join_refuses_another_fleet_without_force(tmp_path: Path) -> None:
    """A home of another fleet is left untouched and the error says how to switch."""
    init_home(tmp_path, name="beta", fleet_key=new_fleet_key())
    before = config_path(tmp_path).read_bytes()
    with pytest.raises(ConfigError, match=r"already belongs to fleet .* --force"):
        apply_invite(tmp_path, TOKEN)
    assert config_path(tmp_path).read_bytes() == before


def test_join_with_force_switches_fleet(tmp_path: Path) -> None:
    """With force, the key is replaced, the old fleet's seeds dropped, the name kept."""
    home = tmp_path
    apply_invite(home, make_invite(new_fleet_key(), "old:1"))
    cfg = apply_invite(home, TOKEN, force=True)
    assert (cfg.fleet_key, cfg.seeds) == (KEY, ("alpha.local:7733",))
    assert load_config(config_path(home)) == cfg
