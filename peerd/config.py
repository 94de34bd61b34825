"""The daemon's configuration: a frozen value and its TOML file. The rules every field obeys
are ``peerd.configrules``; the fleet key's encoding and public id are ``peerd.fleetkey``
(both re-exported here, so ``peerd.config`` stays the one place to import them from).

Invariants:
- A `Config` is always valid: construction checks every field (``configrules.check``) and
  raises `ConfigError` naming the bad key. `repr(Config)` never shows the fleet key.
- `config.toml` is flat TOML, written with mode 0600 because it holds the fleet key;
  loading rejects unknown keys (naming the closest known one) and wrong types with the file
  and key named, and what `render_config` writes loads back to the same `Config`.
- `init_home` never overwrites an existing config; a conflicting request fails loudly.

Default ports: 7733 for the peer port (all interfaces, sealed) and 7734 for the local
port (127.0.0.1 only). Neither is registered to a common service.
"""

from __future__ import annotations

import dataclasses
import difflib
import socket
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerd.configrules import (
    DEFAULT_PORT,
    ENVELOPE_SLACK,
    MAX_HISTORY_DAYS,
    MAX_NAME_CHARS,
    MAX_PREVIOUS_KEYS,
    MDNS_CHOICES,
    MiB,
    check,
    merge_seeds,
    normalize_seed,
    parse_seed,
    type_name,
)
from peerd.errors import ConfigError
from peerd.fleetkey import (
    FLEET_KEY_BYTES,
    FLEET_KEY_PREFIX,
    decode_fleet_key,
    encode_fleet_key,
    fleet_id,
    new_fleet_key,
)
from peerd.home import (
    atomic_write,
    config_path,
    create_exclusive,
    ensure_home,
    ensure_token,
    local_token_path,
    node_key_path,
)
from peerd.limits import PEER_PER_SOURCE
from replica import PeerdError, identity
from replica.ops import MAX_CONTENT_BYTES

__all__ = [
    "DEFAULT_LOCAL_PORT", "DEFAULT_PORT", "ENVELOPE_SLACK", "FIELD_NAMES", "FLEET_KEY_BYTES", "FLEET_KEY_PREFIX",
    "MAX_HISTORY_DAYS", "MAX_NAME_CHARS", "MAX_PREVIOUS_KEYS", "MDNS_CHOICES", "Config", "config_from_dict",
    "decode_fleet_key", "default_name", "encode_fleet_key", "fleet_id", "init_home", "load_config", "merge_seeds",
    "new_fleet_key", "normalize_seed", "parse_seed", "render_config", "save_config", "with_overrides",
]

DEFAULT_LOCAL_PORT = 7734
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Config:
    """Everything a daemon needs to know before it opens its replica."""

    name: str
    """Human-readable node name, shown to peers (default: the host name and 4 hex digits of the node id)."""
    fleet_key: bytes = field(repr=False)
    """The fleet's shared 32-byte secret; seals every peer-to-peer body."""
    port: int = DEFAULT_PORT
    """Peer port on all interfaces; 0 picks a free port."""
    local_port: int = DEFAULT_LOCAL_PORT
    """Local port on 127.0.0.1 (MCP at /mcp, local API); 0 picks a free port."""
    seeds: tuple[str, ...] = ()
    """Peers to contact at start, `host:port` (port defaults to 7733)."""
    mdns: bool = True
    """Advertise and browse for peers on the local network by mDNS."""
    mdns_interfaces: str | tuple[str, ...] = "all"
    """'all', 'default', or a list of interface addresses for mDNS."""
    gossip_interval: float = 1.0
    """Seconds between anti-entropy rounds while there is news."""
    gossip_max_interval: float = 15.0
    """Upper bound the interval backs off to while rounds find nothing new."""
    push_fanout: int = 3
    """Live peers a new local op is pushed to at once (0 disables push on write)."""
    peer_connections_per_address: int = PEER_PER_SOURCE
    """Connections one address may hold open on the peer port (more are refused): a few nodes
    behind one NAT fit the default; raise it when many nodes share one address."""
    reachable: bool | str = "auto"
    """Whether other members can call this one at its address: "auto" asks a peer to try (a
    reachability probe); false (behind NAT) keeps links to reachable members for the return path."""
    relay_keepalive: float = 4.0
    """Seconds between keepalives on a link to a relaying member: NAT mappings need only ~25 s;
    4 s bounds how long mail waits after a mapping is lost (set 25 on metered or battery links)."""
    relay_probe_interval: float = 300.0
    """Seconds between reachability probes with ``reachable = "auto"`` (a member that can be called
    again drops its links at the next one)."""
    relay_links_per_address: int = 32
    """Links this member holds for members nobody can call, from one address (0: relay for none)."""
    relay_links: int = 256
    """Links this member holds for members nobody can call, in all (0: relay for none)."""
    max_body_bytes: int = 4 * MiB
    """Largest peer request or response body accepted."""
    page_bytes: int = MiB
    """Byte budget of one page of ops in a sync answer (a page holds at least one op)."""
    max_content_bytes: int = MAX_CONTENT_BYTES
    """Largest message content accepted (UTF-8 bytes); the op format fixes it at 900,000."""
    broadcast_history_days: int = 7
    """A role's inbox holds the broadcasts sent up to this many days before it was first seen in the fleet."""
    previous_fleet_keys: tuple[bytes, ...] = field(default=(), repr=False)
    """Keys the fleet used before its last rotations, newest first (written by the daemon): a
    member still on one of them is answered with the rotation, never with data."""

    def __post_init__(self) -> None:
        check(self)

    @property
    def fleet_id(self) -> str:
        """The public id of this config's fleet."""
        return fleet_id(self.fleet_key)

    @property
    def broadcast_history_ms(self) -> int:
        return self.broadcast_history_days * DAY_MS


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))


# --- file I/O ------------------------------------------------------------------------


def load_config(path: Path) -> Config:
    """Read and check `config.toml`; every error names the file (and the key)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no config file; run `peerd init` to create one") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build a Config from parsed TOML; raise ConfigError naming the bad key."""
    unknown = [key for key in data if key not in FIELD_NAMES]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, FIELD_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown key {key!r}{hint}; known keys: {', '.join(FIELD_NAMES)}")
    if "fleet_key" not in data:
        raise ConfigError("fleet_key: missing; every daemon of a fleet needs the fleet key")
    values = dict(data)
    encoded = values["fleet_key"]
    if not isinstance(encoded, str):
        raise ConfigError(f"fleet_key: expected a string, got {type_name(encoded)}")
    try:
        values["fleet_key"] = decode_fleet_key(encoded)
    except ConfigError as exc:
        raise ConfigError(f"fleet_key: {exc}") from None
    if "previous_fleet_keys" in values:
        values["previous_fleet_keys"] = _decode_key_list(values["previous_fleet_keys"])
    values.setdefault("name", default_name())
    return Config(**values)


def _decode_key_list(raw: object) -> tuple[bytes, ...]:
    if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
        raise ConfigError(f"previous_fleet_keys: expected a list of fleet keys, got {type_name(raw)}")
    out = []
    for i, text in enumerate(raw):
        try:
            out.append(decode_fleet_key(text))
        except ConfigError as exc:
            raise ConfigError(f"previous_fleet_keys[{i}]: {exc}") from None
    return tuple(out)


def render_config(cfg: Config) -> str:
    """The TOML text of a config (flat, commented, parseable by tomllib)."""
    interfaces = (
        _toml_str(cfg.mdns_interfaces) if isinstance(cfg.mdns_interfaces, str) else _toml_list(cfg.mdns_interfaces)
    )
    lines = [
        "# peerd configuration.",
        "# Holds the fleet key, the secret every peer of the fleet shares: keep it private.",
        "",
        f"name = {_toml_str(cfg.name)}",
        f"fleet_key = {_toml_str(encode_fleet_key(cfg.fleet_key))}",
        "",
        "# Peer port (all interfaces, sealed) and local port (127.0.0.1); 0 = any free port.",
        f"port = {cfg.port}",
        f"local_port = {cfg.local_port}",
        "",
        '# Peers to contact at start, as "host:port".',
        f"seeds = {_toml_list(cfg.seeds)}",
        "",
        '# Find peers on the local network; interfaces: "all", "default" or addresses.',
        f"mdns = {'true' if cfg.mdns else 'false'}",
        f"mdns_interfaces = {interfaces}",
        "",
        "# Seconds between gossip rounds, backing off to the maximum while idle.",
        f"gossip_interval = {cfg.gossip_interval!r}",
        f"gossip_max_interval = {cfg.gossip_max_interval!r}",
        "# Live peers a new message is pushed to at once.",
        f"push_fanout = {cfg.push_fanout}",
        "# Connections one address may hold open on the peer port.",
        f"peer_connections_per_address = {cfg.peer_connections_per_address}",
        "",
        '# Whether other members can call this one: "auto" (a peer tries), true, or false (behind',
        "# NAT: keep links to reachable members, which push down them); keepalive seconds on a link",
        "# (4: mail again within ~5 s after the NAT loses its mapping; 25 on metered or battery links);",
        "# seconds between probes (\"auto\");",
        "# links this member holds for members nobody can call, per address and in all.",
        "# (Commented out while at their defaults, so that an older peerd can still read this file.)",
        *_relay_lines(cfg),
        "",
        "# Size limits in bytes.",
        f"max_body_bytes = {cfg.max_body_bytes}",
        f"page_bytes = {cfg.page_bytes}",
        f"max_content_bytes = {cfg.max_content_bytes}",
        "",
        "# A role's inbox holds the broadcasts sent up to this many days before the role was",
        "# first seen in the fleet (older ones stay in the log and search). Set it alike on every node.",
        f"broadcast_history_days = {cfg.broadcast_history_days}",
    ]
    if cfg.previous_fleet_keys:
        lines += ["", "# Keys this fleet used before it rotated (peerd remove); kept to bring late members up to date.",
                  f"previous_fleet_keys = {_toml_list(encode_fleet_key(k) for k in cfg.previous_fleet_keys)}"]
    return "\n".join(lines) + "\n"


def _relay_lines(cfg: Config) -> list[str]:
    """The return path's keys, each commented out while it holds its default (peerd 0.1.0 refuses
    keys it does not know, and a home may be run by it again)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    out = []
    for key in ("reachable", "relay_keepalive", "relay_probe_interval", "relay_links_per_address", "relay_links"):
        value = getattr(cfg, key)
        if isinstance(value, bool):
            text = str(value).lower()
        else:
            text = _toml_str(value) if isinstance(value, str) else repr(value)
        default = value == defaults[key] and type(value) is type(defaults[key])
        out.append(("# " if default else "") + f"{key} = {text}")
    return out


def save_config(path: Path, cfg: Config) -> None:
    """Atomically write `config.toml` with mode 0600."""
    atomic_write(path, render_config(cfg).encode("utf-8"), mode=0o600)


def init_home(home: Path, name: str | None = None, fleet_key: bytes | None = None) -> Config:
    """Create the home and its config unless they exist; return the config in force.

    An existing config is kept. Asking for a different fleet key or name than the
    existing config holds raises ConfigError rather than silently ignoring the request.
    """
    ensure_home(home)
    path = config_path(home)
    if not path.exists():
        fresh = Config(
            name=default_name(_node_id(home)) if name is None else name,
            fleet_key=new_fleet_key() if fleet_key is None else fleet_key,
        )
        if create_exclusive(path, render_config(fresh).encode("utf-8"), mode=0o600):
            ensure_token(local_token_path(home))  # the home's local secret, made with it
            return fresh
    existing = load_config(path)
    if fleet_key is not None and fleet_key != existing.fleet_key:
        raise ConfigError(
            f"{path}: this home already belongs to fleet {existing.fleet_id}, not "
            f"{fleet_id(fleet_key)}; use another --home, or `peerd join --force` to switch"
        )
    if name is not None and name != existing.name:
        raise ConfigError(f"{path}: this home is already named {existing.name!r}; edit name in the file to rename it")
    return existing


def with_overrides(
    cfg: Config,
    *,
    port: int | None = None,
    local_port: int | None = None,
    seeds: Iterable[str] = (),
    mdns: bool | None = None,
) -> Config:
    """Apply command-line flags; seeds from flags are added to the config's seeds."""
    changes: dict[str, Any] = {"seeds": (*cfg.seeds, *seeds)}  # checked and merged by Config
    if port is not None:
        changes["port"] = port
    if local_port is not None:
        changes["local_port"] = local_port
    if mdns is not None:
        changes["mdns"] = mdns
    return dataclasses.replace(cfg, **changes)


def default_name(node_id: str | None = None, host: str | None = None) -> str:
    """``<short host name>-<first 4 hex digits of the node id>``: readable, and distinct for two
    nodes on one host (or two hosts with one name); the host name alone without a node id;
    'peerd' stands in for a host name that is unusable."""
    short = (socket.gethostname() if host is None else host).split(".")[0].strip()
    base = short if short and short.isprintable() else "peerd"
    if not node_id:
        return base[:MAX_NAME_CHARS]
    suffix = f"-{node_id[:4]}"
    return base[: MAX_NAME_CHARS - len(suffix)] + suffix


def _node_id(home: Path) -> str | None:
    """The id of the node whose key is in ``home``, if there is one yet (nothing is created)."""
    path = node_key_path(home)
    if not path.exists():
        return None
    try:
        return identity.load_or_create(path).node_id
    except (OSError, PeerdError):  # an unreadable key: doctor reports it; the name does without
        return None


# --- TOML writing --------------------------------------------------------------------

_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n"}
_TOML_ESCAPES |= {"\f": "\\f", "\r": "\\r"}


def _toml_str(text: str) -> str:
    out = []
    for ch in text:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_toml_str(item) for item in items) + "]"
