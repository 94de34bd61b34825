"""Fleet membership as ops: letting a node in, removing one, rotating the fleet key (pure rules).

Two op kinds, signed and replicated like every other op:

* ``admit``  ``{k: node key, nm: name, f: fleet id}``: a member let the node ``k`` in and gave it
  the key of fleet ``f``. Names nodes for people, and makes a node that has not written yet a member.
* ``rekey``  ``{e: epoch, f: new fleet id, ks: [[member key, sealed key], ...], rm: [[node key,
  upto], ...]}``: a member made a new fleet key and sealed it to each remaining member's node key
  (``seal_key``); every node in ``rm`` is removed, and its ops above ``upto`` are never applied.

The rules (``standing``) are a function of the set of rekey ops, not of their arrival order:

* Rekeys are taken in the order (hlc, origin, seq). One whose origin an earlier, non-void rekey
  removed with ``upto < seq`` is *void*: a removed node cannot remove anyone after its cutoff.
* ``removed``: node -> the lowest ``upto`` any non-void rekey gave it.
* The *winner* is the non-void rekey with the highest (epoch, hlc, origin); its key is the fleet
  key now, for every member holding an entry in it.

Invariants:
* ``standing`` depends on the set of rekey ops only: any arrival order, with any repeats, gives
  the same removals, void rekeys and winner, so every replica that holds the same ops agrees.
* A removed node's ops above its cutoff are never applied by another replica (``barred``), and a
  rekey it signed after its cutoff counts for nothing; its own replica keeps what it wrote.
* A body is checked in full before it counts: exactly its keys, node keys of 32 bytes, sealed keys
  of their one size, at most ``MAX_MEMBERS`` entries and ``MAX_REMOVED_PER_OP`` removals, and no
  removed node among the key holders; anything else is ``InvalidOp``.
* Sealing and opening never raise: a key that does not seal, or a sealed key that does not open
  (not ours, damaged, not 32 bytes), is None.
* Nothing here touches SQLite; ``replica.fleet`` stores the ops and keeps the projections.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import nacl.exceptions
import nacl.public
import nacl.signing

from replica.errors import InvalidOp

KIND_ADMIT = "admit"
KIND_REKEY = "rekey"
KINDS = (KIND_ADMIT, KIND_REKEY)

KEY_BYTES = 32
FLEET_KEY_BYTES = 32
SEALED_KEY_BYTES = FLEET_KEY_BYTES + nacl.public.PublicKey.SIZE + 16  # ephemeral key, MAC: 80
MAX_MEMBERS = 1000
MAX_REMOVED_PER_OP = 16
MAX_NODE_NAME = 64
FLEET_ID_CHARS = 16


# -- op bodies --------------------------------------------------------------------------------


def admit_body(node: bytes, name: str, fleet_id: str) -> dict[str, Any]:
    return {"k": node, "nm": name, "f": fleet_id}


def rekey_body(epoch: int, fleet_id: str, entries: Mapping[bytes, bytes],
               removes: Mapping[bytes, int]) -> dict[str, Any]:
    return {"e": epoch, "f": fleet_id, "ks": [[k, v] for k, v in sorted(entries.items())],
            "rm": [[k, u] for k, u in sorted(removes.items())]}


def _key(v: object, what: str) -> bytes:
    if not isinstance(v, bytes) or len(v) != KEY_BYTES:
        raise InvalidOp(f"{what} must be a {KEY_BYTES}-byte node key")
    return v


def _uint(v: object, what: str, low: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v < 2**63:
        raise InvalidOp(f"{what} must be an integer from {low} to 2^63-1")
    return v


def _fleet_id(v: object) -> None:
    if not isinstance(v, str) or len(v) != FLEET_ID_CHARS or not all(c in "0123456789abcdef" for c in v):
        raise InvalidOp(f"fleet id must be {FLEET_ID_CHARS} lower-case hex digits")


def _pairs(v: object, what: str, limit: int) -> list[list[Any]]:
    if not isinstance(v, list) or len(v) > limit or not all(isinstance(p, list) and len(p) == 2 for p in v):
        raise InvalidOp(f"{what} must be a list of at most {limit} pairs")
    return v


def check_admit(body: Mapping[str, Any]) -> None:
    if set(body) != {"k", "nm", "f"}:
        raise InvalidOp("admit body must have exactly the keys k, nm, f")
    _key(body["k"], "admitted node")
    name = body["nm"]
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NODE_NAME or not name.isprintable():
        raise InvalidOp(f"admitted node name must be printable text of 1 to {MAX_NODE_NAME} characters")
    _fleet_id(body["f"])


def check_rekey(body: Mapping[str, Any]) -> None:
    if set(body) != {"e", "f", "ks", "rm"}:
        raise InvalidOp("rekey body must have exactly the keys e, f, ks, rm")
    _uint(body["e"], "epoch", low=1)
    _fleet_id(body["f"])
    entries = _pairs(body["ks"], "key entries", MAX_MEMBERS)
    keys = [_key(k, "member") for k, _ in entries]
    if len(set(keys)) != len(keys):
        raise InvalidOp("a member has two key entries")
    for _, sealed in entries:
        if not isinstance(sealed, bytes) or len(sealed) != SEALED_KEY_BYTES:
            raise InvalidOp(f"a sealed key entry must be {SEALED_KEY_BYTES} bytes")
    removes = _pairs(body["rm"], "removals", MAX_REMOVED_PER_OP)
    gone = {_key(k, "removed node") for k, _ in removes}
    for _, upto in removes:
        _uint(upto, "removal cutoff")
    if gone & set(keys):
        raise InvalidOp("a removed node cannot hold a key entry")


CHECKS = {KIND_ADMIT: check_admit, KIND_REKEY: check_rekey}
BODY_KEYS = {KIND_ADMIT: frozenset({"k", "nm", "f"}), KIND_REKEY: frozenset({"e", "f", "ks", "rm"})}


# -- the rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rekey:
    """One rekey op as the rules see it."""

    origin: bytes
    seq: int
    hlc: int
    epoch: int
    fleet_id: str
    entries: Mapping[bytes, bytes] = field(default_factory=dict, hash=False)
    removes: Mapping[bytes, int] = field(default_factory=dict, hash=False)

    @property
    def order(self) -> tuple[int, bytes, int]:
        return (self.hlc, self.origin, self.seq)

    @property
    def rank(self) -> tuple[int, int, bytes]:
        return (self.epoch, self.hlc, self.origin)

    @classmethod
    def from_body(cls, origin: bytes, seq: int, hlc: int, body: Mapping[str, Any]) -> Rekey:
        return cls(origin, seq, hlc, body["e"], body["f"], {bytes(k): bytes(v) for k, v in body["ks"]},
                   {bytes(k): int(u) for k, u in body["rm"]})


@dataclass(frozen=True)
class Standing:
    """The fleet as a set of rekey ops makes it."""

    removed: dict[bytes, int] = field(default_factory=dict)  # node -> cutoff (highest seq kept)
    void: frozenset[tuple[bytes, int]] = frozenset()  # (origin, seq) of rekeys that count for nothing
    winner: Rekey | None = None
    valid: tuple[Rekey, ...] = ()  # non-void rekeys, by rank

    @property
    def epoch(self) -> int:
        return 0 if self.winner is None else self.winner.epoch


def standing(rekeys: Iterable[Rekey]) -> Standing:
    """Removals, void rekeys and the winner of a set of rekey ops (order-independent)."""
    removed: dict[bytes, int] = {}
    void: set[tuple[bytes, int]] = set()
    valid: list[Rekey] = []
    for r in sorted(set(rekeys), key=lambda r: r.order):
        if r.origin in removed and r.seq > removed[r.origin]:
            void.add((r.origin, r.seq))
            continue
        valid.append(r)
        for node, upto in r.removes.items():
            removed[node] = min(removed.get(node, upto), upto)
    valid.sort(key=lambda r: r.rank)
    return Standing(removed, frozenset(void), valid[-1] if valid else None, tuple(valid))


def barred(removed: Mapping[bytes, int], origin: bytes, seq: int, me: bytes) -> bool:
    """An op this replica must not apply: its origin is removed and it lies above the cutoff.
    A node's own ops are never barred for itself (it keeps what it wrote)."""
    return origin != me and origin in removed and seq > removed[origin]


def cap_vector(vector: Mapping[bytes, int], removed: Mapping[bytes, int]) -> dict[bytes, int]:
    """A vector with every removed origin held to its cutoff: what a round may ask or offer."""
    return {o: min(n, removed[o]) if o in removed else n for o, n in vector.items()}


def members(origins: Iterable[bytes], admitted: Iterable[bytes], removed: Mapping[bytes, int]) -> set[bytes]:
    """Who a rotation seals the new key to: every node that wrote or was let in, less the removed."""
    return {k for k in (*origins, *admitted) if k not in removed}


def gaps(winner: Rekey | None, current: Iterable[bytes], given: Mapping[bytes, str],
         removed: Mapping[bytes, int]) -> tuple[set[bytes], set[bytes]]:
    """(members the winning rotation left out, removed nodes it still gave the key to).

    A member let in with the winner's own fleet id (``given``) needs no entry: it was given the key."""
    if winner is None:
        return set(), set()
    missing = {m for m in current if m not in winner.entries and given.get(m) != winner.fleet_id}
    return missing, {k for k in winner.entries if k in removed}


# -- sealing a fleet key to a node key ------------------------------------------------------------


def seal_key(node: bytes, fleet_key: bytes) -> bytes | None:
    """``fleet_key`` sealed to the node key ``node`` (Ed25519, converted to Curve25519); None when
    ``node`` is not a usable public key."""
    try:
        box = nacl.public.SealedBox(nacl.signing.VerifyKey(node).to_curve25519_public_key())
        return bytes(box.encrypt(fleet_key))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return None


def open_key(signing: nacl.signing.SigningKey, sealed: bytes) -> bytes | None:
    """The fleet key sealed to our node key, or None when it does not open (not ours, damaged)."""
    try:
        key = bytes(nacl.public.SealedBox(signing.to_curve25519_private_key()).decrypt(sealed))
    except (nacl.exceptions.CryptoError, ValueError, TypeError):
        return None
    return key if len(key) == FLEET_KEY_BYTES else None
