"""The return path, the node's side: links held for members nobody can call, and links kept to
reachable members when this one cannot be called (the rules are ``peerd.relaying``'s, the wire
``peerd.protocol.link``'s).

* **Relaying** (a reachable member): a link comes in on the peer port (``serve``); its hello
  must open with the fleet's key and name the member; within the caps (``relaying.Held``) it is
  welcomed, its row in the peer table becomes reachable and every push and forward includes it
  (``NodeCore.linked``). Calls to that member (pushes, rounds) go down the link (``call``) as the
  same sealed bodies an ordinary ``POST /v1`` carries, each answered on the link.
* **Linking** (this member cannot be called): one task (``keep``) waits on an event (a round
  ended, a link changed) or on the next backoff or probe, never on a polling timer; it asks a
  reachable peer to call us back (``back``) unless config.toml decides, and keeps
  ``relaying.WANT`` links open, each in a task of its own that answers the calls coming down it
  and, once up, starts a round with that member to catch up.

Invariants: the core and the tables are touched on the event loop only; a link's calls that get
no answer within ``CALL_TIMEOUT`` fail and close that link; a closed link fails every call still
waiting on it; no exception from a peer's frames ends a task (it closes that link).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import TYPE_CHECKING, Any

from discovery.seeds import format_seed
from peerd.errors import PeerError, SealError, TransportError
from peerd.protocol import (
    BACK,
    LINK,
    OK,
    Msg,
    ProtocolError,
    Request,
    decode,
    encode,
    envelope,
    link,
    probe,
    sign_reply,
    stamp,
)
from peerd.relaying import AUTO, Candidate, Connect, Drop, Held, Relays, reachability
from peerd.transport import Answer, Channel

if TYPE_CHECKING:
    from peerd.node import Node

log = logging.getLogger("peerd.node")

HELLO_TIMEOUT = 10.0  # seconds a link has to say who it is (or to be welcomed)
CALL_TIMEOUT = 15.0  # seconds a call down a link may wait for its answer
CALL_BACK_TIMEOUT = 3.0  # seconds the call back of a ``back`` probe may take
UNKNOWN_RETRY = 30.0  # seconds before asking again when no peer could answer a probe


class ServedLink:
    """One link a member holds to us: calls go down it, answers come back by id."""

    def __init__(self, channel: Channel, addr: str) -> None:
        self.channel = channel
        self.addr = addr
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Answer]] = {}

    async def call(self, body: bytes) -> Answer:
        rid = next(self.ids) % link.MAX_ID
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        try:
            await self.channel.send(link.call(rid, body))
            async with asyncio.timeout(CALL_TIMEOUT):
                return await fut
        except TimeoutError:
            await self.channel.close(1011, "no answer in time")
            raise TransportError("no answer in time on its link (timed out)", peer=self.addr, kind="timeout") from None
        finally:
            self.waiting.pop(rid, None)

    async def read(self) -> str:
        """Answers until the link closes; returns why it closed."""
        while (data := await self.channel.receive()) is not None:
            try:
                frame = link.parse_frame(data)
            except ProtocolError as exc:
                await self.channel.close(1002, str(exc))
                continue
            if isinstance(frame, link.Reply) and (fut := self.waiting.get(frame.rid)) is not None and not fut.done():
                fut.set_result(Answer(frame.status, frame.body))
        why = link.close_reason(self.channel.close_code, self.channel.close_reason)
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(TransportError(f"link closed ({why})", peer=self.addr, kind="unreachable"))
        return why


class RelayLinks:
    def __init__(self, node: Node) -> None:
        self.node = node
        cfg = node.cfg
        self.held = Held(cfg.relay_links_per_address, cfg.relay_links)
        self.relays = Relays(node.rng)
        self.served: dict[bytes, ServedLink] = {}
        self.probed: bool | None = None
        self.probed_at: float | None = None
        self.probing = False
        self.channels: dict[str, Channel] = {}
        self._evt = asyncio.Event()

    # -- relaying for others ------------------------------------------------------------------

    def link_for(self, node: bytes | None) -> ServedLink | None:
        return None if node is None else self.served.get(node)

    async def serve(self, channel: Channel, remote: str) -> None:
        """A link a member opened to us, held until it closes."""
        node, keys = self.node, self.node.keys
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):
                data = await channel.receive()
            frame = link.parse_frame(data or b"")
            if not isinstance(frame, link.Hello):
                raise ProtocolError("a link must open with a hello")
            plain, key = keys.open(frame.sealed)
            env = link.read_hello(plain)
            if key != keys.current or env.sender in node.core.removed:
                raise SealError("not sealed with the fleet's current key")
        except (TimeoutError, ProtocolError, SealError) as exc:
            node.refuse(remote, f"link refused: {exc or 'no hello in time'}")
            await channel.close(link.NOT_MEMBER, str(exc) or "no hello in time")
            return
        assert env.sender is not None and env.port is not None
        if (why := self.held.admit(env.sender, remote)) is not None:
            node.refuse(remote, f"link refused: {why}")
            await channel.close(link.FULL, why)
            return
        served = ServedLink(channel, format_seed(remote, env.port))
        old = self.served.get(env.sender)
        self.served[env.sender] = served
        if old is not None:
            await old.channel.close(link.REPLACED, "the member linked again")
        welcome = sign_reply({"t": OK}, me=node.me, kind=LINK, clock_ms=0)
        why = "closed"
        try:
            await channel.send(link.welcome(keys.seal(encode(welcome))))
            node.run(node.core.linked(remote, env, node.clock.now()))
            why = await served.read()
        except TransportError as exc:
            why = str(exc)
        finally:
            if self.served.get(env.sender) is served:
                del self.served[env.sender]
                self.held.release(env.sender)
                node.run(node.core.unlinked(env.sender, why))

    async def answer_back(self, remote: str, req: Request) -> Msg:
        """A ``back`` probe: call the caller at its advertised address once; say whether it answered
        as the node that asked."""
        reached = False
        if req.envelope.port is not None and remote:
            addr = format_seed(remote, req.envelope.port)
            node = self.node
            body = node.keys.seal(encode(stamp(probe(), me=node.me, port=node.peer_port)))
            try:
                async with asyncio.timeout(CALL_BACK_TIMEOUT):
                    ans = await node.transport.post(addr, body)
                reply = decode(node.keys.open(ans.body)[0]) if ans.status == 200 else {}
                reached = envelope(reply).sender == req.envelope.sender
            except (TimeoutError, TransportError, SealError, ProtocolError):
                reached = False
        return sign_reply(link.back_reply(reached), me=self.node.me, kind=BACK,
                                   clock_ms=int(self.node.clock.wall() * 1000))

    # -- linking to others (when nobody can call us) ----------------------------------------------

    def poke(self) -> None:
        """Something changed (a round ended, a link came or went): look again."""
        self._evt.set()

    @property
    def reachable(self) -> bool | None:
        return reachability(self.node.cfg.reachable, self.probed)

    async def keep(self) -> None:
        clock = self.node.clock
        while True:
            try:
                wait = self._step(clock.now())
            except Exception as exc:  # the links must outlive a bug: the next event tries again
                self.node.run(self.node.core.bug("keeping relay links", exc))
                wait = None
            await clock.wait(self._evt, wait)
            self._evt.clear()

    def _candidates(self) -> list[Candidate]:
        """Live peers we reach directly that may relay: not linked to us themselves, and of wire 3 or
        later (the first release knows neither ``back`` nor links, and would log each as a refusal)."""
        core = self.node.core
        return [Candidate(p.addr, p.node, p.source) for p in core.table.live()
                if p.node is not None and p.node not in core.relayed and p.takes_every_op]

    def _step(self, now: float) -> float | None:
        """Probe when due, drop or open links; the seconds until something is due again."""
        waits: list[float] = []
        if self.node.cfg.reachable == AUTO and not self.probing:
            every = self.node.cfg.relay_probe_interval
            every = every if self.probed is not None else min(every, UNKNOWN_RETRY)
            due = self.probed_at is None or now - self.probed_at >= every
            candidates = self._candidates()
            if due and candidates:
                self.probing = True
                self.node.spawn(self._probe(candidates), transient=False)
            elif not due and self.probed_at is not None:
                waits.append(every - (now - self.probed_at))
        commands: list[Connect | Drop] = [*self.relays.set_need(self.reachable is False)]
        for cmd in [*commands, *self.relays.plan(now, self._candidates())]:
            if isinstance(cmd, Drop):
                ch = self.channels.pop(cmd.addr, None)
                if ch is not None:
                    self.node.spawn(ch.close(1000, "this member can be called again"))
            elif isinstance(cmd, Connect):
                self.node.spawn(self._hold(cmd.addr))
        if (due_in := self.relays.next_due(now)) is not None:
            waits.append(due_in)
        return min(waits) if waits else None

    async def _probe(self, candidates: list[Candidate]) -> None:
        node = self.node
        got: bool | None = None
        try:
            for cand in candidates[:2]:
                peer = node.core.table.peers.get(cand.addr)
                if peer is None:
                    continue
                with contextlib.suppress(PeerError):
                    got = link.reached(await node.call(peer, link.back_message()))
                if got is not None:
                    break
        finally:
            self.probing = False
            self.probed_at = node.clock.now()
            if got is not None and got != self.probed:
                log.info("%s", "other members can call this one at its address: ordinary pushes" if got else
                         "other members cannot call this one at its address (behind NAT?): keeping links to "
                         "reachable members, which push down them")
            self.probed = got if got is not None else self.probed
            self.poke()

    async def _hold(self, addr: str) -> None:
        """One link to a relaying member, from opening it to its end."""
        node, why, refused = self.node, "closed", False
        try:
            channel = await node.transport.open_link(addr, node.cfg.relay_keepalive)
        except TransportError as exc:
            self.relays.down(addr, node.clock.now(), str(exc))
            self.poke()
            return
        self.channels[addr] = channel
        try:
            why, refused = await self._run_link(addr, channel)
        except (TransportError, ProtocolError, SealError, TimeoutError) as exc:
            why = str(exc) or "no welcome in time"
        finally:
            await channel.close()
            dropped = self.channels.pop(addr, None) is None
            if any(t.addr == addr and t.up for t in self.relays.via()) or not dropped:
                log.info("link to relaying member %s closed: %s", addr, why)
            self.relays.down(addr, node.clock.now(), why, refused=refused)
            self.poke()

    async def _run_link(self, addr: str, channel: Channel) -> tuple[str, bool]:
        node = self.node
        hello = stamp(link.link_message(), me=node.me, port=node.peer_port)
        await channel.send(link.hello(node.keys.seal(encode(hello))))
        async with asyncio.timeout(HELLO_TIMEOUT):
            first = await channel.receive()
        if first is None:
            return link.close_reason(channel.close_code, channel.close_reason), channel.close_code == link.FULL
        frame = link.parse_frame(first)
        if not isinstance(frame, link.Welcome):
            raise ProtocolError("the relaying member did not welcome the link")
        node.keys.open(frame.sealed)
        self.relays.up(addr, node.clock.now())
        log.info("linked to relaying member %s: it pushes to this member down the link", addr)
        peer = node.core.table.peers.get(addr)
        if peer is not None:
            node.run(node.core.round_now(peer))  # what it could not push us while there was no link
        host = addr.rsplit(":", 1)[0].strip("[]")
        while (data := await channel.receive()) is not None:
            frame = link.parse_frame(data)
            if isinstance(frame, link.Call):
                node.spawn(self._answer(channel, frame, host))
        return link.close_reason(channel.close_code, channel.close_reason), False

    async def _answer(self, channel: Channel, frame: link.Call, host: str) -> None:
        ans = await self.node.answer(frame.sealed, host)
        with contextlib.suppress(TransportError):  # the link closed meanwhile: its caller fails by itself
            await channel.send(link.answer(frame.rid, ans.status, ans.body))

    async def close(self) -> None:
        """Close every link, ours and those held for others (the node stops)."""
        for ch in [*self.channels.values(), *(s.channel for s in self.served.values())]:
            await ch.close(1001, "the member stops")
        self.channels.clear()

    # -- reporting ------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """Which members relay for us and for whom we relay, for people."""
        now = self.node.clock.now()
        names: dict[bytes | None, str | None] = {p.node: p.name for p in self.node.core.table.peers.values()}
        return {
            "reachable": self.reachable, "setting": self.node.cfg.reachable,
            "via": [{"address": t.addr, "node_id": t.node.hex() if t.node else None,
                     "name": names.get(t.node), "up_for": None if t.since is None else round(now - t.since, 1)}
                    for t in self.relays.via()],
            "relaying_for": [{"address": s.addr, "node_id": n.hex(), "name": names.get(n)}
                             for n, s in sorted(self.served.items())],
            "waiting": [{"address": t.addr, "last_error": t.last_error}
                        for t in self.relays.targets.values() if not t.up and t.last_error],
        }
