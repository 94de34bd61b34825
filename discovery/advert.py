"""What a peerd node puts in its mDNS advert, and which adverts it accepts.

Pure functions only (no sockets, no zeroconf), so the rules are unit-tested.

Invariants:
- Service type ``_peerd._tcp.local.``; instance name ``peerd-<node id>``
  (sanitised, at most 63 bytes), so it is unique per node and stable
  across restarts.
- The TXT record carries the keys ``node``, ``fleet``, ``proto`` and
  ``port``, ``protos`` (every wire version spoken, ``2,3``; ``proto`` is the
  oldest of them, which the first release compares for equality, so it
  accepts a node that still speaks its version) and ``name`` (the node's
  name, for people) when there is one;
  each ``key=value`` string fits the 255-byte TXT limit. A missing or
  unusable ``name`` reads as none (older nodes send none).
  The fleet id is derived from the fleet key by the daemon and is never
  the key itself.
- An advert is accepted only if it decodes, is not our own node id, has our
  fleet id (or one of the ``also`` ids a daemon names: its fleet's previous
  ids, while members catch up with a key rotation) and a protocol version in
  common with ours (``protos``, or ``proto`` alone from a node that sends no
  ``protos``); a malformed ``protos`` reads as none.
  An advert of another fleet is ``other-fleet``: the daemon reports it to
  people (another fleet on this LAN), never syncs with it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from discovery.source import AdvertError

__all__ = [
    "SERVICE_TYPE",
    "Advert",
    "Verdict",
    "advert_name",
    "decode_txt",
    "encode_txt",
    "instance_label",
    "instance_name",
    "judge_advert",
    "pick_host",
]

SERVICE_TYPE = "_peerd._tcp.local."
TXT_NODE, TXT_FLEET, TXT_PROTO, TXT_PORT, TXT_NAME = "node", "fleet", "proto", "port", "name"
TXT_PROTOS = "protos"
MAX_PROTOCOL = 30
MAX_NAME_CHARS = 64
_MAX_TXT_ENTRY = 255
_MAX_LABEL = 63
_LABEL_PREFIX = "peerd-"
_UNSAFE = re.compile(r"[^A-Za-z0-9-]")

Verdict = Literal["accept", "self", "other-fleet", "other-version"]


@dataclass(frozen=True)
class Advert:
    """The facts one node advertises about itself."""

    node_id: str
    fleet_id: str
    protocol_version: int  # the oldest wire version the node speaks
    port: int
    name: str | None = None
    protocols: tuple[int, ...] = ()  # every version it speaks (empty: ``protocol_version`` alone)

    def spoken(self) -> frozenset[int]:
        return frozenset(self.protocols) or frozenset({self.protocol_version})


def advert_name(name: str | None) -> str | None:
    """A node name as adverts carry it: printable, trimmed, at most MAX_NAME_CHARS; None otherwise."""
    if name is None:
        return None
    name = name.strip()[:MAX_NAME_CHARS]
    return name if name and name.isprintable() and len(f"{TXT_NAME}={name}".encode()) <= _MAX_TXT_ENTRY else None


def _check_text(name: str, value: str) -> None:
    if not value or not value.isprintable() or value.strip() != value:
        raise AdvertError(f"{name} must be non-empty printable text without outer spaces")


def encode_txt(advert: Advert) -> dict[str, str]:
    """TXT properties for ``advert``; ``AdvertError`` if a value cannot be advertised."""
    _check_text("node id", advert.node_id)
    _check_text("fleet id", advert.fleet_id)
    if advert.protocol_version < 0 or any(not 0 <= v <= MAX_PROTOCOL for v in advert.protocols):
        raise AdvertError(f"protocol versions must be 0..{MAX_PROTOCOL}, got {advert.protocol_version}, "
                          f"{advert.protocols}")
    if not 1 <= advert.port <= 65535:
        raise AdvertError(f"port must be 1..65535, got {advert.port}")
    txt = {
        TXT_NODE: advert.node_id,
        TXT_FLEET: advert.fleet_id,
        TXT_PROTO: str(advert.protocol_version),
        TXT_PORT: str(advert.port),
    }
    if advert.protocols:
        txt[TXT_PROTOS] = ",".join(map(str, sorted(advert.protocols)))
    name = advert_name(advert.name)
    if name is not None:
        txt[TXT_NAME] = name
    for key, value in txt.items():
        if len(f"{key}={value}".encode()) > _MAX_TXT_ENTRY:
            raise AdvertError(f"TXT entry {key!r} is longer than {_MAX_TXT_ENTRY} bytes")
    return txt


def _text(props: Mapping[bytes, bytes | None], key: str) -> str:
    raw = props.get(key.encode())
    if raw is None:
        raise AdvertError(f"TXT record lacks {key!r}")
    try:
        value = raw.decode()
    except UnicodeDecodeError:
        raise AdvertError(f"TXT {key!r} is not UTF-8") from None
    if not value:
        raise AdvertError(f"TXT {key!r} is empty")
    return value


def _number(props: Mapping[bytes, bytes | None], key: str, low: int, high: int) -> int:
    text = _text(props, key)
    if not text.isdigit() or not low <= int(text) <= high:
        raise AdvertError(f"TXT {key!r}={text!r} is not a number in {low}..{high}")
    return int(text)


def decode_txt(props: Mapping[bytes, bytes | None]) -> Advert:
    """Read an advert from resolved TXT properties; ``AdvertError`` if malformed."""
    return Advert(
        node_id=_text(props, TXT_NODE),
        fleet_id=_text(props, TXT_FLEET),
        protocol_version=_number(props, TXT_PROTO, 0, 2**31),
        port=_number(props, TXT_PORT, 1, 65535),
        name=_optional_name(props),
        protocols=_optional_protocols(props),
    )


def _optional_protocols(props: Mapping[bytes, bytes | None]) -> tuple[int, ...]:
    raw = props.get(TXT_PROTOS.encode())
    try:
        parts = raw.decode().split(",") if raw else []
        out = tuple(sorted({int(p) for p in parts}))
    except (UnicodeDecodeError, ValueError):
        return ()
    return out if all(0 <= v <= MAX_PROTOCOL for v in out) else ()


def _optional_name(props: Mapping[bytes, bytes | None]) -> str | None:
    raw = props.get(TXT_NAME.encode())
    try:
        return advert_name(raw.decode()) if raw else None
    except UnicodeDecodeError:
        return None


def judge_advert(
    advert: Advert, *, own_node_id: str, fleet_id: str, protocol_versions: Collection[int],
    also: Collection[str] = (),
) -> Verdict:
    """Decide whether a decoded advert is a peer of ours (``"accept"``) or why not."""
    if advert.node_id == own_node_id:
        return "self"
    if advert.fleet_id != fleet_id and advert.fleet_id not in also:
        return "other-fleet"
    if not advert.spoken() & set(protocol_versions):
        return "other-version"
    return "accept"


def instance_label(node_id: str) -> str:
    """The mDNS instance label for a node: ``peerd-`` + its id, DNS-safe, <= 63 bytes."""
    _check_text("node id", node_id)
    return (_LABEL_PREFIX + _UNSAFE.sub("-", node_id))[:_MAX_LABEL]


def instance_name(node_id: str) -> str:
    """The full service instance name, e.g. ``peerd-ab12._peerd._tcp.local.``."""
    return f"{instance_label(node_id)}.{SERVICE_TYPE}"


def pick_host(addresses: Sequence[str], local_networks: Sequence[str]) -> str:
    """Choose the address to dial: the first one inside one of our networks, else the first.

    ``local_networks`` are CIDR strings such as ``"10.77.1.2/24"`` (host bits allowed).
    ``addresses`` must not be empty.
    """
    if not addresses:
        raise ValueError("pick_host needs at least one address")
    networks = [ipaddress.ip_network(net, strict=False) for net in local_networks]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if any(ip.version == net.version and ip in net for net in networks):
            return address
    return addresses[0]
