"""This machine's address as other machines on the network reach it: what ``peerd invite``
puts in a token and what a daemon bound to all interfaces shows as its peer address.

Invariants: nothing is sent (connecting a UDP socket only asks the kernel for a route);
the answer is never an unspecified address (``0.0.0.0``, ``::``); an address of an
interface that is up is preferred to loopback, which is the answer only when the machine
has no other.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

from discovery.netif import LocalAddress, read_local_addresses

UNSPECIFIED = ("0.0.0.0", "::", "")  # the bind-all addresses
LOOPBACK = "127.0.0.1"
_ROUTE_PROBE = ("192.0.2.1", 9)  # TEST-NET-1: connect() picks a route, no packet is sent
_ROUTE_PROBE6 = ("2001:db8::1", 9)  # the IPv6 documentation prefix, for a machine with IPv6 alone


def _routed_source() -> str | None:
    """The source address of the default route (IPv4's, else IPv6's), or None without one."""
    for family, probe in ((socket.AF_INET, _ROUTE_PROBE), (socket.AF_INET6, _ROUTE_PROBE6)):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(probe)
                return str(s.getsockname()[0])
        except OSError:
            continue
    return None


def pick_address(routed: str | None, local: Sequence[LocalAddress]) -> str:
    """The default route's source if it is a real address, else the first non-loopback address
    of an interface that is up, else loopback."""
    if routed and not ipaddress.ip_address(routed).is_loopback and routed not in UNSPECIFIED:
        return routed
    usable = [a.address for a in local if a.up and not a.loopback]
    return usable[0] if usable else LOOPBACK


def lan_address() -> str:
    """This machine's address as other machines on its network reach it."""
    return pick_address(_routed_source(), read_local_addresses())


def advertised_host(bind: str, lan: Callable[[], str] = lan_address) -> str:
    """The host a daemon bound to ``bind`` shows as its peer address: the bind address itself,
    or, bound to all interfaces, this machine's LAN address."""
    return lan() if bind in UNSPECIFIED else bind
