"""What discovery shows of other fleets on this LAN, kept for people (log, status, doctor, dashboard).

Invariants: pure values with the time passed in; at most ``MAX_NODES`` nodes kept (the oldest
sighting goes first); ``saw`` says whether a fleet is new, so the daemon logs each fleet once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 64


@dataclass
class Sighted:
    fleet_id: str
    node_id: str
    name: str | None
    address: str
    first_seen: float
    last_seen: float


@dataclass
class OtherFleets:
    nodes: OrderedDict[str, Sighted] = field(default_factory=OrderedDict)  # by node id
    told: set[str] = field(default_factory=set)  # fleets already logged

    def saw(self, fleet_id: str, node_id: str, name: str | None, address: str, now: float) -> bool:
        """Record a sighting; True the first time this fleet is seen."""
        old = self.nodes.pop(node_id, None)
        self.nodes[node_id] = Sighted(fleet_id, node_id, name, address, old.first_seen if old else now, now)
        while len(self.nodes) > MAX_NODES:
            self.nodes.popitem(last=False)
        new = fleet_id not in self.told
        self.told.add(fleet_id)
        return new

    def gone(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)

    def forget_fleets(self, fleet_ids: set[str]) -> None:
        """Fleets that turned out to be ours (a key rotation): not another fleet after all."""
        for node_id in [n for n, s in self.nodes.items() if s.fleet_id in fleet_ids]:
            del self.nodes[node_id]

    def report(self, now: float) -> list[dict[str, Any]]:
        """One entry per fleet, its nodes newest first."""
        fleets: dict[str, list[Sighted]] = {}
        for s in reversed(self.nodes.values()):
            fleets.setdefault(s.fleet_id, []).append(s)
        return [{"fleet_id": fid, "join": f"peerd join --lan --fleet {fid}",
                 "nodes": [{"name": s.name, "node_id": s.node_id[:16], "address": s.address,
                            "seen_ago": round(now - s.last_seen, 1)} for s in nodes]}
                for fid, nodes in fleets.items()]


def describe(fleet_id: str, name: str | None, node_id: str, address: str) -> str:
    """The one log line about another fleet on this LAN."""
    who = f"{name} ({node_id[:16]})" if name else node_id[:16]
    return (f"another peerd fleet {fleet_id} is on this LAN (node {who} at {address}); to join it, run "
            f"`peerd join --lan` on this machine and approve on one of its members (`peerd requests`, "
            f"`peerd approve CODE`); to bring that machine into this fleet, run `peerd join --lan` there "
            f"and approve here")
