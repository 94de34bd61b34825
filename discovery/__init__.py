"""Peer discovery: mDNS and seed lists.

Every source implements ``DiscoverySource`` (``start(found, gone)`` /
``stop()``) and hands ``PeerCandidate`` values to the daemon. Discovery only
suggests where peers may be; it knows nothing of sync and imports nothing
else of peerd.
"""

from discovery.advert import SERVICE_TYPE, Advert, decode_txt, encode_txt, judge_advert
from discovery.backoff import Backoff
from discovery.mdns import MdnsSource
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
