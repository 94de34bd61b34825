"""Invite tokens: the fleet key and a few seed addresses in one copy-pasteable string.

Format: `peerd1:` + url-safe base64 (no padding) of `payload || check`, where payload
is msgpack `{"k": <32-byte fleet key>, "s": [<"host:port">, ...]}` and check is the
first 4 bytes of a labelled BLAKE2b of the payload, so a token damaged in copying is
reported as such instead of yielding a wrong key.

Invariants:
- `parse_invite(make_invite(k, s)) == (k, canonical s)`; whitespace inside a token
  (line wraps from a chat or mail) is ignored.
- An invite is a secret: it carries the fleet key itself.
- `apply_invite` never replaces a home's different fleet key unless `force=True`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from peerd.config import (
    FLEET_KEY_BYTES,
    Config,
    fleet_id,
    init_home,
    load_config,
    merge_seeds,
    parse_seed,
    save_config,
)
from peerd.errors import ConfigError
from peerd.home import config_path
from replica import Undecodable
from replica.codec import pack, unpack

INVITE_PREFIX = "peerd1:"
CHECK_BYTES = 4
MAX_INVITE_CHARS = 8192
MAX_INVITE_SEEDS = 32
_CHECK_LABEL = b"peerd-invite"
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_UNSPECIFIED_HOSTS = frozenset({"0.0.0.0", "::", "*"})


def make_invite(fleet_key: bytes, seed_addr: str | Iterable[str]) -> str:
    """A token for joining the fleet; seeds are where the new peer should connect first."""
    seeds = _seed_list(seed_addr)
    if len(fleet_key) != FLEET_KEY_BYTES:
        raise ConfigError(f"fleet key must be {FLEET_KEY_BYTES} bytes, got {len(fleet_key)}")
    payload = pack({"k": fleet_key, "s": list(seeds)})
    body = payload + _check(payload)
    return INVITE_PREFIX + base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")


def parse_invite(token: str) -> tuple[bytes, tuple[str, ...]]:
    """Return (fleet key, seeds) from a token; raise ConfigError saying what is wrong."""
    text = "".join(token.split())
    if len(text) > MAX_INVITE_CHARS:
        raise ConfigError(f"invite is too long ({len(text)} characters)")
    prefix, sep, encoded = text.partition(":")
    if not sep or not prefix.startswith("peerd"):
        raise ConfigError(f"not a peerd invite: it should start with {INVITE_PREFIX!r}")
    if prefix + sep != INVITE_PREFIX:
        raise ConfigError(f"invite format {prefix!r} is not known to this peerd; upgrade it")
    body = _decode_b64(encoded)
    payload, check = body[:-CHECK_BYTES], body[-CHECK_BYTES:]
    if len(body) <= CHECK_BYTES or check != _check(payload):
        raise ConfigError("invite is damaged or incomplete; copy the whole token again")
    return _parse_payload(payload)


def apply_invite(home: Path, token: str, *, force: bool = False) -> Config:
    """Join the fleet of `token`: write its key and seeds into the home's config.

    Creates the home if needed. A home of the same fleet gains the invite's seeds.
    A home of another fleet is switched (key replaced, old seeds dropped) only with
    `force=True`.
    """
    key, seeds = parse_invite(token)
    path = config_path(home)
    if not path.exists():
        init_home(home, fleet_key=key)
    current = load_config(path)
    if current.fleet_key == key:
        updated = dataclasses.replace(current, seeds=merge_seeds(current.seeds, seeds))
    elif force:
        updated = dataclasses.replace(current, fleet_key=key, seeds=seeds)
    else:
        raise ConfigError(
            f"{path}: this home already belongs to fleet {current.fleet_id}, and the invite "
            f"is for fleet {fleet_id(key)}. To switch fleets, join again with --force "
            f"(replaces the fleet key and seeds), or use another --home"
        )
    if updated != current:
        save_config(path, updated)
    return updated


def _seed_list(seed_addr: str | Iterable[str]) -> tuple[str, ...]:
    seeds = merge_seeds([seed_addr] if isinstance(seed_addr, str) else seed_addr)
    if len(seeds) > MAX_INVITE_SEEDS:
        raise ConfigError(f"an invite holds at most {MAX_INVITE_SEEDS} seeds")
    for seed in seeds:
        host, _ = parse_seed(seed)
        if host in _UNSPECIFIED_HOSTS:
            raise ConfigError(
                f"seed {seed!r}: {host} is a listening address, not one another machine "
                f"can reach; give this machine's LAN address or host name"
            )
    return seeds


def _check(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=CHECK_BYTES, person=_CHECK_LABEL).digest()


def _decode_b64(encoded: str) -> bytes:
    if not _B64URL.fullmatch(encoded):
        raise ConfigError("invite has characters outside url-safe base64; copy it again")
    try:
        body = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        body = None
    if body is None or base64.urlsafe_b64encode(body).rstrip(b"=").decode() != encoded:
        raise ConfigError("invite is damaged or incomplete; copy the whole token again")
    return body


def _parse_payload(payload: bytes) -> tuple[bytes, tuple[str, ...]]:
    try:
        data = unpack(payload)
    except Undecodable:
        raise ConfigError("invite content is malformed") from None
    if not isinstance(data, dict):
        raise ConfigError("invite content is malformed")
    key, seeds = data.get("k"), data.get("s")
    if not isinstance(key, bytes) or len(key) != FLEET_KEY_BYTES:
        raise ConfigError("invite holds no valid fleet key")
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds):
        raise ConfigError("invite holds no valid seed list")
    try:
        return key, merge_seeds(seeds)
    except ConfigError as exc:
        raise ConfigError(f"invite: {exc}") from None
