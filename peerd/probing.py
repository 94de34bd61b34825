"""Probing peer ports for ``peerd doctor``: one sealed ``peers`` request each, all at once.

Invariants:
* A probe names no address of ours (``protocol.probe``: no envelope), so the peer records nothing.
* Peers are probed with the daemon's own transport and codec (``peerd.transport``,
  ``peerd.protocol``), each bounded by the timeout; every error becomes a ``Probe`` of a kind,
  never an exception, and each kind has its fix.
* Clock skew is read against the request's midpoint (off by up to half a round trip).
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from peerd import protocol
from peerd.config import Config, normalize_seed, parse_seed
from peerd.errors import ConfigError, SealError, TransportError
from peerd.findings import FAIL, OK, WARN, Finding
from peerd.protocol import ProtocolError
from peerd.seal import open_sealed, seal
from peerd.transport import Answer, HttpTransport, Transport

CLOCK_OK_S = 2.0  # the Date header has whole seconds: anything under this is noise
CLOCK_FAIL_S = 60.0  # the hybrid clocks cap a remote clock this far ahead (replica.hlc)
MAX_PROBES = 64




@dataclass(frozen=True)
class Probe:
    """What one sealed request to a peer port showed."""

    address: str
    kind: str  # ok, self, unresolvable, refused, timeout, unreachable, wrong-fleet, not-peerd
    detail: str
    node: str | None = None  # short node id (hex) of whoever answered
    rtt: float | None = None
    skew: float | None = None  # their clock minus ours, seconds

    @property
    def ok(self) -> bool:
        return self.kind in ("ok", "self")


def clock_skew(date_header: str | None, sent: float, received: float, reply_ms: object = None) -> float | None:
    """Their clock minus ours: from a millisecond clock in the reply when the peer sends one,
    else from the HTTP Date header (whole seconds, so +-1 s)."""
    mid = (sent + received) / 2
    if isinstance(reply_ms, int) and not isinstance(reply_ms, bool):
        return reply_ms / 1000 - mid
    if not date_header:
        return None
    try:
        when = email.utils.parsedate_to_datetime(date_header).timestamp()
    except (TypeError, ValueError):
        return None
    return when + 0.5 - mid  # the header truncates to the second


async def probe(transport: Transport, address: str, fleet_key: bytes, seconds: float,
                me: str | None = None) -> Probe:
    """One sealed ``peers`` request to ``address`` (host:port), naming nothing of ours; the
    transport bounds it to ``seconds``."""
    try:
        host, port = parse_seed(address)
        await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except ConfigError as exc:
        return Probe(address, "unresolvable", str(exc))
    except OSError as exc:
        return Probe(address, "unresolvable", f"cannot resolve it: {exc.strerror or exc}")
    sent = time.time()
    try:
        answer = await transport.post(address, seal(fleet_key, protocol.encode(protocol.probe())))
    except TransportError as exc:
        return Probe(address, exc.kind, _no_answer(exc, seconds))
    return _classify(address, answer, key=fleet_key, sent=sent, received=time.time(), me=me)


def _no_answer(exc: TransportError, seconds: float) -> str:
    if exc.kind == "refused":
        return "connection refused: nothing listens there"
    if exc.kind == "timeout":
        return f"no answer within {seconds:g} s"
    if exc.kind in ("not-peerd", "too-large"):
        return f"answers, but not like a peerd peer port ({exc.detail})"
    return exc.detail


def _classify(address: str, answer: Answer, *, key: bytes, sent: float, received: float, me: str | None) -> Probe:
    rtt = received - sent
    status = answer.status
    if status == 403:
        return Probe(address, "wrong-fleet", "refused our sealed request: it belongs to another fleet "
                     "(different fleet key)", rtt=rtt, skew=clock_skew(answer.date, sent, received))
    try:
        reply = protocol.decode(open_sealed(key, answer.body))
    except SealError:
        return Probe(address, "not-peerd", f"answers HTTP {status}, but not with a body sealed by our fleet key",
                     rtt=rtt)
    except ProtocolError:
        return Probe(address, "not-peerd", f"answers HTTP {status} with an unreadable body", rtt=rtt)
    node = protocol.envelope(reply).sender
    used = protocol.versions.negotiate(protocol.versions.stated(reply))
    if isinstance(used, protocol.versions.NoCommon):
        return Probe(address, "other-version", f"a peerd that {used}", node=node.hex() if node else None, rtt=rtt)
    if status != 200 or node is None:
        return Probe(address, "not-peerd", f"answers HTTP {status} without a peer reply", rtt=rtt)
    skew = clock_skew(answer.date, sent, received, reply.get("c"))
    kind = "self" if me is not None and me.startswith(node.hex()) else "ok"
    what = "this node itself" if kind == "self" else f"node {node.hex()}"
    return Probe(address, kind, f"{what}, same fleet, wire {used}, {rtt * 1000:.0f} ms", node=node.hex(), rtt=rtt,
                 skew=skew)


_PROBE_FIX = {
    "unresolvable": "check the host name (DNS or /etc/hosts), or use an IP address",
    "refused": "start peerd there, or correct the port (the peer port, 7733 unless configured otherwise)",
    "timeout": "the host may be down, or a firewall drops the port: allow TCP to it",
    "unreachable": "check the network path to that host (routing, VPN, firewall)",
    "wrong-fleet": "bring that machine into this fleet: `peerd join --lan` there, then `peerd approve CODE` here "
                   "(or `peerd invite` here, `peerd join TOKEN` there)",
    "not-peerd": "something other than peerd listens there: correct the address or port",
    "other-version": "upgrade the older of the two peerd releases (peerd --version shows what each speaks)",
}


def seed_finding(p: Probe) -> Finding:
    if p.kind == "self":
        return Finding("seed", OK, p.address, "this node itself (harmless: it is skipped)")
    if p.ok:
        return Finding("seed", OK, p.address, p.detail)
    return Finding("seed", FAIL, p.address, p.detail, _PROBE_FIX.get(p.kind))


def peer_finding(p: Probe, row: dict[str, Any]) -> Finding:
    view = f"found by {row.get('found_by')}, lag {row.get('lag') if row.get('lag') is not None else '?'}"
    if p.ok:
        return Finding("peer", OK, p.address, f"{p.detail}; {view}")
    if row.get("relay") == "we relay for it":  # nobody can call it; it keeps a link to us (peerd.relaylink)
        return Finding("peer", OK, p.address, f"cannot be called at its address ({p.detail}), but keeps a link to "
                       f"this member, which relays for it; {view}")
    status = FAIL if p.kind == "wrong-fleet" else WARN
    daemon = f"; the daemon's last error: {row['last_error']}" if row.get("last_error") else ""
    return Finding("peer", status, p.address, f"{p.detail} ({view}){daemon}", _PROBE_FIX.get(p.kind))


def clock_finding(p: Probe) -> Finding | None:
    if p.skew is None or p.kind == "self":
        return None
    off = abs(p.skew)
    direction = "ahead of" if p.skew > 0 else "behind"
    text = f"about {off:.0f} s {direction} ours" if off >= 1 else "agrees with ours (within a second)"
    fix = "turn on time sync (NTP) on the machine whose clock is off, e.g. `timedatectl set-ntp true`"
    if off <= CLOCK_OK_S:
        return Finding("clock", OK, p.address, text)
    if off <= CLOCK_FAIL_S:
        return Finding("clock", WARN, p.address, text + ": message times and last-writer-wins look skewed", fix)
    return Finding("clock", FAIL, p.address, text + f": beyond the {CLOCK_FAIL_S:.0f} s the hybrid clocks accept; "
                   "its messages get capped timestamps", fix)


def probe_all(addresses: Iterable[str], cfg: Config, timeout: float, me: str | None) -> dict[str, Probe]:
    """Probe every address at once (at most ``MAX_PROBES`` of them)."""
    todo = list(dict.fromkeys(addresses))[:MAX_PROBES]
    return asyncio.run(_probe_all(todo, cfg, timeout, me)) if todo else {}


async def _probe_all(todo: Sequence[str], cfg: Config, seconds: float, me: str | None) -> dict[str, Probe]:
    transport = HttpTransport(max_body=cfg.max_body_bytes, total=seconds)
    try:
        results = await asyncio.gather(*(probe(transport, a, cfg.fleet_key, seconds, me) for a in todo))
    finally:
        await transport.close()
    return dict(zip(todo, results, strict=True))


def canonical(address: str) -> str:
    try:
        return normalize_seed(address)
    except ConfigError:
        return address


# -- the whole run ----------------------------------------------------------------------------------
