"""Invite tokens: single-use, expiring, and holding no fleet key.

Format: ``peerd2:`` + url-safe base64 (no padding) of ``payload || check``, where payload is
msgpack ``{"i": <8-byte invite id>, "x": <16-byte secret>, "e": <expiry, Unix seconds>,
"s": [<"host:port">, ...], "f": <fleet id>}`` and check is the first 4 bytes of a labelled BLAKE2b
of the payload, so a token damaged in copying is reported as such.

Redeeming needs the issuing member online: the joiner proves it holds the secret, bound to its own
node key (``peerd.pairing.codes.invite_proof``), and the member answers with the fleet key boxed to
that key. The member keeps a record of each invite it made in its home (``invites.json``, mode
0600, never replicated): the secret's digest, the expiry, and by whom and when it was used.

Invariants:
- ``parse_invite(make_invite(inv)) == inv`` (seeds canonical); whitespace inside a token (line
  wraps from a chat or mail) is ignored.
- A ``peerd1:`` token (the old format, which carried the fleet key itself) is refused with a message
  saying what to do instead; it is never applied.
- ``check_record`` is pure; ``redeem`` marks a record used under a file lock, so two joiners racing
  with one token cannot both get in. Records expired for more than ``KEEP_EXPIRED`` are dropped.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerd.config import merge_seeds, parse_seed
from peerd.errors import ConfigError
from peerd.home import atomic_write, ensure_home
from peerd.pairing.codes import secret_digest
from replica import Undecodable
from replica.codec import pack, unpack
from replica.errors import Refused

INVITE_PREFIX = "peerd2:"
OLD_PREFIX = "peerd1:"
CHECK_BYTES = 4
ID_BYTES = 8
SECRET_BYTES = 16
MAX_INVITE_CHARS = 4096
MAX_INVITE_SEEDS = 16
DEFAULT_TTL = 24 * 3600.0
MAX_TTL = 30 * 24 * 3600.0
KEEP_EXPIRED = 7 * 24 * 3600.0
MAX_ATTEMPTS = 5
INVITES_FILE = "invites.json"
_CHECK_LABEL = b"peerd-invite2"
_B64URL = re.compile(r"[A-Za-z0-9_-]+")
_UNSPECIFIED_HOSTS = frozenset({"0.0.0.0", "::", "*"})
OLD_TOKEN = ("this is an old invite (peerd1:), which carried the fleet key itself; this peerd no longer "
             "accepts them. Ask a member for a new one (`peerd invite` there), or join with "
             "`peerd join --lan` / `peerd join --code CODE`")


@dataclass(frozen=True)
class Invite:
    id: bytes
    secret: bytes
    expires: int
    seeds: tuple[str, ...]
    fleet_id: str


class InviteRefused(Refused):
    """An invite that cannot be redeemed; ``status`` is what the joiner's request gets."""


# -- tokens -----------------------------------------------------------------------------------------


def make_invite(inv: Invite) -> str:
    payload = pack({"i": inv.id, "x": inv.secret, "e": inv.expires, "s": list(inv.seeds), "f": inv.fleet_id})
    body = payload + _check(payload)
    return INVITE_PREFIX + base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")


def parse_invite(token: str) -> Invite:
    """The invite a token holds; ConfigError saying what is wrong with it."""
    text = "".join(token.split())
    if len(text) > MAX_INVITE_CHARS:
        raise ConfigError(f"invite is too long ({len(text)} characters)")
    prefix, sep, encoded = text.partition(":")
    if text.startswith(OLD_PREFIX):
        raise ConfigError(OLD_TOKEN)
    if not sep or not prefix.startswith("peerd"):
        raise ConfigError(f"not a peerd invite: it should start with {INVITE_PREFIX!r}")
    if prefix + sep != INVITE_PREFIX:
        raise ConfigError(f"invite format {prefix!r} is not known to this peerd; upgrade it")
    body = _decode_b64(encoded)
    payload, check = body[:-CHECK_BYTES], body[-CHECK_BYTES:]
    if len(body) <= CHECK_BYTES or check != _check(payload):
        raise ConfigError("invite is damaged or incomplete; copy the whole token again")
    return _parse_payload(payload)


def seed_list(seed_addr: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical seeds for an invite; ConfigError for one another machine could not reach."""
    seeds = merge_seeds([seed_addr] if isinstance(seed_addr, str) else seed_addr)
    if not seeds:
        raise ConfigError("an invite needs at least one address of this machine")
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


def _parse_payload(payload: bytes) -> Invite:
    try:
        data = unpack(payload)
    except Undecodable:
        raise ConfigError("invite content is malformed") from None
    if not isinstance(data, dict):
        raise ConfigError("invite content is malformed")
    iid, secret, expires, seeds, fleet = (data.get(k) for k in ("i", "x", "e", "s", "f"))
    if not isinstance(iid, bytes) or len(iid) != ID_BYTES or not isinstance(secret, bytes) \
            or len(secret) != SECRET_BYTES:
        raise ConfigError("invite holds no valid id and secret")
    if not isinstance(expires, int) or isinstance(expires, bool) or not isinstance(fleet, str) or len(fleet) > 64:
        raise ConfigError("invite holds no valid expiry and fleet")
    if not isinstance(seeds, list) or not all(isinstance(s, str) for s in seeds):
        raise ConfigError("invite holds no valid seed list")
    try:
        return Invite(iid, secret, expires, seed_list(seeds), fleet)
    except ConfigError as exc:
        raise ConfigError(f"invite: {exc}") from None


# -- the issuer's records -------------------------------------------------------------------------------


def check_record(rec: dict[str, Any] | None, now: float) -> None:
    """Why an invite record cannot be redeemed now (InviteRefused), or nothing."""
    if rec is None:
        raise InviteRefused(404, "this member did not make that invite (or it was made on another machine)")
    used = rec.get("used")
    if used:
        raise InviteRefused(410, f"this invite was used already (by {used.get('by', '?')} at "
                                 f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(used.get('at', 0)))}); "
                                 "ask for a new one")
    if float(rec.get("expires", 0)) <= now:
        raise InviteRefused(410, "this invite has expired; ask for a new one")
    if int(rec.get("attempts", 0)) >= MAX_ATTEMPTS:
        raise InviteRefused(410, "this invite was tried with a wrong secret too often and is void; ask for a new one")


def issue(home: Path, seeds: Iterable[str], fleet_id: str, ttl: float = DEFAULT_TTL,
          now: float | None = None) -> tuple[str, Invite]:
    """Make an invite, record it in the home, and return (token, invite)."""
    if not 0 < ttl <= MAX_TTL:
        raise ConfigError(f"an invite lasts from 1 second to {int(MAX_TTL // 86400)} days")
    now = time.time() if now is None else now
    inv = Invite(secrets.token_bytes(ID_BYTES), secrets.token_bytes(SECRET_BYTES), int(now + ttl),
                 seed_list(list(seeds)), fleet_id)
    with _records(home) as recs:
        recs[inv.id.hex()] = {"digest": secret_digest(inv.secret).hex(), "expires": inv.expires,
                              "created": now, "used": None, "attempts": 0}
    return make_invite(inv), inv


def redeem(home: Path, invite_id: bytes, verify: Callable[[bytes], bool], by: str,
           now: float | None = None) -> None:
    """Mark the invite used if ``verify(digest)`` holds; InviteRefused otherwise (a wrong proof
    counts as an attempt). Runs under the records' lock: one invite, one joiner."""
    now = time.time() if now is None else now
    with _records(home) as recs:
        rec = recs.get(invite_id.hex())
        check_record(rec, now)
        assert rec is not None
        if not verify(bytes.fromhex(str(rec["digest"]))):
            rec["attempts"] = int(rec.get("attempts", 0)) + 1
            raise InviteRefused(403, "the invite's secret does not match (was it copied whole?)")
        rec["used"] = {"at": now, "by": by}


def records(home: Path) -> dict[str, Any]:
    """The invite records of a home (for ``peerd invite --list`` and tests)."""
    with _records(home) as recs:
        return dict(recs)


@contextlib.contextmanager
def _records(home: Path) -> Iterator[dict[str, Any]]:
    """The records, read and written back under an exclusive lock (other processes wait)."""
    ensure_home(home)
    path = home / INVITES_FILE
    fd = os.open(home / "invites.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        recs = _load(path)
        before = json.dumps(recs, sort_keys=True)
        try:
            yield recs
        finally:  # a refused redemption still counts its attempt
            now = time.time()
            for key in [k for k, r in recs.items() if float(r.get("expires", 0)) + KEEP_EXPIRED < now]:
                del recs[key]
            text = json.dumps(recs, sort_keys=True)
            if text != before:
                atomic_write(path, (json.dumps(recs, indent=1, sort_keys=True) + "\n").encode(), mode=0o600)
    finally:
        os.close(fd)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the invite records ({exc}); move the file aside") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not an object of invite records; move the file aside")
    return data
