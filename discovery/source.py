"""The shape every discovery source shares: candidates out, nothing in.

Invariants:
- A source only *suggests* peers. It never connects, never syncs and never
  decides whether a candidate is a real fleet member; the daemon does that
  (the peer protocol is sealed with the fleet key, adverts are not).
- Callbacks are plain functions called on the event loop that runs the
  source. A callback that raises is logged and does not stop the source.
- ``found`` may be called again for a candidate already handed over (for
  example when its addresses change); consumers de-duplicate by
  ``node_id`` when present, else by ``(host, port)``.
- ``gone(node_id)`` is only called for candidates that carried a node id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from replica.errors import InvalidArgument, PeerdError, RemoteError

__all__ = [
    "AdvertError",
    "CandidateSource",
    "DiscoveryError",
    "DiscoverySource",
    "FoundCallback",
    "GoneCallback",
    "PeerCandidate",
    "SeedError",
    "Sighting",
    "SightingCallback",
    "call_safely",
]

CandidateSource = Literal["mdns", "seed", "exchange"]


class DiscoveryError(PeerdError):
    """Base class of every error raised by the discovery package."""


class SeedError(DiscoveryError, InvalidArgument):
    """A seed entry is not ``HOST:PORT`` / ``[IPV6]:PORT`` or names an invalid host or port."""


class AdvertError(DiscoveryError, RemoteError, ValueError):
    """An mDNS advert (TXT record) is malformed or cannot be built from the given values."""


@dataclass(frozen=True)
class PeerCandidate:
    """A place where a fleet peer may be listening.

    ``host`` is what to dial: an IP literal (no brackets) for mDNS candidates,
    the host exactly as the user wrote it (name or IP literal) for seeds.
    ``addresses`` are the IP addresses known for it right now (resolved for
    seeds, advertised for mDNS); empty when unknown. ``node_id`` is set when
    the source learnt it (mDNS adverts carry it; seeds do not), and so is
    ``wire``, the protocol versions it advertises.
    """

    host: str
    port: int
    source: CandidateSource
    node_id: str | None = None
    addresses: tuple[str, ...] = ()
    wire: tuple[int, ...] = ()  # the wire versions it advertises (empty: not known)

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"peer port must be 1..65535, got {self.port}")
        if not self.host:
            raise ValueError("peer host must not be empty")


@dataclass(frozen=True)
class Sighting:
    """A peerd node of another fleet seen on the LAN (or, while scanning, of any fleet)."""

    candidate: PeerCandidate
    fleet_id: str
    name: str | None = None


FoundCallback = Callable[[PeerCandidate], None]
SightingCallback = Callable[[Sighting], None]
GoneCallback = Callable[[str], None]


class DiscoverySource(Protocol):
    """A source of peer candidates (mDNS, a seed list, peer exchange).

    ``start`` returns promptly; the source keeps working in background tasks
    on the running loop until ``stop``. ``stop`` is idempotent, cancels the
    background work and releases sockets; after it no callback is called.
    """

    async def start(self, found: FoundCallback, gone: GoneCallback) -> None:
        """Begin discovering; hand candidates to ``found``, departures to ``gone``."""
        ...

    async def stop(self) -> None:
        """Stop discovering and release everything the source holds."""
        ...


_T = TypeVar("_T")


def call_safely(logger: logging.Logger, callback: Callable[[_T], None], arg: _T) -> None:
    """Call a consumer callback; log (never propagate) what it raises."""
    try:
        callback(arg)
    except Exception:
        logger.exception("discovery callback %r raised; continuing", callback)
