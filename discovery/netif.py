"""The machine's IPv4 interfaces, as mDNS sees them.

A thin I/O layer (``read_local_addresses``, ``default_multicast_source``,
``probe_mdns_port``) around pure rules (``check_interfaces``, ``select_addresses``).

Invariants:
- Only IPv4 is considered: peerd's mDNS runs on 224.0.0.251 (seeds cover IPv6).
- An interface choice is ``"all"``, ``"default"`` or a non-empty list of names
  or addresses (``check_interfaces``); anything else is a ``ValueError``.
- ``"all"`` selects every address on an interface that is up, multicast-capable
  and not loopback. An explicit list selects the addresses of the interfaces
  it names (by interface name or by address) that are up; entries that match
  nothing are reported back, not raised.
- All selected addresses are advertised, but mDNS sockets are opened on one
  address per device (``one_per_device``): a second group join on the same
  link would fail.
- Every probe is cheap (one ``getifaddrs`` and one ioctl per interface, or
  one socket) so it can run every few seconds on the event loop.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import ifaddr

__all__ = [
    "MDNS_ADDRESS",
    "MDNS_PORT",
    "InterfaceChoice",
    "LocalAddress",
    "check_interfaces",
    "default_multicast_source",
    "one_per_device",
    "probe_mdns_port",
    "read_local_addresses",
    "select_addresses",
]

MDNS_ADDRESS = "224.0.0.251"
MDNS_PORT = 5353
InterfaceChoice = Literal["all", "default"] | Sequence[str]

_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_MULTICAST = 0x1000
_SIOCGIFFLAGS = 0x8913


@dataclass(frozen=True)
class LocalAddress:
    """One IPv4 address of this machine and the state of its interface."""

    interface: str
    address: str
    prefix: int
    up: bool = True
    multicast: bool = True
    loopback: bool = False

    @property
    def device(self) -> str:
        """The link the address lives on (``eth0`` for an ``eth0:1`` address label)."""
        return self.interface.split(":", 1)[0]

    @property
    def network(self) -> str:
        """The address with its prefix length, e.g. ``10.77.1.2/24``."""
        return f"{self.address}/{self.prefix}"


def check_interfaces(interfaces: InterfaceChoice) -> InterfaceChoice:
    """``interfaces`` as a source uses it (names stripped); ``ValueError`` if it is neither a
    choice nor a list of names or addresses."""
    if isinstance(interfaces, str):
        if interfaces not in ("all", "default"):
            raise ValueError(
                f"mdns interfaces must be 'all', 'default' or a list of interface names "
                f"or IPv4 addresses, got {interfaces!r}"
            )
        return interfaces
    entries = tuple(interfaces)
    if not entries or not all(isinstance(e, str) and e.strip() for e in entries):
        raise ValueError("mdns interfaces list must hold at least one non-empty name or address")
    return tuple(e.strip() for e in entries)


def select_addresses(
    choice: Literal["all"] | Sequence[str], local: Sequence[LocalAddress]
) -> tuple[tuple[LocalAddress, ...], tuple[str, ...]]:
    """The local addresses to run mDNS on for ``choice``, and list entries that matched nothing."""
    if choice == "all":
        chosen = [a for a in local if a.up and a.multicast and not a.loopback]
        return tuple(dict.fromkeys(chosen)), ()
    wanted = set(choice)
    chosen = [
        a for a in local if a.up and wanted.intersection((a.interface, a.device, a.address))
    ]
    unmatched = tuple(
        entry
        for entry in dict.fromkeys(choice)
        if not any(entry in (a.interface, a.device, a.address) for a in local)
    )
    return tuple(dict.fromkeys(chosen)), unmatched


def one_per_device(addresses: Sequence[LocalAddress]) -> tuple[str, ...]:
    """The first address of each device: mDNS needs one socket per link, not per address."""
    firsts: dict[str, str] = {}
    for a in addresses:
        firsts.setdefault(a.device, a.address)
    return tuple(firsts.values())


def _interface_flags(name: str) -> int | None:
    """Kernel interface flags (``SIOCGIFFLAGS``, Linux); ``None`` where unavailable.

    An ioctl on a socket, not sysfs, so the answer is for the caller's own
    network namespace whatever /sys happens to show.
    """
    if not sys.platform.startswith("linux"):
        return None
    import fcntl  # noqa: PLC0415 - POSIX only; keeps the module importable elsewhere

    request = struct.pack("16sH14x", name.split(":", 1)[0].encode()[:15], 0)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request)
    except OSError:
        return None
    flags: int = struct.unpack("16sH14x", reply)[1]
    return flags


def read_local_addresses() -> tuple[LocalAddress, ...]:
    """Every IPv4 address of this machine with its interface state."""
    found: list[LocalAddress] = []
    for adapter in ifaddr.get_adapters():
        flags = _interface_flags(adapter.name)
        for ip in adapter.ips:
            if not isinstance(ip.ip, str):
                continue  # IPv6 addresses come as tuples
            loopback = ipaddress.IPv4Address(ip.ip).is_loopback
            found.append(
                LocalAddress(
                    interface=adapter.name,
                    address=ip.ip,
                    prefix=ip.network_prefix,
                    up=True if flags is None else bool(flags & _IFF_UP),
                    multicast=True if flags is None else bool(flags & _IFF_MULTICAST),
                    loopback=loopback or (flags is not None and bool(flags & _IFF_LOOPBACK)),
                )
            )
    return tuple(found)


def default_multicast_source() -> str:
    """The source address the kernel picks for 224.0.0.251; ``OSError`` if there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((MDNS_ADDRESS, MDNS_PORT))
        return str(sock.getsockname()[0])


def probe_mdns_port() -> str | None:
    """Why UDP port 5353 cannot be shared (another program holds it exclusively), or ``None``.

    Binds the way python-zeroconf does (``SO_REUSEADDR`` + ``SO_REUSEPORT``), so
    it fails exactly when zeroconf would, without zeroconf's own error logging.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("", MDNS_PORT))
        except OSError as exc:
            return f"UDP port {MDNS_PORT} is held exclusively by another program ({exc.strerror})"
    return None
