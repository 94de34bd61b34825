"""Peer discovery: mDNS and seed lists.

Invariants:
* Every source implements ``DiscoverySource`` (``start(found, gone)`` / ``stop()``) and
  hands ``PeerCandidate`` values to the daemon: discovery only suggests where peers may
  be; it knows nothing of sync and imports nothing else of peerd (tests/test_layers.py).
* A source never raises for network conditions (the mDNS port taken, a seed that does not
  resolve): it logs once and keeps trying; a callback that raises is logged, and the source
  goes on.
* ``MdnsSource`` (python-zeroconf, slow to import) is loaded on first use, so code that
  needs only seeds or adverts (the command line) never loads it.
"""

from typing import TYPE_CHECKING, Any

from discovery.advert import SERVICE_TYPE, Advert, decode_txt, encode_txt, judge_advert
from discovery.backoff import Backoff
from discovery.netif import InterfaceChoice
from discovery.seeds import Seed, SeedSource, parse_seed, parse_seeds
from discovery.source import (
    AdvertError,
    DiscoveryError,
    DiscoverySource,
    FoundCallback,
    GoneCallback,
    PeerCandidate,
    SeedError,
)

if TYPE_CHECKING:
    from discovery.mdns import MdnsSource


def __getattr__(name: str) -> Any:
    if name == "MdnsSource":
        from discovery.mdns import MdnsSource  # noqa: PLC0415 - zeroconf only when mDNS is used

        return MdnsSource
    raise AttributeError(f"module 'discovery' has no attribute {name!r}")

__all__ = [
    "SERVICE_TYPE",
    "Advert",
    "AdvertError",
    "Backoff",
    "DiscoveryError",
    "DiscoverySource",
    "FoundCallback",
    "GoneCallback",
    "InterfaceChoice",
    "MdnsSource",
    "PeerCandidate",
    "Seed",
    "SeedError",
    "SeedSource",
    "decode_txt",
    "encode_txt",
    "judge_advert",
    "parse_seed",
    "parse_seeds",
]
