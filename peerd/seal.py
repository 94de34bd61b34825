"""Sealing peer-to-peer bodies with the fleet key (NaCl SecretBox).

Invariants:
- A sealed body is `nonce (24 bytes) || MAC (16 bytes) || ciphertext`: XSalsa20-Poly1305
  with a fresh random nonce, so the overhead is exactly `SEAL_OVERHEAD` = 40 bytes.
- The box key is derived from the fleet key by a keyed hash with its own label, so
  the raw fleet key serves no two purposes (the fleet id uses another label).
- `open_sealed` either returns exactly the plaintext that was sealed with the same
  fleet key or raises `SealError`; nacl exceptions never escape.
- No replay protection here: the same sealed body opens any number of times. The
  daemon layer adds freshness (e.g. a timestamp inside the plaintext) where it matters.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import nacl.exceptions
import nacl.secret
import nacl.utils

from peerd.config import FLEET_KEY_BYTES
from peerd.errors import SealError

NONCE_BYTES = nacl.secret.SecretBox.NONCE_SIZE
MAC_BYTES = nacl.secret.SecretBox.MACBYTES
SEAL_OVERHEAD = NONCE_BYTES + MAC_BYTES
_LABEL = b"peerd-seal-v1"

WRONG_KEY = "not sealed with this fleet's key (wrong fleet key or tampered body)"


def seal(key: bytes, plaintext: bytes) -> bytes:
    """Encrypt and authenticate `plaintext` for the fleet holding `key`."""
    nonce = nacl.utils.random(NONCE_BYTES)
    return bytes(_box(key).encrypt(bytes(plaintext), nonce))


def open_sealed(key: bytes, data: bytes) -> bytes:
    """Return the plaintext of a sealed body; raise SealError if it does not open."""
    if len(data) < SEAL_OVERHEAD:
        raise SealError(f"body too short to be sealed ({len(data)} bytes, need at least {SEAL_OVERHEAD})")
    box = _box(key)
    try:
        return bytes(box.decrypt(bytes(data)))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise SealError(WRONG_KEY) from None


def box_key(key: bytes) -> bytes:
    """The SecretBox key for a fleet key (exposed for tests and protocol docs)."""
    if not isinstance(key, bytes) or len(key) != FLEET_KEY_BYTES:
        raise ValueError(f"fleet key must be {FLEET_KEY_BYTES} bytes")
    size = nacl.secret.SecretBox.KEY_SIZE
    return hashlib.blake2b(key=key, digest_size=size, person=_LABEL).digest()


@lru_cache(maxsize=8)
def _box(key: bytes) -> nacl.secret.SecretBox:
    return nacl.secret.SecretBox(box_key(key))
