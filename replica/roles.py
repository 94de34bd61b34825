"""Roles as this replica knows them: which a channel or a reader names that no confirmed role
goes by (a likely typo), every known role with its standing, and forgetting one seen only reading.

Invariants:
* A role is confirmed once it sent a message or has a profile, unconfirmed while it was only
  seen reading its inbox, unknown otherwise (``replica.firstseen``, the rule; its state is
  replicated, so every replica holding the same ops says the same).
* Checks are hints, never refusals: a message to an unknown or unconfirmed role is stored, and
  a reader of one gets its inbox (offline-first: the role may exist on a peer not synced yet).
* ``forget_role`` writes one signed op (a ``seen.forgot`` write, op level 5) only for an
  unconfirmed role: it covers every read sighting held here and the present moment, so the role
  is unknown again on every replica that holds it, until it is seen again. A confirmed or
  unknown role is refused and nothing is written.
"""

from __future__ import annotations

from typing import Any

from replica import firstseen, routing
from replica.checks import required_name
from replica.core import ReplicaCore, iso
from replica.errors import InvalidArgument, NotFound
from replica.firstseen import KnownRoles
from replica.models import RecipientCheck, RoleForgotten
from replica.names import name_key


def check_roles(cur: Any, roles: tuple[str, ...], seen: KnownRoles | None = None
                ) -> tuple[RecipientCheck, KnownRoles | None]:
    """Which of ``roles`` (a channel's) no confirmed role of this replica goes by (never seen, or
    seen only reading), with the confirmed roles to name beside them; and every known role when
    they were needed (else None). ``seen``: every known role when the caller remembers them, so
    nothing is looked up."""
    if roles == (routing.BROADCAST,):
        return RecipientCheck((), ()), seen
    if seen is not None:
        unknown = tuple(r for r in roles if not firstseen.addressable_in(r, seen.keys))
    else:
        unknown = tuple(r for r in roles if not _addressable(cur, r))
        seen = KnownRoles.read(cur) if unknown else None
    if not unknown or seen is None:
        return RecipientCheck((), ()), seen
    unconfirmed = tuple(r for r in unknown if name_key(r) in seen.unconfirmed)
    return RecipientCheck(unknown, tuple(firstseen.hint(unknown, seen.sorted)), unconfirmed), seen


def _addressable(cur: Any, part: str) -> bool:
    """Whether a channel entry names a confirmed role of this replica, or an instance address of one
    (``sigma-vps`` of a known ``sigma``, ``routing.instance_address``)."""
    return any(firstseen.is_confirmed(cur, k) for k in firstseen.address_keys(part))


class Roles(ReplicaCore):
    def recipient_check(self, channel: str) -> RecipientCheck:
        """Which roles ``channel`` names that this replica has never seen, or seen only reading
        their inbox, to warn a sender (a message to them is still stored: the role may appear
        later, or on a peer)."""
        roles = routing.parse_channel(required_name(channel, "channel"))
        with self._store.read() as cur:
            return check_roles(cur, roles)[0]

    def reader_check(self, recipient: str) -> RecipientCheck:
        """Whether the role reading its inbox is one this replica has never seen
        (``unknown_recipients`` names it, then, with the confirmed roles to suggest); asked before
        the read, which makes it known (unconfirmed: ``recipient_check`` keeps warning senders)."""
        role = required_name(recipient, "recipient")
        with self._store.read() as cur:
            if firstseen.status(cur, role) is not None:
                return RecipientCheck((), ())
            known = firstseen.confirmed_roles(cur)
        return RecipientCheck((role,), tuple(firstseen.hint([role], known)))

    def forget_role(self, role: str) -> RoleForgotten:
        """Forget a role seen only reading its inbox (a typo, most often), on every replica: sends
        to it warn again, it leaves ``peerd roles`` and the recipients of broadcasts. Refused for a
        role that sent a message or has a profile, and for one not known here."""
        name = required_name(role, "role")
        with self._store.read() as cur:
            standing = firstseen.status(cur, name)
            first, last = firstseen.lookup(cur, name), firstseen.last_read(cur, name)
        if standing is None:
            raise NotFound(f"no role {name!r} is known here (peerd roles lists the known ones)")
        if standing == firstseen.CONFIRMED:
            raise InvalidArgument(f"role {name!r} has sent a message or has a profile: only a role seen "
                                  "only reading its inbox can be forgotten")
        upto = max(self._wall(), last or 0)
        self._set([firstseen.forget_write(name, upto)])
        return RoleForgotten(name_key(name), iso(first), iso(upto))
