"""Config, fleet key encoding and home folder: real files in a temporary folder."""

from __future__ import annotations

import os
import stat
import threading
import tomllib
from pathlib import Path

import platformdirs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.config import (
    DEFAULT_PORT,
    FLEET_KEY_PREFIX,
    Config,
    decode_fleet_key,
    encode_fleet_key,
    fleet_id,
    init_home,
    load_config,
    new_fleet_key,
    parse_seed,
    render_config,
    save_config,
    with_overrides,
)
from peerd.errors import ConfigError, DaemonError
from peerd.home import (
    HOME_ENV,
    config_path,
    read_daemon_json,
    remove_daemon_json,
    resolve_home,
    write_daemon_json,
)

KEY = bytes(range(32))


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'fleet_key = "{encode_fleet_key(KEY)}"\n' + body, encoding="utf-8")
    return path


# --- init / load / save --------------------------------------------------------------


def test_init_creates_home_and_config_that_loads_back(tmp_path: Path) -> None:
    """init_home creates the folder and a config.toml that load_config reads identically."""
    home = tmp_path / "a" / "home"
    cfg = init_home(home, name="alpha")
    assert cfg.name == "alpha"
    assert len(cfg.fleet_key) == 32
    assert load_config(config_path(home)) == cfg


def test_save_then_load_round_trips_every_field(tmp_path: Path) -> None:
    """A config with every field changed from its default survives save and load."""
    cfg = Config(
        name='odd "name" \\ with ünïcode ✓',
        fleet_key=KEY,
        port=9001,
        local_port=0,
        seeds=("10.0.0.5:7000", "[fe80::1]:7733", "box.local:1"),
        mdns=False,
        mdns_interfaces=("192.168.1.4", "10.0.0.2"),
        gossip_interval=0.25,
        gossip_max_interval=30.0,
        push_fanout=0,
        peer_connections_per_address=200,
        max_body_bytes=8 * 1024 * 1024,
        page_bytes=512 * 1024,
        max_content_bytes=1000,
    )
    path = tmp_path / "config.toml"
    save_config(path, cfg)
    assert load_config(path) == cfg


@given(st.text(min_size=1, max_size=64).filter(lambda s: s.strip() and s.isprintable()))
def test_any_valid_name_round_trips_through_toml(name: str) -> None:
    """The hand-written TOML escapes any printable name so tomllib reads it back unchanged."""
    cfg = Config(name=name, fleet_key=KEY)
    assert tomllib.loads(render_config(cfg))["name"] == name


def test_init_is_idempotent_and_keeps_the_file(tmp_path: Path) -> None:
    """A second init returns the existing config and leaves config.toml byte-identical."""
    first = init_home(tmp_path, name="alpha")
    before = config_path(tmp_path).read_bytes()
    assert init_home(tmp_path) == first
    assert init_home(tmp_path, name="alpha", fleet_key=first.fleet_key) == first
    assert config_path(tmp_path).read_bytes() == before


def test_init_uses_a_given_fleet_key(tmp_path: Path) -> None:
    """init_home with a fleet key writes that key rather than a random one."""
    assert init_home(tmp_path, fleet_key=KEY).fleet_key == KEY


def test_init_refuses_a_different_fleet_key(tmp_path: Path) -> None:
    """A given fleet key that differs from the existing one is an error, not an overwrite."""
    init_home(tmp_path, fleet_key=KEY)
    before = config_path(tmp_path).read_bytes()
    with pytest.raises(ConfigError, match="already belongs to fleet"):
        init_home(tmp_path, fleet_key=new_fleet_key())
    assert config_path(tmp_path).read_bytes() == before


def test_init_refuses_a_different_name(tmp_path: Path) -> None:
    """A name that differs from the existing config's name is reported, not ignored."""
    init_home(tmp_path, name="alpha")
    with pytest.raises(ConfigError, match="already named 'alpha'"):
        init_home(tmp_path, name="beta")


def test_racing_inits_agree_on_one_fleet_key(tmp_path: Path) -> None:
    """Threads initialising one home at once all end up with the same config."""
    results: list[Config] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(init_home(tmp_path / "home"))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.fleet_key for r in results}) == 1
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["config.toml", "local.token"]


def test_permissions_are_private(tmp_path: Path) -> None:
    """The home is 0700 and config.toml is 0600, even over an existing world-readable file."""
    home = tmp_path / "home"
    init_home(home)
    assert mode_of(home) == 0o700
    assert mode_of(config_path(home)) == 0o600
    path = tmp_path / "loose.toml"
    path.write_text("")
    path.chmod(0o644)
    save_config(path, load_config(config_path(home)))
    assert mode_of(path) == 0o600


def test_no_temporary_files_are_left_behind(tmp_path: Path) -> None:
    """Atomic writes clean up: the folder holds only the target files."""
    cfg = init_home(tmp_path)
    save_config(config_path(tmp_path), cfg)
    write_daemon_json(tmp_path, {"pid": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "daemon.json", "local.token"]


# --- load errors ---------------------------------------------------------------------


def test_missing_file_is_named(tmp_path: Path) -> None:
    """A missing config file is reported with its path and how to create it."""
    with pytest.raises(ConfigError, match=r"config\.toml: no config file; run `peerd init`"):
        load_config(tmp_path / "config.toml")


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    """A TOML syntax error is reported with the file name and the parser's position."""
    path = write_config(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigError, match=r"config\.toml: not valid TOML: .*line 2") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    """A misspelt key is named, with the closest known key suggested."""
    path = write_config(tmp_path, "prot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'prot' \(did you mean 'port'\?\)"):
        load_config(path)


def test_tables_are_unknown_keys(tmp_path: Path) -> None:
    """The config is flat: a [section] is reported as an unknown key."""
    path = write_config(tmp_path, "[gossip]\ninterval = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'gossip'"):
        load_config(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('port = "7733"', "port: expected an integer, got a string"),
        ("port = true", "port: expected an integer, got a boolean"),
        ("port = 70000", "port: must be from 0 to 65535, got 70000"),
        ("mdns = 1", "mdns: expected true or false, got an integer"),
        ('seeds = "a:1"', "seeds: expected a list of strings, got a string"),
        ("seeds = [1]", r"seeds\[0\]: expected a string, got an integer"),
        ('seeds = ["a:b"]', "seeds: seed 'a:b': port 'b' is not a number"),
        ("name = 3", "name: expected a string, got an integer"),
        ('name = ""', "name: must not be empty"),
        ('mdns_interfaces = "some"', "mdns_interfaces: expected 'all', 'default'"),
        ("mdns_interfaces = []", "mdns_interfaces: expected 'all', 'default'"),
        ('gossip_interval = "1s"', "gossip_interval: expected a number of seconds, got a string"),
        ("gossip_interval = -1", "gossip_interval: must be a positive number"),
        ("gossip_interval = nan", "gossip_interval: must be a positive number"),
        ("gossip_max_interval = 0.5", "gossip_max_interval .* must be at least gossip_interval"),
        ("push_fanout = 2.5", "push_fanout: expected an integer, got a number"),
        ("peer_connections_per_address = 0", "peer_connections_per_address: must be from 1 to 1024, got 0"),
        ('peer_connections_per_address = "many"', "peer_connections_per_address: expected an integer, got a string"),
        ("page_bytes = 1024", r"page_bytes \(1024\) must be at least max_content_bytes"),
        ("max_body_bytes = 262144", "max_body_bytes .* must be at least page_bytes"),
        ("local_port = 7733", "port and local_port are both 7733"),
    ],
)
def test_wrong_values_name_the_key_and_file(tmp_path: Path, line: str, message: str) -> None:
    """Each wrong type or value is reported with the file and the offending key."""
    path = write_config(tmp_path, line + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


def test_missing_fleet_key_is_named(tmp_path: Path) -> None:
    """A config without a fleet key says that key is missing."""
    path = tmp_path / "config.toml"
    path.write_text('name = "x"\n')
    with pytest.raises(ConfigError, match="fleet_key: missing"):
        load_config(path)


def test_bad_fleet_key_in_file_is_named(tmp_path: Path) -> None:
    """A damaged fleet key in the file is reported under the fleet_key key."""
    path = tmp_path / "config.toml"
    path.write_text(f'fleet_key = "{encode_fleet_key(KEY)[:-3]}"\n')
    with pytest.raises(ConfigError, match="fleet_key: fleet key has 40 characters"):
        load_config(path)


def test_name_defaults_to_the_host(tmp_path: Path) -> None:
    """A config without a name still loads, with a non-empty default name."""
    path = tmp_path / "config.toml"
    path.write_text(f'fleet_key = "{encode_fleet_key(KEY)}"\n')
    assert load_config(path).name.strip()


# --- fleet key -----------------------------------------------------------------------


def test_fleet_key_round_trips() -> None:
    """Encoding gives the prefixed 43-character form and decoding returns the key."""
    text = encode_fleet_key(KEY)
    assert text.startswith(FLEET_KEY_PREFIX)
    assert len(text) == len(FLEET_KEY_PREFIX) + 43
    assert decode_fleet_key(f"  {text}\n") == KEY


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("AAAA", "a fleet key starts with 'peerd-fleet-'"),
        (FLEET_KEY_PREFIX + "A" * 42, "has 42 characters after the prefix, expected 43"),
        (FLEET_KEY_PREFIX + "A" * 44, "has 44 characters"),
        (FLEET_KEY_PREFIX + "A" * 42 + "=", r"characters outside url-safe base64: '='"),
        (FLEET_KEY_PREFIX + "+/" + "A" * 41, r"outside url-safe base64: '\+/'"),
        (FLEET_KEY_PREFIX + "A" * 42 + "B", "not canonical"),
        ("peerd1:abc", "this is an invite, not a fleet key"),
    ],
)
def test_bad_fleet_keys_say_what_is_wrong(text: str, message: str) -> None:
    """Each malformed fleet key gets an error naming its actual defect."""
    with pytest.raises(ConfigError, match=message):
        decode_fleet_key(text)


def test_fleet_key_must_be_32_bytes() -> None:
    """A Config or encoding with a key of the wrong size is refused."""
    with pytest.raises(ConfigError, match="fleet_key: must be 32 bytes, got 31"):
        Config(name="x", fleet_key=KEY[:31])
    with pytest.raises(ConfigError, match="must be 32 bytes"):
        encode_fleet_key(b"short")


def test_fleet_id_is_short_stable_and_hides_the_key() -> None:
    """fleet_id is 16 hex digits, the same for the same key, and shares nothing with it."""
    other = new_fleet_key()
    fid = fleet_id(KEY)
    assert len(fid) == 16
    assert int(fid, 16) >= 0
    assert fid == fleet_id(bytes(KEY)) == Config(name="x", fleet_key=KEY).fleet_id
    assert fid != fleet_id(other)
    assert fid not in KEY.hex()
    assert fid not in encode_fleet_key(KEY)


def test_repr_never_shows_the_fleet_key() -> None:
    """repr(Config) (logs, tracebacks) contains neither the key bytes nor its encoding."""
    cfg = Config(name="x", fleet_key=KEY)
    text = repr(cfg)
    assert "fleet_key" not in text
    assert encode_fleet_key(KEY)[len(FLEET_KEY_PREFIX) :] not in text
    assert repr(KEY) not in text


# --- seeds and overrides -------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ("box:9", ("box", 9)),
        (" 10.0.0.1 ", ("10.0.0.1", DEFAULT_PORT)),
        ("[::1]:7000", ("::1", 7000)),
        ("[fe80::1]", ("fe80::1", DEFAULT_PORT)),
    ],
)
def test_parse_seed_accepts_host_and_optional_port(seed: str, expected: tuple[str, int]) -> None:
    """Seeds parse as host:port, with the default port when none is given."""
    assert parse_seed(seed) == expected


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        ("::1:7000", "brackets"),
        ("[::1", r"missing '\]'"),
        ("[::1]7000", "expected ':PORT'"),
        ("box:0", "outside 1..65535"),
        ("box:", "empty port"),
        (":7000", "has no host"),
        ("http://box:7000", "expected host:port|brackets"),
        ("a b:7", "not a valid host name"),
    ],
)
def test_parse_seed_rejects_malformed_addresses(seed: str, message: str) -> None:
    """Malformed seed addresses are refused with a message naming the seed."""
    with pytest.raises(ConfigError, match=message):
        parse_seed(seed)


def test_overrides_add_seeds_and_replace_ports() -> None:
    """CLI seeds join the config's seeds (canonical, no duplicates); ports and mdns replace."""
    cfg = Config(name="x", fleet_key=KEY, seeds=("a:1", "b"))
    out = with_overrides(cfg, port=0, local_port=0, seeds=["b:7733", "c:3", "a:1"], mdns=False)
    assert out.seeds == ("a:1", "b:7733", "c:3")
    assert (out.port, out.local_port, out.mdns) == (0, 0, False)
    assert with_overrides(cfg) == cfg


def test_overrides_are_validated() -> None:
    """An override that makes the config invalid raises ConfigError naming the key."""
    cfg = Config(name="x", fleet_key=KEY)
    with pytest.raises(ConfigError, match="port: must be from 0 to 65535"):
        with_overrides(cfg, port=70000)
    with pytest.raises(ConfigError, match="seeds: seed 'nope:x'"):
        with_overrides(cfg, seeds=["nope:x"])


# --- home ----------------------------------------------------------------------------


def test_home_resolution_order(tmp_path: Path) -> None:
    """--home beats PEERD_HOME, which beats the platform's user data folder."""
    env = {HOME_ENV: str(tmp_path / "env")}
    assert resolve_home(tmp_path / "arg", env) == tmp_path / "arg"
    assert resolve_home(None, env) == tmp_path / "env"
    assert resolve_home(None, {HOME_ENV: ""}) == platformdirs.user_data_path("peerd", appauthor=False)
    assert resolve_home("rel", {}).is_absolute()


def test_daemon_json_write_read_remove(tmp_path: Path) -> None:
    """daemon.json round-trips a dict and is removed only for its own pid when asked."""
    assert read_daemon_json(tmp_path) is None
    info = {"pid": os.getpid(), "node_id": "ab", "peer_url": "http://127.0.0.1:1"}
    write_daemon_json(tmp_path, info)
    assert read_daemon_json(tmp_path) == info
    assert remove_daemon_json(tmp_path, only_pid=os.getpid() + 1) is False
    assert read_daemon_json(tmp_path) == info
    assert remove_daemon_json(tmp_path, only_pid=os.getpid()) is True
    assert read_daemon_json(tmp_path) is None
    assert remove_daemon_json(tmp_path) is False


def test_corrupt_daemon_json_is_a_clear_error(tmp_path: Path) -> None:
    """A daemon.json that is not a JSON object raises DaemonError naming the file."""
    (tmp_path / "daemon.json").write_text("[1, 2]")
    with pytest.raises(DaemonError, match=r"daemon\.json: expected a JSON object"):
        read_daemon_json(tmp_path)
    (tmp_path / "daemon.json").write_text("{")
    with pytest.raises(DaemonError, match="not valid JSON"):
        read_daemon_json(tmp_path)
