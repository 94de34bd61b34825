"""A member answering join requests (``POST /v1/join``), and its operator's approvals.

The I/O shell around the pure ``Desk``: it decodes each request (``peerd.protocol.join``), runs the
PAKE and the boxes, writes the ``admit`` op when it lets a machine in, wakes a joiner waiting for a
decision, and keeps invite records in the home.

Invariants:
- Every answer is a plain msgpack map; a refusal is ``{t: error, e}`` with a 4xx status. Nothing
  about the fleet is in any answer except its public id, this member's name and public key, and the
  fleet key encrypted for the one machine let in.
- A machine is let in only by a person (``approve``), a right one-time code (PAKE with key
  confirmation both ways) or a valid invite proof bound to the joiner's own node key; a node the
  fleet removed is never let in again under the same key.
- The desk is touched on the event loop only; replica and file work run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from typing import Any, Protocol

from peerd import invite as invites
from peerd.clock import Clock
from peerd.keyring import KeyRing
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError, Pake, box_to, secret_box
from peerd.pairing.desk import Desk, DeskError, Session
from peerd.pairing.grant import Grant
from peerd.protocol import join as wire
from peerd.protocol.wire import ProtocolError, encode_map
from peerd.transport import Answer
from replica import Replica

log = logging.getLogger("peerd.pairing")


class Member(Protocol):
    """What the host needs of the node it serves."""

    rep: Replica

    @property
    def keys(self) -> KeyRing: ...

    @property
    def name(self) -> str: ...

    def lan_seeds(self) -> list[str]: ...

    @property
    def clock(self) -> Clock: ...


class PairingHost:
    def __init__(self, member: Member, home: Path | None = None, desk: Desk | None = None) -> None:
        self.member = member
        self.home = home
        self.desk = desk or Desk()
        self._decided: dict[bytes, asyncio.Event] = {}

    @property
    def me(self) -> bytes:
        return self.member.rep.node_key

    def _now(self) -> float:
        return self.member.clock.now()

    # -- the join endpoint ------------------------------------------------------------------

    async def answer(self, body: bytes, remote: str) -> Answer:
        try:
            req = wire.decode_join(body)
            if req.kind in wire.OPENING:  # what makes state or tries a secret; the rest name one of those
                self.desk.check_rate(remote, self._now())
            reply = await getattr(self, f"_on_{req.kind}")(req, remote)
        except DeskError as exc:
            return self._refusal(exc.status, str(exc), remote)
        except invites.InviteRefused as exc:
            return self._refusal(exc.status, str(exc), remote)
        except (ProtocolError, PairingError) as exc:
            return self._refusal(400, str(exc), remote)
        return Answer(200, encode_map(reply))

    def _refusal(self, status: int, why: str, remote: str) -> Answer:
        log.info("join request from %s refused: %s", remote, why)
        return Answer(status, encode_map(wire.error(why)))

    async def _refuse_removed(self, joiner: bytes) -> None:
        if joiner in await asyncio.to_thread(self.member.rep.removed):
            raise DeskError(403, "this machine was removed from the fleet; it can join again only with a fresh "
                                 "home (a new node key)")

    async def _on_ask(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        await self._refuse_removed(req["k"])
        ask = self.desk.open_ask(req["k"], req["nm"], remote, req["c"], self._now())
        return {"t": wire.ASKED, "id": ask.id, "ka": self.me, "nm": self.member.name, "f": self.member.keys.fleet_id,
                "na": ask.nonce_a, "ttl": int(ask.expires - ask.created)}

    async def _on_reveal(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        now = self._now()
        ask = self.desk.reveal(req["id"], req["nb"], self.member.keys.fleet_id, self.me, now)
        assert ask.code is not None
        log.warning("join request from %s at %s: approve with `peerd approve %s` (check that it shows "
                    "the same code), or `peerd reject %s`", ask.name, remote, ask.code, ask.code)
        return {"t": wire.WAITING, "ttl": int(ask.expires - now)}

    async def _on_wait(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        ask = self.desk.ask(req["id"], self._now())
        if ask.state == "waiting":
            event = self._decided.setdefault(ask.id, asyncio.Event())
            left = min(wire.WAIT_MAX, ask.expires - self._now())
            await self.member.clock.wait(event, max(left, 0.0))
            ask = self.desk.ask(req["id"], self._now())  # says so if it expired or was dropped meanwhile
        if ask.state == "approved" and ask.answer is not None:
            self._close(ask.id, "the request was approved and its answer collected")
            return {"t": wire.APPROVED, "s": ask.answer}
        if ask.state == "rejected":
            self._close(ask.id, "the request was rejected")
            return {"t": wire.REJECTED, "e": "the request was rejected on the member"}
        if ask.state == "waiting":
            return {"t": wire.WAITING, "ttl": int(ask.expires - self._now())}
        raise DeskError(409, "the request has no verification code yet (reveal first)")

    async def _on_cancel(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        ask = self.desk.ask(req["id"], self._now())
        self._close(ask.id, "the joiner gave up")
        log.info("join request from %s (%s) was cancelled by the joiner", ask.name, remote)
        return {"t": wire.OK}

    def _close(self, ask_id: bytes, why: str) -> None:
        ask = self.desk.asks.get(ask_id)
        if ask is not None:
            self.desk.close(ask, why)
        event = self._decided.pop(ask_id, None)
        if event is not None:
            event.set()

    async def _on_code(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        await self._refuse_removed(req["k"])
        code = self.desk.try_code(req["ci"], self._now())
        pake = Pake(codes.split_code(code.code)[1], joiner=False)
        shared = pake.finish(req["pa"])
        fleet = self.member.keys.fleet_id
        cb, ca, box = codes.pake_keys(shared, self.me, req["k"], fleet)
        sid = secrets.token_bytes(16)
        self.desk.open_session(Session(sid, code.id, req["k"], req["nm"], cb, ca, box,
                                       self._now() + self.desk.session_ttl))
        return {"t": wire.CODE, "sid": sid, "ka": self.me, "nm": self.member.name, "f": fleet, "pb": pake.message}

    async def _on_confirm(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        sess = self.desk.session(req["sid"], self._now())
        if not codes.same(req["cb"], sess.confirm_b):
            why = self.desk.wrong_code(sess.code_id)
            log.warning("a one-time code was tried from %s (%s) and did not match: %s", remote, sess.name, why)
            raise DeskError(403, why)
        self.desk.use_code(sess.code_id)
        grant = await self._let_in(sess.joiner, sess.name, remote, "a one-time code")
        return {"t": wire.APPROVED, "ca": sess.confirm_a, "s": secret_box(sess.box_key, grant.dump())}

    async def _on_redeem(self, req: wire.JoinRequest, remote: str) -> dict[str, Any]:
        if self.home is None:
            raise DeskError(404, "this member keeps no invites")
        await self._refuse_removed(req["k"])
        digests: list[bytes] = []

        def verify(digest: bytes) -> bool:
            digests.append(digest)
            return codes.same(codes.invite_proof(digest, req["k"], req["x"]), req["p"])

        await asyncio.to_thread(invites.redeem, self.home, req["i"], verify, req["nm"])
        grant = await self._let_in(req["k"], req["nm"], remote, "an invite")
        return {"t": wire.APPROVED, "ka": self.me, "m": codes.issuer_proof(digests[0], self.me, req["k"], req["x"]),
                "s": box_to(self.member.rep.signing_key, req["k"], grant.dump())}

    # -- letting a machine in -----------------------------------------------------------------

    async def _let_in(self, joiner: bytes, name: str, remote: str, how: str) -> Grant:
        keys = self.member.keys
        roots = await asyncio.to_thread(self.member.rep.roots_to_give)
        grant = Grant(keys.current, tuple(self.member.lan_seeds()), self.member.name, self.me, tuple(sorted(roots)))
        await asyncio.to_thread(self.member.rep.admit_node, joiner, name, keys.fleet_id)
        log.warning("let %s (node %s, at %s) into fleet %s with %s", name, joiner.hex()[:16], remote,
                    keys.fleet_id, how)
        return grant

    # -- the operator's side (local API) ---------------------------------------------------------

    def requests(self) -> list[dict[str, object]]:
        now = self._now()
        return [a.view(now) for a in self.desk.pending(now)]

    async def approve(self, code: str) -> dict[str, object]:
        ask = self.desk.find(code, self._now())
        grant = await self._let_in(ask.joiner, ask.name, ask.source, "approval")
        answer = box_to(self.member.rep.signing_key, ask.joiner, grant.dump())
        ask = self.desk.approve(code, answer, self._now())
        self._wake(ask.id)
        return {"approved": ask.name, "node_id": ask.joiner.hex(), "fleet_id": grant.fleet_id}

    def reject(self, code: str) -> dict[str, object]:
        ask = self.desk.reject(code, self._now())
        log.warning("rejected the join request of %s (node %s, at %s)", ask.name, ask.joiner.hex()[:16], ask.source)
        self._wake(ask.id)
        return {"rejected": ask.name, "node_id": ask.joiner.hex()}

    def _wake(self, ask_id: bytes) -> None:
        event = self._decided.pop(ask_id, None)
        if event is not None:
            event.set()

    def new_code(self, ttl: float) -> dict[str, object]:
        code = self.desk.add_code(ttl, self._now())
        return {"code": codes.show_code(code.code), "expires_in": ttl, "expires": self.member.clock.wall() + ttl,
                "attempts": self.desk.max_attempts, "fleet_id": self.member.keys.fleet_id}
