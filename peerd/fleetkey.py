"""The fleet key: the secret every member of a fleet shares, how it is written, and the fleet's
public id.

Invariants:
- A fleet key is 32 random bytes (``new_fleet_key``); anything else is refused with a
  ``ConfigError``.
- In files and on the command line it is written ``peerd-fleet-`` + url-safe base64 without
  padding (43 characters); decoding accepts only that canonical form, and says what is wrong
  with anything else (an invite pasted by mistake, a key cut short, a wrong last character).
- ``fleet_id`` is a short public name of the fleet derived by a keyed, labelled hash; it
  reveals nothing about the key, so adverts and logs may carry it.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets

from peerd.errors import ConfigError

FLEET_KEY_BYTES = 32
FLEET_KEY_PREFIX = "peerd-fleet-"
_FLEET_KEY_CHARS = 43  # len(base64 of 32 bytes) without padding
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def new_fleet_key() -> bytes:
    """A fresh random fleet key."""
    return secrets.token_bytes(FLEET_KEY_BYTES)


def encode_fleet_key(key: bytes) -> str:
    """The fleet key as written in files and on the command line."""
    check_key_bytes(key)
    return FLEET_KEY_PREFIX + base64.urlsafe_b64encode(key).rstrip(b"=").decode("ascii")


def decode_fleet_key(text: str) -> bytes:
    """Parse `peerd-fleet-...`; raise ConfigError saying what is wrong with it."""
    text = text.strip()
    if text.startswith(("peerd1:", "peerd2:")):
        raise ConfigError("this is an invite, not a fleet key; use it with `peerd join`")
    if not text.startswith(FLEET_KEY_PREFIX):
        raise ConfigError(f"a fleet key starts with {FLEET_KEY_PREFIX!r}")
    body = text[len(FLEET_KEY_PREFIX) :]
    if not _B64URL.fullmatch(body):
        bad = sorted({c for c in body if not _B64URL.fullmatch(c)})
        raise ConfigError(f"fleet key has characters outside url-safe base64: {''.join(bad)!r}")
    if len(body) != _FLEET_KEY_CHARS:
        raise ConfigError(
            f"fleet key has {len(body)} characters after the prefix, "
            f"expected {_FLEET_KEY_CHARS} (a {FLEET_KEY_BYTES}-byte key); was it cut short?"
        )
    key = base64.urlsafe_b64decode(body + "=")  # cannot fail after the checks above
    if encode_fleet_key(key) != text:
        raise ConfigError("fleet key is not canonical base64 (its last character is wrong)")
    return key


def fleet_id(key: bytes) -> str:
    """A short public id of the fleet (16 hex digits); safe to advertise."""
    check_key_bytes(key)
    digest = hashlib.blake2b(key=key, digest_size=8, person=b"peerd-fleet-id")
    return digest.hexdigest()


def check_key_bytes(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != FLEET_KEY_BYTES:
        size = len(key) if isinstance(key, bytes) else type(key).__name__
        raise ConfigError(f"fleet_key: must be {FLEET_KEY_BYTES} bytes, got {size}")
