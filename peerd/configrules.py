"""The rules a ``Config`` obeys: every field checked (and put in canonical form) when a config
is built, so that a ``Config`` is always valid. Pure: no files, no sockets.

Invariants:
- A bad field raises ``ConfigError`` naming the key (``seeds[2]: ...``), and what was expected.
- Seeds are kept as canonical ``host:port`` (IPv6 as ``[addr]:port``), first occurrence first,
  without duplicates; they follow discovery's own rules, so a seed the config accepts is one
  the daemon can use.
- Sizes fit each other: one largest message fits a page, and a page (or a largest op) fits a
  peer body, with room for the envelope.
- At most ``MAX_PREVIOUS_KEYS`` earlier fleet keys are kept, newest first, never the current one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from discovery.seeds import format_seed
from discovery.seeds import parse_seed as discovery_parse_seed
from discovery.source import SeedError
from peerd.errors import ConfigError
from peerd.fleetkey import FLEET_KEY_BYTES, check_key_bytes
from peerd.limits import PEER_CONNECTIONS
from replica.ops import MAX_OP_BYTES

if TYPE_CHECKING:
    from peerd.config import Config

DEFAULT_PORT = 7733
MiB = 1024 * 1024
KiB = 1024
# Room for an op's metadata and signature next to its content, and for the sync
# envelope and seal around a page.
ENVELOPE_SLACK = 4 * KiB
MAX_NAME_CHARS = 64
MDNS_CHOICES = ("all", "default")
MAX_HISTORY_DAYS = 36_500


def parse_seed(seed: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """Split `host:port`, `host`, `[v6]:port` or `[v6]`; raise ConfigError if malformed.

    The rules are discovery's own (one parser for seeds), so a seed the config accepts is one
    the daemon can use."""
    try:
        parsed = discovery_parse_seed(seed, default_port)
    except SeedError as exc:
        raise ConfigError(str(exc)) from None
    return parsed.host, parsed.port


def normalize_seed(seed: str) -> str:
    """Canonical form of a seed address."""
    return format_seed(*parse_seed(seed))


def merge_seeds(*groups: Iterable[str]) -> tuple[str, ...]:
    """Canonical seeds of all groups, first occurrence first, without duplicates."""
    seen: dict[str, None] = {}
    for group in groups:
        for seed in group:
            seen.setdefault(normalize_seed(seed), None)
    return tuple(seen)


def check(cfg: Config) -> None:
    """Check and normalize every field of a freshly built Config."""
    _check_name(cfg.name)
    check_key_bytes(cfg.fleet_key)
    for key in ("port", "local_port"):
        _check_int(key, getattr(cfg, key), 0, 65535)
    if cfg.port == cfg.local_port != 0:
        raise ConfigError(f"port and local_port are both {cfg.port}; they must differ")
    _check_seeds(cfg)
    _check_bool("mdns", cfg.mdns)
    _check_mdns_interfaces(cfg)
    _check_intervals(cfg)
    _check_int("push_fanout", cfg.push_fanout, 0, 1000)
    _check_int("peer_connections_per_address", cfg.peer_connections_per_address, 1, PEER_CONNECTIONS)
    _check_relay(cfg)
    _check_sizes(cfg)
    _check_int("broadcast_history_days", cfg.broadcast_history_days, 0, MAX_HISTORY_DAYS)
    _check_previous(cfg)


MAX_PREVIOUS_KEYS = 8


def _check_previous(cfg: Config) -> None:
    keys: object = cfg.previous_fleet_keys
    if not isinstance(keys, list | tuple):
        raise ConfigError(f"previous_fleet_keys: expected a list of fleet keys, got {type_name(keys)}")
    for i, key in enumerate(keys):
        if not isinstance(key, bytes) or len(key) != FLEET_KEY_BYTES:
            raise ConfigError(f"previous_fleet_keys[{i}]: must be a {FLEET_KEY_BYTES}-byte key")
    kept = tuple(k for k in dict.fromkeys(keys) if k != cfg.fleet_key)[:MAX_PREVIOUS_KEYS]
    object.__setattr__(cfg, "previous_fleet_keys", kept)


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise ConfigError(f"name: expected a string, got {type_name(name)}")
    if not name.strip():
        raise ConfigError("name: must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise ConfigError(f"name: at most {MAX_NAME_CHARS} characters, got {len(name)}")
    if any(not c.isprintable() for c in name):
        raise ConfigError("name: must not contain control characters")


def _check_int(key: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{key}: expected an integer, got {type_name(value)}")
    if not low <= value <= high:
        raise ConfigError(f"{key}: must be from {low} to {high}, got {value}")


def _check_bool(key: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {type_name(value)}")


def _check_seeds(cfg: Config) -> None:
    seeds: object = cfg.seeds
    if isinstance(seeds, str) or not isinstance(seeds, list | tuple):
        raise ConfigError(f"seeds: expected a list of strings, got {type_name(seeds)}")
    for i, seed in enumerate(seeds):
        if not isinstance(seed, str):
            raise ConfigError(f"seeds[{i}]: expected a string, got {type_name(seed)}")
    try:
        merged = merge_seeds(seeds)
    except ConfigError as exc:
        raise ConfigError(f"seeds: {exc}") from None
    object.__setattr__(cfg, "seeds", merged)


def _check_mdns_interfaces(cfg: Config) -> None:
    value: object = cfg.mdns_interfaces
    if isinstance(value, str):
        if value not in MDNS_CHOICES:
            raise ConfigError(f"mdns_interfaces: expected 'all', 'default' or a list of addresses, got {value!r}")
        return
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(
            f"mdns_interfaces: expected 'all', 'default' or a non-empty list of addresses, got {type_name(value)}"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or not item.isprintable():
            raise ConfigError(f"mdns_interfaces[{i}]: expected a non-empty string")
    object.__setattr__(cfg, "mdns_interfaces", tuple(value))


RELAY_KEEPALIVE_RANGE = (0.2, 600.0)
RELAY_PROBE_RANGE = (1.0, 86_400.0)
MAX_RELAY_LINKS = 10_000


def _check_relay(cfg: Config) -> None:
    """``reachable``: true, false or "auto"; the keepalive a number of seconds; the caps counts."""
    if cfg.reachable != "auto" and not isinstance(cfg.reachable, bool):
        raise ConfigError(f'reachable: expected true, false or "auto", got {type_name(cfg.reachable)}'
                          + (f" {cfg.reachable!r}" if isinstance(cfg.reachable, str) else ""))
    for key, (low, high) in (("relay_keepalive", RELAY_KEEPALIVE_RANGE), ("relay_probe_interval", RELAY_PROBE_RANGE)):
        value: object = getattr(cfg, key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number of seconds, got {type_name(value)}")
        if not (math.isfinite(value) and low <= value <= high):
            raise ConfigError(f"{key}: must be from {low:g} to {high:g} seconds, got {value}")
        object.__setattr__(cfg, key, float(value))
    _check_int("relay_links_per_address", cfg.relay_links_per_address, 0, MAX_RELAY_LINKS)
    _check_int("relay_links", cfg.relay_links, 0, MAX_RELAY_LINKS)


def _check_intervals(cfg: Config) -> None:
    for key in ("gossip_interval", "gossip_max_interval"):
        value = getattr(cfg, key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number of seconds, got {type_name(value)}")
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{key}: must be a positive number of seconds, got {value}")
        object.__setattr__(cfg, key, float(value))
    if cfg.gossip_max_interval < cfg.gossip_interval:
        raise ConfigError(
            f"gossip_max_interval ({cfg.gossip_max_interval}) must be at least gossip_interval ({cfg.gossip_interval})"
        )


def _check_sizes(cfg: Config) -> None:
    _check_int("max_content_bytes", cfg.max_content_bytes, 1, 64 * MiB)
    _check_int("page_bytes", cfg.page_bytes, 1, 256 * MiB)
    _check_int("max_body_bytes", cfg.max_body_bytes, 1, 1024 * MiB)
    if cfg.page_bytes < cfg.max_content_bytes + ENVELOPE_SLACK:
        raise ConfigError(
            f"page_bytes ({cfg.page_bytes}) must be at least max_content_bytes + "
            f"{ENVELOPE_SLACK} ({cfg.max_content_bytes + ENVELOPE_SLACK}) so one "
            f"largest message fits a page"
        )
    largest = max(cfg.page_bytes, MAX_OP_BYTES)  # a page always holds one op, however large
    if cfg.max_body_bytes < largest + ENVELOPE_SLACK:
        raise ConfigError(
            f"max_body_bytes ({cfg.max_body_bytes}) must be at least page_bytes (or the largest op, "
            f"{MAX_OP_BYTES}) + {ENVELOPE_SLACK} ({largest + ENVELOPE_SLACK}) so a page fits a body"
        )


def type_name(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "a list", tuple: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)
