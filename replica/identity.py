"""Node identity: one Ed25519 key pair per replica, created once.

The node id is the 32-byte public key itself (shown as hex), so any replica can
verify an op's signature from its origin field alone, with no key registry.

Invariants:
* ``load_or_create`` never replaces a key that exists: two processes creating it at
  once end up with the one key the first wrote (the second's is linked nowhere).
* The private seed is written whole or not at all (a temporary file, then a hard
  link), with mode 0600, to the home's ``node.key``; it never leaves this module
  except as a signature.
* A key file that is not 32 bytes of hex is a ``StoreError`` naming the file, never
  silently a new identity.
* ``verify`` never raises: a malformed key or signature is simply not valid.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from replica.errors import StoreError

SEED_BYTES = 32
SIG_BYTES = 64


@dataclass(frozen=True)
class Identity:
    signing_key: SigningKey

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @property
    def node_id(self) -> str:
        return self.public_key.hex()

    def sign(self, data: bytes) -> bytes:
        return self.signing_key.sign(data).signature


def generate() -> Identity:
    return Identity(SigningKey.generate())


def from_seed(seed: bytes) -> Identity:
    return Identity(SigningKey(seed))


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    try:
        VerifyKey(public_key).verify(data, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def load_or_create(path: Path, fresh: Identity | None = None) -> Identity:
    """Load the key at ``path``; create it (0600) if it does not exist yet, as ``fresh`` when given
    (a key made before its home, e.g. by ``peerd join``, which presents it before it writes anything)."""
    if path.exists():
        return _load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ident = fresh or generate()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # unique per writer
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(bytes(ident.signing_key).hex() + "\n")
    try:
        os.link(tmp, path)  # fails if another process created the key meanwhile
    except FileExistsError:
        tmp.unlink()
        return _load(path)
    tmp.unlink()
    return ident


def _load(path: Path) -> Identity:
    text = path.read_text().strip()
    try:
        seed = bytes.fromhex(text)
    except ValueError:
        raise StoreError(f"node key file {path} is not valid hex") from None
    if len(seed) != SEED_BYTES:
        raise StoreError(f"node key file {path} holds {len(seed)} bytes, expected {SEED_BYTES}")
    return from_seed(seed)
