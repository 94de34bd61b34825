"""Following the fleet's keys and membership as their ops land.

Membership is in the replica (``replica.membership``, ``replica.fleet``); the node seals with
the current fleet key (``peerd.keyring``) and follows rotations: it switches key, fleet id and
mDNS advert, saves the ring (``on_keys``), never calls a removed node, and the member whose
rotation won re-rotates when that rotation missed a member or reached a removed one.

Invariants:
* One refresh at a time, each on what the one before left (``_keys_lock``), so a rotation is
  never mended twice.
* A node knows itself to the fleet by its full key and name: its own ``admit`` op, written once
  and again when its name changes, so a rotation seals the new key to it even if it never wrote.
* Replica reads and writes run off the event loop (``offload``).
"""

from __future__ import annotations

import dataclasses
import logging

from discovery import SeedSource
from discovery.source import Sighting
from peerd import keyring, lan, protocol
from peerd.calling import REMOVED
from peerd.config import DEFAULT_PORT, Config, fleet_id, new_fleet_key
from peerd.keyring import KeyRing
from peerd.nodebase import NodeBase
from replica.fleet import FleetView

log = logging.getLogger("peerd.node")

MEND_STAGGER = 30.0  # seconds between one member's turn to mend the fleet key and the next one's


class Following(NodeBase):
    async def refresh_keys(self) -> None:
        """Follow the fleet's membership: the key to seal with, removals, mending a rotation."""
        async with self._keys_lock:
            await self._refresh_keys()

    async def _refresh_keys(self) -> None:
        self._fleet_seen = self.rep.fleet_changes
        mine = await self.offload(self.rep.fleet_keys)
        assert mine.view is not None
        ring = keyring.derive(self.cfg.fleet_key, self.cfg.previous_fleet_keys, mine.opened, mine.current,
                              epoch=mine.epoch, removed=mine.removed)
        st = mine.view.standing
        self.core.set_removed(frozenset(protocol.short(k) for k in st.removed))
        self.admitted_here = st.counts(self.rep.node_key)
        self.conflicts = sorted(k.hex() for k in st.conflicts)
        if ring != self.keys:
            await self._switch(ring)
        await self._mend(mine.view)

    async def _register(self) -> None:
        """Make this node known to the fleet by its full key and name (an ``admit`` op of itself)."""
        view = await self.offload(self.rep.fleet_view)
        mine = view.admitted.get(self.rep.node_key)
        if not self.keys.removed and (mine is None or mine.name != self.cfg.name):
            await self.offload(self.rep.admit_node, self.rep.node_key, self.cfg.name, self.keys.fleet_id)

    async def _switch(self, ring: KeyRing) -> None:
        old, self.keys = self.keys, ring
        self.cfg = dataclasses.replace(self.cfg, fleet_key=ring.current, previous_fleet_keys=ring.previous)
        if ring.removed and not old.removed:
            log.error(REMOVED)
        elif ring.current != old.current:
            log.warning("the fleet key was rotated (epoch %d): now fleet %s, was %s", ring.epoch, ring.fleet_id,
                        old.fleet_id)
        self.others.forget_fleets({ring.fleet_id, *ring.previous_ids})
        if self.mdns is not None:
            await self.mdns.set_fleet(ring.fleet_id, ring.previous_ids)
        if self.on_keys is not None:
            self.on_keys(ring)
        self._wake.set()  # peers still on the old key hear of it at once

    async def _mend(self, view: FleetView) -> None:
        """Re-rotate when the key in force left out a member (one let in on an older key, or whose
        ops arrived later) or is held by a node since removed (a removal that lost a conflict, or one
        the fleet never rotated after). Members take turns (``FleetView.menders``): the winner's
        origin at once, each next one ``MEND_STAGGER`` seconds later if the key still wants mending,
        so a mender that is away does not leave the fleet on a key a removed node holds."""
        missing, stale = view.gaps()
        order = view.menders()
        if self.keys.removed or not (missing or stale) or self.rep.node_key not in order:
            self._mend_due = None
            return
        turn, now = order.index(self.rep.node_key), self.clock.now()
        if self._mend_due is None:
            self._mend_due = now + turn * MEND_STAGGER
            if turn:  # the timer is cancelled with the others when the node stops
                self._flushes.add(self.clock.call_later(turn * MEND_STAGGER, self._look_again))
        if now < self._mend_due:
            return
        self._mend_due = None
        key = new_fleet_key()
        log.warning("re-rotating the fleet key: the key in force missed %s and is held by removed %s",
                    sorted(k.hex()[:16] for k in missing) or "no member",
                    sorted(k.hex()[:16] for k in stale) or "none")
        await self.offload(self.rep.rotate, key, fleet_id(key))
        await self._refresh_keys()  # take our own new key now (inside the refresh already under way)

    def _look_again(self) -> None:
        self.spawn(self.refresh_keys(), transient=True)

    async def use_config(self, cfg: Config) -> None:
        """The home's config changed under a running daemon (``peerd join``): take its fleet key and
        seeds. Another fleet's key starts the peer table afresh."""
        other_fleet = cfg.fleet_key not in (self.keys.current, *self.keys.previous)
        self.cfg = dataclasses.replace(self.cfg, fleet_key=cfg.fleet_key, previous_fleet_keys=cfg.previous_fleet_keys,
                                       seeds=(*cfg.seeds, *self.cfg.seeds))
        if other_fleet:
            log.warning("joined fleet %s; leaving fleet %s", cfg.fleet_id, self.keys.fleet_id)
            self.core.new_fleet()
            self.others.forget_fleets({cfg.fleet_id})
        if self.seeds is not None:
            await self.seeds.stop()
            self.seeds = SeedSource(list(self.cfg.seeds), default_port=DEFAULT_PORT)
            await self.seeds.start(self._found, self._gone)
        self.keys = KeyRing(self.cfg.fleet_key, self.cfg.previous_fleet_keys)
        await self.refresh_keys()
        if self.mdns is not None:
            await self.mdns.set_fleet(self.keys.fleet_id, self.keys.previous_ids)
        self._wake.set()

    def _other_fleet(self, seen: Sighting) -> None:
        """An mDNS advert of another fleet id: a member on another key (talk to it: one of us
        catches up), or another fleet (tell people, once)."""
        self.spawn(self._judge_other(seen))

    async def _judge_other(self, seen: Sighting) -> None:
        cand = seen.candidate
        node = bytes.fromhex(cand.node_id) if cand.node_id else b""
        view = await self.offload(self.rep.fleet_view)
        if node in view.members:
            self._found(cand)
            return
        addr = f"{cand.host}:{cand.port}"
        if self.others.saw(seen.fleet_id, cand.node_id or "", seen.name, addr, self.clock.wall()):
            log.warning(lan.describe(seen.fleet_id, seen.name, cand.node_id or "?", addr))
