"""What the mDNS adverts in view mean: which are peers of our fleet, which are other fleets, and
whom to tell. ``MdnsSource`` owns the sockets and feeds this the adverts it resolves.

Invariants:
- An advert is a peer only if ``judge_advert`` accepts it (our fleet id or one of ``also``, a
  protocol version in common, not our own node) and it has an IPv4 address: such a candidate is
  handed to ``found`` when new or changed, and its node to ``gone`` once no advert of that node
  is left in view.
- An advert of our fleet with no version in common goes to ``other_version`` once per advert and
  version list (resolving it again does not repeat it), never to ``found``.
- Adverts of other fleets are ``Sighting`` values for ``other`` (each time one changes) and their
  departures go to ``other_gone``; they are never ``found``.
- No sockets, no zeroconf and no asyncio: it judges decoded TXT fields and addresses. A callback
  that raises is logged (``call_safely``), never raised into the source.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from ipaddress import ip_address

from discovery.advert import Advert, decode_txt, judge_advert, pick_host
from discovery.source import (
    AdvertError,
    FoundCallback,
    GoneCallback,
    PeerCandidate,
    Sighting,
    SightingCallback,
    call_safely,
)

log = logging.getLogger("discovery.mdns")

Properties = Mapping[bytes, bytes | None]


class LanView:
    """The adverts of one mDNS browser, judged against our own ``advert``."""

    def __init__(self, advert: Advert, also: Sequence[str] = (), *, other: SightingCallback | None = None,
                 other_gone: GoneCallback | None = None, other_version: FoundCallback | None = None) -> None:
        self.advert = advert
        self.also = tuple(also)
        self.found: FoundCallback | None = None
        self.gone: GoneCallback | None = None
        self._other, self._other_gone, self._other_version = other, other_gone, other_version
        self._told_version: set[tuple[str, tuple[int, ...]]] = set()
        self._peers: dict[str, PeerCandidate] = {}
        self._others: dict[str, Sighting] = {}

    def names(self, *, everyone: bool = False) -> list[str]:
        """The advert names of our peers in view (``everyone``: those of other fleets too)."""
        return list(dict.fromkeys([*self._peers, *(self._others if everyone else ())]))

    def saw(self, name: str, properties: Properties, addresses: Sequence[str],
            local_networks: Sequence[str]) -> None:
        """An advert resolved (or re-read from the cache): hand over what it now means."""
        candidate = self._candidate(name, properties, addresses, local_networks)
        if candidate is None:
            self._drop_peer(name)
        elif self._peers.get(name) != candidate:
            self._peers[name] = candidate
            if self.found is not None:
                call_safely(log, self.found, candidate)

    def removed(self, name: str) -> None:
        """An advert left the network."""
        self._drop_peer(name)
        self._drop_other(name)

    def forget(self) -> None:
        """We can no longer see the LAN: report every mDNS peer and other fleet as gone."""
        peers, self._peers = self._peers, {}
        for node_id in dict.fromkeys(c.node_id for c in peers.values() if c.node_id):
            self._call_gone(node_id)
        for name in list(self._others):
            self._drop_other(name)

    def clear(self) -> None:
        """Stopped: forget everything without telling anyone."""
        self._peers.clear()
        self._others.clear()

    def _candidate(self, name: str, properties: Properties, addresses: Sequence[str],
                   local_networks: Sequence[str]) -> PeerCandidate | None:
        try:
            advert = decode_txt(properties)
        except AdvertError as exc:
            log.debug("ignoring %s: %s", name, exc)
            return None
        verdict = judge_advert(advert, own_node_id=self.advert.node_id, fleet_id=self.advert.fleet_id,
                               protocol_versions=self.advert.spoken(), also=self.also)
        # Sorted: mDNS caches hold records unordered; a stable order avoids spurious re-finds.
        ordered = tuple(sorted(addresses, key=ip_address))
        candidate = None if not ordered else PeerCandidate(
            host=pick_host(ordered, local_networks), port=advert.port, source="mdns", node_id=advert.node_id,
            addresses=ordered, wire=tuple(sorted(advert.spoken())),
        )
        if verdict == "other-version" and candidate is not None and self._other_version is not None:
            told = (name, candidate.wire)  # once per advert and version list: re-resolving says it again
            if told not in self._told_version:
                self._told_version.add(told)
                call_safely(log, self._other_version, candidate)
        if verdict == "other-fleet" and candidate is not None:
            self._update_other(name, Sighting(candidate, advert.fleet_id, advert.name))
        else:
            self._drop_other(name)
        if verdict != "accept":
            log.debug("ignoring %s: %s", name, verdict)
            return None
        return candidate

    def _update_other(self, name: str, sighting: Sighting) -> None:
        if self._others.get(name) != sighting:
            self._others[name] = sighting
            if self._other is not None:
                call_safely(log, self._other, sighting)

    def _drop_other(self, name: str) -> None:
        gone = self._others.pop(name, None)
        if gone is not None and gone.candidate.node_id and self._other_gone is not None:
            call_safely(log, self._other_gone, gone.candidate.node_id)

    def _drop_peer(self, name: str) -> None:
        candidate = self._peers.pop(name, None)
        if candidate is None or candidate.node_id is None:
            return
        if all(c.node_id != candidate.node_id for c in self._peers.values()):
            self._call_gone(candidate.node_id)

    def _call_gone(self, node_id: str) -> None:
        if self.gone is not None:
            call_safely(log, self.gone, node_id)
