"""The joining machine's side: ask for approval, type a one-time code, or redeem an invite; then
write the fleet into the home.

Invariants:
- Nothing is written to the home until a member's answer was checked: the member's key is bound into
  the verification code the person compared (approval), proven by the PAKE's key confirmation (code)
  or by the invite's secret (invite); the grant opens only with this node's key or the PAKE's key.
- ``check_fleet`` runs as soon as the member's fleet is known and before anything is used up on the
  member where the flow allows it (the invite's fleet, an approval request before its reveal), so a
  home that may not move says so first.
- ``enter_fleet`` writes config.toml atomically; it never moves a home holding another fleet's
  history to a new fleet unless asked (``force``), and never when that history holds key rotations.
- Every failure is ``PairingError`` with a message for the person at this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from peerd.config import Config, fleet_id, init_home, load_config, merge_seeds, save_config
from peerd.errors import TransportError
from peerd.home import config_path
from peerd.invite import Invite
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError, Pake, open_from, secret_open
from peerd.pairing.grant import Grant
from peerd.protocol import join as wire
from peerd.protocol.wire import Msg, ProtocolError
from peerd.transport import JOIN_PATH, HttpTransport, Transport

CONNECT_TIMEOUT = 3.0


@dataclass(frozen=True)
class Joiner:
    """This machine, as it presents itself to a member."""

    key: bytes
    signing: SigningKey
    name: str


def http() -> HttpTransport:
    """A client for join requests: small bodies, and long polls of up to ``WAIT_MAX`` s."""
    return HttpTransport(max_body=64 * 1024, total=wire.WAIT_MAX + 15, connect=CONNECT_TIMEOUT,
                         read=wire.WAIT_MAX + 10)


class Guest:
    def __init__(self, transport: Transport, me: Joiner, check_fleet: Callable[[str], None] = lambda _f: None) -> None:
        self.transport = transport
        self.me = me
        self.check_fleet = check_fleet

    async def _post(self, addr: str, kind: str, **fields: Any) -> Msg:
        try:
            answer = await self.transport.post(addr, wire.request(kind, **fields), JOIN_PATH)
            return wire.answer_of(answer.body, answer.status)
        except wire.JoinRefused as exc:
            if exc.status == 404 and kind in (wire.ASK, wire.CODE, wire.REDEEM) and "join request" in str(exc):
                raise PairingError(f"{addr} is not a peerd member that takes join requests") from None
            raise PairingError(f"the member at {addr} refused: {exc}") from None
        except ProtocolError as exc:
            raise PairingError(f"{addr} does not answer like a peerd member ({exc})") from None
        except TransportError as exc:
            raise PairingError(f"cannot reach a member at {addr}: {exc}") from None

    # -- approval ---------------------------------------------------------------------------

    async def ask(self, addr: str, on_code: Callable[[str, Msg], None], deadline: float | None = None) -> Grant:
        """Ask the member at ``addr`` to let us in; ``on_code(code, asked)`` shows the verification
        code; returns once a person approved it there (PairingError if rejected or expired)."""
        nonce_b = codes.nonce()
        asked = await self._post(addr, wire.ASK, k=self.me.key, nm=self.me.name, c=codes.commit(self.me.key, nonce_b))
        member, fleet, nonce_a = _field(asked, "ka", bytes, 32), _field(asked, "f", str), _field(asked, "na", bytes, 16)
        ask_id = _field(asked, "id", bytes, 16)
        try:
            self.check_fleet(fleet)
        except PairingError:
            await self._cancel(addr, ask_id)
            raise
        try:
            await self._post(addr, wire.REVEAL, id=ask_id, nb=nonce_b)
            on_code(codes.verification_code(fleet, member, self.me.key, nonce_a, nonce_b), asked)
            return await self._wait(addr, ask_id, member, deadline)
        except BaseException as exc:  # Ctrl-C or a failure: leave nothing pending on the member
            if not isinstance(exc, PairingError):
                await self._cancel(addr, ask_id)
            raise

    async def _wait(self, addr: str, ask_id: bytes, member: bytes, deadline: float | None) -> Grant:
        while deadline is None or time.monotonic() < deadline:
            reply = await self._post(addr, wire.WAIT, id=ask_id)
            kind = reply.get("t")
            if kind == wire.APPROVED:
                return _grant(Grant.load(open_from(self.me.signing, member, _field(reply, "s", bytes))), member)
            if kind == wire.REJECTED:
                raise PairingError("the member rejected this machine's request to join")
        await self._cancel(addr, ask_id)
        raise PairingError("nobody approved the request in time; ask again")

    async def _cancel(self, addr: str, ask_id: bytes) -> None:
        with contextlib.suppress(PairingError, asyncio.CancelledError):
            await asyncio.wait_for(self._post(addr, wire.CANCEL, id=ask_id), CONNECT_TIMEOUT)

    # -- one-time code ----------------------------------------------------------------------

    async def code(self, addr: str, code: str) -> Grant:
        """Join with a one-time code made on the member at ``addr`` (``peerd invite --code``)."""
        code_id, secret = codes.split_code(code)
        pake = Pake(secret, joiner=True)
        started = await self._post(addr, wire.CODE, ci=code_id, k=self.me.key, nm=self.me.name, pa=pake.message)
        member, fleet = _field(started, "ka", bytes, 32), _field(started, "f", str)
        self.check_fleet(fleet)
        confirm_b, confirm_a, box = codes.pake_keys(pake.finish(started.get("pb")), member, self.me.key, fleet)
        done = await self._post(addr, wire.CONFIRM, sid=_field(started, "sid", bytes, 16), cb=confirm_b)
        if not codes.same(_field(done, "ca", bytes, 32), confirm_a):
            raise PairingError("the member could not prove it knows the code; not joining")
        return _grant(Grant.load(secret_open(box, _field(done, "s", bytes))), member)

    # -- invite -----------------------------------------------------------------------------

    async def redeem(self, addr: str, inv: Invite) -> Grant:
        """Redeem an invite at the member that made it (one of its seeds)."""
        nonce_b = codes.nonce()
        digest = codes.secret_digest(inv.secret)
        done = await self._post(addr, wire.REDEEM, i=inv.id, k=self.me.key, nm=self.me.name, x=nonce_b,
                                p=codes.invite_proof(digest, self.me.key, nonce_b))
        member = _field(done, "ka", bytes, 32)
        if not codes.same(_field(done, "m", bytes, 32), codes.issuer_proof(digest, member, self.me.key, nonce_b)):
            raise PairingError(f"{addr} could not prove it made this invite; not joining")
        return _grant(Grant.load(open_from(self.me.signing, member, _field(done, "s", bytes))), member)


def _field(msg: Msg, key: str, typ: type, size: int | None = None) -> Any:
    value = msg.get(key)
    if not isinstance(value, typ) or (size is not None and (not isinstance(value, bytes) or len(value) != size)):
        raise PairingError(f"the member's answer lacks a valid {key!r}")
    return value


def _grant(grant: Grant, member: bytes) -> Grant:
    if grant.member_key != member:
        raise PairingError("the member's answer names another member; not joining")
    return grant


# -- writing the fleet into the home ---------------------------------------------------------------


@dataclass(frozen=True)
class HomeState:
    """What ``enter_fleet`` needs to know of a home before it moves it."""

    config: Config | None
    others: int  # other nodes whose ops the replica holds
    rotations: int  # key rotations (rekey ops) in the replica


def may_enter(state: HomeState, target_fleet: str, *, force: bool) -> None:
    """PairingError when the home may not move to ``target_fleet`` (pure)."""
    cfg = state.config
    if cfg is None or target_fleet in (cfg.fleet_id, *(fleet_id(k) for k in cfg.previous_fleet_keys)):
        return
    if state.rotations:
        raise PairingError(f"this home belongs to fleet {cfg.fleet_id}, whose history holds key rotations; "
                           "it cannot move to another fleet. Join with a fresh --home")
    if state.others and not force:
        raise PairingError(f"this home belongs to fleet {cfg.fleet_id} and holds messages of {state.others} other "
                           f"node(s); to leave that fleet and join {target_fleet}, run again with --force "
                           "(its messages then sync into the new fleet), or use another --home")


def enter_fleet(home: Path, grant: Grant, state: HomeState, *, name: str | None, force: bool,
                extra_seeds: tuple[str, ...] = ()) -> Config:
    """Write the grant's fleet into the home's config (creating it if needed)."""
    may_enter(state, grant.fleet_id, force=force)
    seeds = merge_seeds(extra_seeds, grant.seeds)
    path = config_path(home)
    if not path.exists():
        init_home(home, name=name, fleet_key=grant.fleet_key)
    cfg = load_config(path)
    if cfg.fleet_key == grant.fleet_key:
        updated = dataclasses.replace(cfg, seeds=merge_seeds(cfg.seeds, seeds))
    elif grant.fleet_id in (fleet_id(k) for k in cfg.previous_fleet_keys) or state.config is None:
        updated = dataclasses.replace(cfg, fleet_key=grant.fleet_key, seeds=merge_seeds(cfg.seeds, seeds))
    else:  # another fleet: its key replaces ours, and with it the seeds and the keys it used before
        updated = dataclasses.replace(cfg, fleet_key=grant.fleet_key, seeds=seeds, previous_fleet_keys=())
    if updated != cfg:
        save_config(path, updated)
    return updated
