"""Pure rules of pairing: verification codes, one-time codes, invite proofs, key confirmation.

Invariants:
- ``verification_code`` depends on every input (fleet id, both node keys, both nonces) and is six
  decimal digits. The joiner commits to its nonce (``commit``) before it sees the member's, so
  neither side, nor anyone between them, can steer the code to match another request's.
- A one-time code is ``ID`` (2 characters, says which code on the member, sent in clear) and a
  ``SECRET`` (6 characters, 30 bits, never sent: it only feeds the PAKE), from a 32-letter alphabet
  without look-alikes; ``parse_code`` accepts any case, spaces and dashes, and reads 0/o, 1/i/l as one.
- MACs and derived keys are keyed BLAKE2b with a label per purpose, so no key serves two purposes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

NONCE_BYTES = 16
VERIFY_DIGITS = 6
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32: no i, l, o, u
CODE_ID_CHARS = 2
CODE_SECRET_CHARS = 6
CODE_CHARS = CODE_ID_CHARS + CODE_SECRET_CHARS
_LOOKALIKE = str.maketrans({"o": "0", "i": "1", "l": "1", "u": "v"})


def _h(label: bytes, *parts: bytes, key: bytes = b"", size: int = 32) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=size, person=label)
    for part in parts:
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def commit(joiner: bytes, nonce_b: bytes) -> bytes:
    """The joiner's commitment to its nonce, sent before it learns the member's nonce."""
    return _h(b"peerd-pair-cmt", joiner, nonce_b)


def verification_code(fleet: str, member: bytes, joiner: bytes, nonce_a: bytes, nonce_b: bytes) -> str:
    """The six digits both machines show for one approval request."""
    digest = _h(b"peerd-pair-code", fleet.encode(), member, joiner, nonce_a, nonce_b, size=8)
    return str(int.from_bytes(digest, "big") % 10**VERIFY_DIGITS).zfill(VERIFY_DIGITS)


def parse_verification(text: str) -> str | None:
    """Six digits from what a person typed ("123 456", "123-456"), or None."""
    digits = "".join(c for c in text if c not in " -")
    return digits if len(digits) == VERIFY_DIGITS and digits.isascii() and digits.isdigit() else None


def show_verification(code: str) -> str:
    return f"{code[:3]} {code[3:]}"


# -- one-time codes -------------------------------------------------------------------------------


def new_code(taken: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """A fresh one-time code whose id is not in ``taken``."""
    while True:
        code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_CHARS))
        if code[:CODE_ID_CHARS] not in taken:
            return code


def show_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def parse_code(text: str) -> str | None:
    """The canonical code from what a person typed, or None if it cannot be one."""
    code = "".join(c for c in text.lower() if c not in " -").translate(_LOOKALIKE)
    return code if len(code) == CODE_CHARS and all(c in ALPHABET for c in code) else None


def split_code(code: str) -> tuple[str, bytes]:
    """(id sent in clear, secret that only feeds the PAKE)."""
    return code[:CODE_ID_CHARS], code[CODE_ID_CHARS:].encode()


def pake_keys(shared: bytes, member: bytes, joiner: bytes, fleet: str) -> tuple[bytes, bytes, bytes]:
    """From the PAKE's shared key: (joiner's confirmation, member's confirmation, box key), each
    bound to both node keys and the fleet id."""
    ctx = (member, joiner, fleet.encode())
    return (_h(b"peerd-pake-cb", *ctx, key=shared), _h(b"peerd-pake-ca", *ctx, key=shared),
            _h(b"peerd-pake-box", *ctx, key=shared))


def same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


# -- invites --------------------------------------------------------------------------------------


def secret_digest(secret: bytes) -> bytes:
    """What the issuer keeps of an invite's secret (never the secret itself); the proofs are keyed
    with it, so the issuer's record must stay as private as the invite while it is valid."""
    return _h(b"peerd-inv-sec", secret)


def invite_proof(digest: bytes, joiner: bytes, nonce_b: bytes) -> bytes:
    """The joiner's proof that it holds the invite, bound to its own node key."""
    return _h(b"peerd-inv-b", joiner, nonce_b, key=digest)


def issuer_proof(digest: bytes, member: bytes, joiner: bytes, nonce_b: bytes) -> bytes:
    """The issuer's proof back that it is the one who made the invite."""
    return _h(b"peerd-inv-a", member, joiner, nonce_b, key=digest)
