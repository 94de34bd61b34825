"""Pairing crypto: a payload boxed from a member's node key to a joiner's, and the PAKE.

Invariants:
- Node keys are Ed25519; boxes use their Curve25519 forms (PyNaCl's conversions). ``box_to``
  authenticates the sender too (NaCl Box), so a joiner that checked the member's key (it is
  bound into the verification code, or proven with the invite secret) knows who sealed it.
- The PAKE is SPAKE2 (``spake2``): the joiner is side A, the member side B. A wrong code gives
  the two sides different keys; nothing an eavesdropper sees lets it test a guess offline.
- Every failure is ``PairingError``; nacl and spake2 exceptions never escape.
"""

from __future__ import annotations

from typing import Any

import nacl.exceptions
import nacl.public
import nacl.secret
import nacl.signing
import nacl.utils

from peerd.errors import DaemonError
from replica.errors import RemoteError

PAKE_MSG_MAX = 128


class PairingError(DaemonError, RemoteError):
    """A pairing step failed; the message says why, for the person at that machine."""


def _curve_public(node: bytes) -> nacl.public.PublicKey:
    try:
        return nacl.signing.VerifyKey(node).to_curve25519_public_key()
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise PairingError("the other side's node key is not a usable public key") from None


def box_to(signing: nacl.signing.SigningKey, node: bytes, plaintext: bytes) -> bytes:
    """``plaintext`` boxed from our node key to ``node``'s."""
    box = nacl.public.Box(signing.to_curve25519_private_key(), _curve_public(node))
    return bytes(box.encrypt(plaintext))


def open_from(signing: nacl.signing.SigningKey, node: bytes, sealed: bytes) -> bytes:
    """A payload ``node`` boxed to our node key; PairingError if it does not open."""
    box = nacl.public.Box(signing.to_curve25519_private_key(), _curve_public(node))
    try:
        return bytes(box.decrypt(sealed))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise PairingError("the answer does not open with this node's key (damaged, or not from that member)") from None


def secret_box(key: bytes, plaintext: bytes) -> bytes:
    return bytes(nacl.secret.SecretBox(key).encrypt(plaintext, nacl.utils.random(nacl.secret.SecretBox.NONCE_SIZE)))


def secret_open(key: bytes, sealed: bytes) -> bytes:
    try:
        return bytes(nacl.secret.SecretBox(key).decrypt(sealed))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        raise PairingError("the answer does not open with the key the code gave") from None


class Pake:
    """One side of a SPAKE2 exchange over a code's secret."""

    def __init__(self, secret: bytes, *, joiner: bool) -> None:
        # spake2 loads the cryptography package (about 10 MB resident): only when a code is used
        from spake2 import SPAKE2_A, SPAKE2_B  # type: ignore[import-untyped]  # noqa: PLC0415

        self._side: Any = (SPAKE2_A if joiner else SPAKE2_B)(secret)
        self.message: bytes = bytes(self._side.start())

    def finish(self, theirs: object) -> bytes:
        """The shared key from the other side's message; PairingError if it is malformed."""
        if not isinstance(theirs, bytes) or not 0 < len(theirs) <= PAKE_MSG_MAX:
            raise PairingError("the other side's PAKE message is malformed")
        try:
            return bytes(self._side.finish(theirs))
        except Exception:  # spake2 raises its own and ValueError types on bad points
            raise PairingError("the other side's PAKE message is malformed") from None
