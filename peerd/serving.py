"""Answering peers: one sealed request in, one sealed answer out (the node's ``Server`` side).

Invariants:
* ``answer`` and ``join`` never raise: a body that does not open is a 403 (plain text), one that
  is not a request of ours a 400, a store failure a 503, a bug of ours a 500 (logged with its
  traceback once); every status is ``protocol.answers``'.
* A request that opens only with a key the fleet used before is answered with the rotation and
  nothing else, sealed with that old key.
* The request is handled on a worker thread (``protocol.dispatch`` reads and writes the replica);
  what it asks of this node (peers learnt, forwards, wake-ups) goes through the core on the loop.
* A refusal is counted always and logged at most ``ratelog.BURST`` times a minute per source,
  then told as one summary line when the minute ends.
"""

from __future__ import annotations

import contextlib
import logging

from discovery.seeds import format_seed
from peerd import protocol
from peerd.clock import Cancellable
from peerd.core import clip
from peerd.errors import SealError
from peerd.nodebase import NodeBase
from peerd.protocol import Msg, ProtocolError, answers
from peerd.ratelog import summary
from peerd.transport import Answer, Channel
from replica.errors import RemoteError, StoreError

log = logging.getLogger("peerd.node")


def _ops_of(msg: Msg) -> list[bytes]:
    ops = msg.get("o")
    return [o for o in ops if isinstance(o, bytes)] if isinstance(ops, list) else []


class Serving(NodeBase):
    async def answer(self, body: bytes, remote: str) -> Answer:
        """One sealed request from a peer at ``remote`` (the transport's ``Server``)."""
        try:
            return await self._answer(body, remote)
        except StoreError as exc:
            self.run(self.core.report_once("our replica", "store", f"cannot answer peers from our replica: {exc}"))
            return self._sealed(protocol.error_reply(exc), answers.UNAVAILABLE)
        except Exception as exc:
            self.run(self.core.bug("answering a peer", exc))
            return self._sealed(protocol.error_reply(RuntimeError("internal error")), answers.INTERNAL)

    async def _answer(self, body: bytes, remote: str) -> Answer:
        try:
            plain, key = self.keys.open(body)
            if key != self.keys.current:
                return await self._answer_old_key(plain, key, remote)
            req = protocol.decode_request(plain)
        except SealError as exc:
            self.refuse(remote, str(exc))
            return Answer(answers.WRONG_KEY, str(exc).encode())
        except ProtocolError as exc:
            return self._error(remote, exc, key)
        self.run(self.core.inbound(remote, req.envelope, self.clock.now()))
        if (early := await self._early(req, remote)) is not None:
            return self._sealed(*early, key=key)
        try:
            out = await self.offload(protocol.dispatch, self.rep, req, self._here(req))
        except RemoteError as exc:
            return self._error(remote, exc, key)
        self.run(self.core.answered(out, req.envelope.sender, self.clock.now()))
        if out.new:
            port = req.envelope.port
            await self.note_own_history(format_seed(remote, port) if port else remote)
        if self.rep.fleet_changes != self._fleet_seen:  # the caller's retry must find us on the new key
            await self.refresh_keys()
        self.run(self.core.recovered("our replica", "store"))
        return self._sealed(out.reply, key=key)

    async def _early(self, req: protocol.Request, remote: str) -> tuple[Msg, int] | None:
        """What the node answers itself: a ``back`` probe (``peerd.relaylink`` calls the caller
        back), snapshots and rounds while taking one (``peerd.snapshotting``)."""
        if req.kind == protocol.BACK:
            return await self.relay.answer_back(remote, req), answers.OK
        return await self.snapshots.answer(req, remote)

    async def link(self, channel: Channel, remote: str) -> None:
        """A link a member nobody can call opened to us (the transport's ``Server``)."""
        try:
            await self.relay.serve(channel, remote)
        except Exception as exc:
            self.run(self.core.bug("holding a relay link", exc))

    async def join(self, body: bytes, remote: str) -> Answer:
        """An unsealed join request (``POST /v1/join``): the pairing host answers it; a store failure
        is a 503, a bug of ours a 500, both as bare maps (the caller has no key)."""
        try:
            return await self.pairing.answer(body, remote)
        except StoreError as exc:
            self.run(self.core.report_once("our replica", "store", f"cannot answer peers from our replica: {exc}"))
            return Answer(answers.UNAVAILABLE, protocol.encode_map(protocol.error_reply(exc)))
        except Exception as exc:
            self.run(self.core.bug("answering a join request", exc))
            return Answer(answers.INTERNAL, protocol.encode_map(protocol.error_reply(RuntimeError("internal error"))))

    async def _answer_old_key(self, plain: bytes, key: bytes, remote: str) -> Answer:
        """A request sealed with a key the fleet used before: answer with every membership op we hold
        (the rotations, removals and admits that decide who holds which key), nothing else; the
        membership ops a push of it carries are taken, and nothing else of it. So a member that
        missed a rotation catches up, two members that heard of conflicting removals in another
        order come to decide alike, and a removed node learns it was removed."""
        with contextlib.suppress(ProtocolError):
            req = protocol.decode_request(plain)
            if req.kind == protocol.PUSH:
                theirs = [raw for raw in _ops_of(req.msg) if protocol.is_membership_op(raw)]
                if theirs:
                    try:
                        await self.offload(self.rep.apply, theirs)
                    except RemoteError as exc:
                        return self._error(remote, exc, key)
                    if self.rep.fleet_changes != self._fleet_seen:
                        await self.refresh_keys()
        ops = await self.offload(self.rep.membership_ops)
        if remote not in self._told_old_key:
            self._told_old_key.add(remote)
            log.info("%s called with the fleet's previous key; answered with the key rotation only", remote)
        reply = protocol.sign_reply(answers.rekey_reply(ops), me=self.me, kind=protocol.REKEY, clock_ms=0)
        return Answer(answers.OK, self.keys.seal(protocol.encode(reply), key))

    def refuse(self, remote: str, why: str) -> None:
        """A refused request or connection (also the transport's): counted always, logged at most
        ``ratelog.BURST`` times a minute per source, then told as one summary line."""
        self.core.counters["refused"] += 1
        verdict = self._refusals.note(remote, self.clock.now())
        if verdict.write:
            log.warning("refused request from %s: %s", remote, clip(why))
        if verdict.flush_at is not None and self._loop is not None and not self._loop.is_closed():
            self._flush_later(max(0.0, verdict.flush_at - self.clock.now()))

    def _flush_later(self, delay: float) -> None:
        """Tell the minute's summary when it ends (the timer leaves ``_flushes`` as it fires)."""
        handle: list[Cancellable] = []

        def fire() -> None:
            self._flushes.difference_update(handle)
            self._flush_refusals()

        handle.append(self.clock.call_later(delay, fire))
        self._flushes.update(handle)

    def _flush_refusals(self, *, final: bool = False) -> None:
        now = self.clock.now()
        for source, count in self._refusals.due(float("inf") if final else now):
            log.warning("%s", summary(source, count, self._refusals.window, self._refusals.burst))

    def _here(self, req: protocol.Request) -> protocol.Here:
        """What the protocol needs to know of this node to answer ``req`` (read on the loop)."""
        records = self.core.table.exchange_records(self.clock.now()) if req.wants_peers else ()
        return protocol.Here(self.me, self.cfg.name, self.cfg.page_bytes, int(self.clock.wall() * 1000), records)

    def _sealed(self, reply: Msg, status: int = answers.OK, key: bytes | None = None) -> Answer:
        return Answer(status, self.keys.seal(protocol.encode(reply), key))

    def _error(self, remote: str, exc: Exception, key: bytes | None = None) -> Answer:
        self.refuse(remote, str(exc))
        return self._sealed(protocol.error_reply(exc), answers.BAD_REQUEST, key)
