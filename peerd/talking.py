"""Calling peers: one request across a key rotation, rounds, pushes and peer exchanges.

Invariants:
* Every request is sealed with the current key and stamped with our envelope; what its answer
  means is ``protocol.answers``', and what to do about it ``peerd.calling``'s table: a request
  is sent at most twice, and ends in a reply or a ``PeerError`` naming the peer.
* A round (``protocol.client_round``) steps on a worker thread (it reads and writes the
  replica); its requests and the peer table are handled on the loop, and what came of it goes
  to the core (``round_done`` / ``round_failed``), which keeps the table and tells failures once.
* A drain sends the peer's queued batches one by one until its queue is empty; a failed push
  drops the queue (a round repairs it). No exception from a peer's data ends a task.
"""

from __future__ import annotations

import logging

from peerd import calling, memory, protocol
from peerd.calling import CaughtUp, Context, Deliver, Fail, Send, TellRotation, Told
from peerd.errors import PeerError, SealError
from peerd.nodebase import NodeBase
from peerd.peers import Peer
from peerd.protocol import Msg, ProtocolError, RoundResult, answers, versions
from peerd.transport import Answer
from replica.errors import RemoteError

log = logging.getLogger("peerd.node")

TRIM_AFTER_PULLED = 5_000  # ops pulled in one round after which freed memory goes back to the system
PROGRESS_LOG_EVERY = 2.0


class Talking(NodeBase):
    async def call(self, peer: Peer, msg: Msg) -> Msg:
        """Send one sealed request; the reply, or PeerError saying what went wrong (``peerd.calling``:
        across a key rotation the request is sent once more, after telling the peer of it or after
        catching up with the one it told us of)."""
        state = calling.State.SENT
        action: calling.Action = Send()
        while True:
            ctx = Context(can_tell=bool(self.keys.previous) and peer.node not in self.core.removed,
                          removed=self.keys.removed)
            if isinstance(action, Send):
                event: calling.Event = await self._send(peer, msg)
            elif isinstance(action, TellRotation):
                event = Told(await self._tell_rotation(peer))
            elif isinstance(action, calling.CatchUp):
                event = CaughtUp(await self._catch_up(peer, action.ops))
            elif isinstance(action, Deliver):
                return action.reply
            else:
                assert isinstance(action, Fail)
                raise PeerError(action.reason, peer=peer.addr)
            state, action = calling.step(state, event, ctx)

    async def _send(self, peer: Peer, msg: Msg) -> answers.Meaning:
        body = self.keys.seal(protocol.encode(protocol.stamp(msg, me=self.me, port=self.peer_port)))
        return self._read(peer, await self._post(peer, body))

    def _read(self, peer: Peer, answer: Answer) -> answers.Meaning:
        """What an answer means; the versions it states go to the peer table first."""
        if answer.status == answers.WRONG_KEY:
            return answers.WrongKey()
        try:
            reply = protocol.decode(self.keys.open(answer.body)[0])
        except (SealError, ProtocolError) as exc:
            return answers.meaning(answer.status, None, str(exc))
        self.run(self.core.stated(peer, versions.stated(reply)))
        if peer.incompatible:
            return answers.Unreadable(str(versions.negotiate(peer.wire or ())))
        return answers.meaning(answer.status, reply)

    async def _tell_rotation(self, peer: Peer) -> bool:
        """A peer refused our key: if it is a member on a key we used before, hand it every membership
        op we hold sealed with that key, and take the ones it answers with (``Serving._answer_old_key``).
        True when a key opened there (then both sides decide on the same set: send again)."""
        ops = await self.offload(self.rep.membership_ops)
        if not ops:
            return False
        push = protocol.encode(protocol.stamp(answers.push(ops), me=self.me, port=self.peer_port))
        for key in self.keys.previous:
            answer = await self._post(peer, self.keys.seal(push, key))
            if answer.status == answers.OK:
                log.info("told %s of the fleet's key rotation", peer.addr)
                meant = self._read(peer, answer)
                if isinstance(meant, answers.Rekey):
                    await self._take_rotation(peer, meant.ops)
                return True
        return False

    async def _catch_up(self, peer: Peer, ops: list[bytes]) -> bool:
        """Apply the membership ops a peer answered with (it opened our request only with a key the
        fleet used before) and hand it ours; True when that gave us a new key to retry with."""
        before = self.keys.current
        await self._take_rotation(peer, ops)
        if self.keys.current == before:
            await self._tell_rotation(peer)  # it may be the one behind, or hold the other side of a conflict
        if self.keys.current != before:
            log.info("caught up with the fleet's key rotation from %s", peer.addr)
        return self.keys.current != before

    async def _take_rotation(self, peer: Peer, ops: list[bytes]) -> None:
        try:
            await self.offload(self.rep.apply, [raw for raw in ops if protocol.is_membership_op(raw)])
        except RemoteError as exc:
            raise PeerError(f"answered with a key rotation that does not verify: {exc}", peer=peer.addr) from None
        await self.refresh_keys()

    async def _post(self, peer: Peer, body: bytes) -> Answer:
        linked = self.relay.link_for(peer.node)  # a member nobody can call: down its link to us
        return await (linked.call(body) if linked is not None else self.transport.post(peer.addr, body))

    # -- rounds ----------------------------------------------------------------------------------

    async def sync_with(self, peer: Peer) -> RoundResult:
        """One push-pull round with ``peer``; the core keeps the peer table either way."""
        marks = dict(peer.pushed)  # the round runs on worker threads; the table is the loop's
        gen = protocol.client_round(self.rep, budget=self.cfg.page_bytes, pushed=marks)
        before = await self.our_vector()
        try:
            await self.snapshots.before_round(peer)  # far behind a peer of wire 3 or later: a snapshot first
            req, result = await self.offload(protocol.step, gen, None)
            while req is not None:
                reply = await self.call(peer, req)
                if not self.core.replied(peer, protocol.envelope(reply).sender, self.clock.now()):
                    raise PeerError("is this node itself", peer=peer.addr)
                req, result = await self.offload(protocol.step, gen, reply)
                await self._track_progress(peer, reply)
        except (PeerError, RemoteError) as exc:
            self.run(self.core.round_failed(peer, exc, self.clock.now()))
            if peer.source == "seed" and self.seeds is not None:
                self.seeds.report_failure(peer.host, peer.port)
            raise PeerError(str(exc), peer=peer.addr) from None
        finally:
            if self.catchup is not None and self.catchup.peer == peer.addr:
                self._log_progress(self.catchup, final=True)
                self.catchup = None
        assert result is not None
        if peer.source == "seed" and self.seeds is not None:
            self.seeds.report_success(peer.host, peer.port)
        self.run(self.core.round_done(peer, result, marks, before, self.clock.now()))
        await self.note_own_history(peer.addr)
        if result.pulled >= TRIM_AFTER_PULLED:
            await self.offload(memory.trim)  # a big pull leaves freed pages in malloc (peerd.memory)
        return result

    async def _track_progress(self, peer: Peer, reply: Msg) -> None:
        """Follow a long catch-up: how much of what the peer had we now hold."""
        theirs = protocol.reply_vector(reply)
        if theirs is not None and self.catchup is None:
            self.catchup = protocol.start_catchup(peer.addr, theirs, await self.our_vector(), self.clock.now())
        elif self.catchup is not None and self.catchup.peer == peer.addr:
            self.catchup.advance(await self.our_vector())
            if self.clock.now() - self.catchup.logged >= PROGRESS_LOG_EVERY:
                self._log_progress(self.catchup)

    def _log_progress(self, prog: protocol.Progress, *, final: bool = False) -> None:
        now = self.clock.now()
        prog.logged = now
        d = prog.to_dict(now)
        if final:
            log.info("caught up from %s: %d of %d ops in %.1f s", d["peer"], d["done"], d["total"], now - prog.started)
        else:
            log.info("catching up from %s: %s%% (%d/%d ops, %s ops/s, ETA %s s)",
                     d["peer"], d["percent"], d["done"], d["total"], d["rate"], d["eta"])

    async def exchange_peers(self, peer: Peer) -> None:
        """Tell ``peer`` whom we reach and learn whom it reaches; PeerError if that fails."""
        records = self.core.table.exchange_records(self.clock.now())
        reply = await self.call(peer, protocol.peers_message(self.cfg.name, records))
        try:
            learnt = protocol.learn(reply)
        except ProtocolError as exc:
            raise PeerError(f"sent a malformed peer list: {exc}", peer=peer.addr) from None
        self.run(self.core.exchanged(peer, learnt, self.clock.now()))

    async def _round(self, peer: Peer, *, exchange: bool) -> None:
        """A round plus, on first contact and now and then, a peer exchange."""
        first_contact = peer.last_sync is None
        found_work = False
        try:
            result = await self.sync_with(peer)  # a failure is told and recorded there
            found_work = first_contact or not result.same
            if first_contact or exchange:
                try:
                    await self.exchange_peers(peer)
                except Exception as exc:  # like a refused exchange, it leaves the peer reachable
                    self.run(self.core.exchange_failed(peer, exc, self.clock.now()))
        except PeerError:
            pass  # recorded and told by sync_with
        except Exception as exc:
            self.run(self.core.peer_failed(peer, "sync", exc, self.clock.now()))
        finally:
            self.core.round_over(peer, found_work=found_work)
            self.relay.poke()  # a peer that answers may be one to link to, or to ask for a call back

    async def _drain(self, peer: Peer) -> None:
        """Send the peer's queued ops, a batch at a time, until its queue is empty."""
        while (batch := self.core.outbox.take(peer.addr)) is not None:
            try:
                await self.call(peer, answers.push(batch))
            except Exception as exc:  # a round repairs what is dropped here
                self.run(self.core.push_failed(peer, exc, self.clock.now()))
            else:
                self.run(self.core.pushed(peer, batch, self.clock.now()))
