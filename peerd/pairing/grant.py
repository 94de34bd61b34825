"""What a member hands a machine it lets in: the fleet key and where to find the fleet.

Invariants: ``Grant.load`` accepts only a map with a 32-byte key whose fleet id is the one named,
a member key of 32 bytes, a name, at most ``MAX_SEEDS`` canonical seeds and at most ``MAX_ROOTS``
root node keys of 32 bytes (a member of an earlier release sends none), else ``PairingError``.
``roots`` are the nodes the member trusts without an admit (``replica.membership``): the joiner
trusts the same, so both decide alike who is a member.
The grant travels only encrypted (boxed to the joiner's node key, or under the PAKE's key).
"""

from __future__ import annotations

from dataclasses import dataclass

from peerd.config import FLEET_KEY_BYTES, fleet_id, merge_seeds
from peerd.errors import ConfigError
from peerd.pairing.crypto import PairingError
from replica import Undecodable
from replica.codec import pack, unpack

MAX_SEEDS = 16
MAX_ROOTS = 1000  # replica.membership.MAX_MEMBERS


@dataclass(frozen=True)
class Grant:
    fleet_key: bytes
    seeds: tuple[str, ...]
    member_name: str
    member_key: bytes
    roots: tuple[bytes, ...] = ()

    @property
    def fleet_id(self) -> str:
        return fleet_id(self.fleet_key)

    def dump(self) -> bytes:
        out = {"fk": self.fleet_key, "f": self.fleet_id, "s": list(self.seeds), "nm": self.member_name,
               "ka": self.member_key}
        if self.roots:
            out["r"] = list(self.roots)
        return pack(out)

    def trusted(self) -> frozenset[bytes]:
        """Whom the joiner trusts without an admit: the member's roots, or (a member of an earlier
        release sends none) the member itself."""
        return frozenset(self.roots) or frozenset({self.member_key})

    @classmethod
    def load(cls, data: bytes) -> Grant:
        try:
            m = unpack(data)
        except Undecodable:
            raise PairingError("the member's answer is malformed") from None
        if not isinstance(m, dict):
            raise PairingError("the member's answer is malformed")
        key, fid, seeds, name, member = (m.get(k) for k in ("fk", "f", "s", "nm", "ka"))
        if not (isinstance(key, bytes) and len(key) == FLEET_KEY_BYTES and isinstance(member, bytes)
                and len(member) == 32 and isinstance(name, str) and isinstance(seeds, list)
                and len(seeds) <= MAX_SEEDS and all(isinstance(s, str) for s in seeds)) or fleet_id(key) != fid:
            raise PairingError("the member's answer is malformed")
        roots = m.get("r", [])
        if not (isinstance(roots, list) and len(roots) <= MAX_ROOTS
                and all(isinstance(r, bytes) and len(r) == 32 for r in roots)):
            raise PairingError("the member's answer is malformed")
        try:
            return cls(key, merge_seeds(seeds), name, member, tuple(roots))
        except ConfigError as exc:
            raise PairingError(f"the member's answer names a bad seed: {exc}") from None
