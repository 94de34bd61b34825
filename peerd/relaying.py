"""The return path's rules, pure: whether this member can be called, which members it keeps a
link to, when it tries again, and how many links a reachable member holds for others.

A member nobody can call (behind NAT) keeps a long-lived link (``peerd.protocol.link``) to one
or two reachable members; they push and forward to it down that link as to any peer.

* **Reachable or not** (``reachability``): ``reachable = true`` / ``false`` in config.toml
  decides; ``"auto"`` (the default) takes the last answer of a ``back`` probe (a reachable peer
  called our advertised address back), and None while no peer has answered one.
* **Which members** (``Relays``): up to ``want`` links at once, to live peers we reach directly,
  seeds first, then the ones that failed least, chance among equals; a link to a member learnt
  second hand gives way when a seed becomes free (so a laptop's links end up on its servers). A link that held
  ``STEADY`` seconds or more is tried again at once when it ends (a lost NAT mapping is mended
  within the keepalive and a round trip); one that fails, ends sooner or is refused waits an
  exponential backoff before the same member is tried again (a refusal at least
  ``REFUSED_WAIT``), so a member whose relay died links to another once that retry fails. A member that
  turns out reachable drops every link (``set_need(False)``): ordinary pushes again.
* **Bounds** (``Held``): a reachable member holds at most ``per_source`` links from one address
  and ``total`` in all; one more is refused with the reason in words (the wire says ``FULL``),
  and the member asking tries another. A member that links again replaces its old link.

Invariants: nothing here does I/O, sleeps, reads a clock or draws chance but from the
``random.Random`` it is given; a target is never both up and connecting; ``Held`` never holds
more than its caps, nor two links of one node.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

AUTO = "auto"
KEEPALIVE = 4.0  # seconds between keepalives on a link: NAT mappings need ~25 s; 4 s bounds recovery after one is lost
WANT = 2  # links a member nobody can call keeps open
BACKOFF_BASE = 0.5
BACKOFF_CAP = 60.0
REFUSED_WAIT = 30.0  # a relay that said it is full is not asked again before this
STEADY = 10.0  # a link that lasted this long worked: when it ends, its member is tried again at once
LINKS_PER_SOURCE = 32  # links one address may hold on a reachable member (many members behind one NAT)
LINKS_TOTAL = 256  # links a reachable member holds in all
PREFERRED = {"seed": 0, "mdns": 1, "exchange": 2, "inbound": 3}


def reachability(setting: bool | str, probed: bool | None) -> bool | None:
    """Whether this member can be called: the config's word, else the last probe's (None: not known)."""
    return setting if isinstance(setting, bool) else probed


def backoff(failures: int, *, refused: bool = False) -> float:
    wait = 0.0 if failures <= 0 else min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (failures - 1))
    return max(wait, REFUSED_WAIT) if refused else wait


@dataclass(frozen=True)
class Candidate:
    """A live peer we reach directly, as a relay could be."""

    addr: str
    node: bytes | None
    source: str


@dataclass
class Target:
    addr: str
    node: bytes | None = None
    failures: int = 0
    next_try: float = 0.0
    up: bool = False
    connecting: bool = False
    last_error: str | None = None
    since: float | None = None  # when the link came up


@dataclass(frozen=True)
class Connect:
    addr: str


@dataclass(frozen=True)
class Drop:
    addr: str


class Relays:
    """The links this member keeps (the side nobody can call)."""

    def __init__(self, rng: random.Random, want: int = WANT) -> None:
        self.rng = rng
        self.want = want
        self.need = False
        self.targets: dict[str, Target] = {}

    def active(self) -> list[Target]:
        return [t for t in self.targets.values() if t.up or t.connecting]

    def via(self) -> list[Target]:
        return sorted((t for t in self.targets.values() if t.up), key=lambda t: t.addr)

    def set_need(self, need: bool) -> list[Drop]:
        """Links wanted or not; when not, every open one is dropped."""
        self.need = need
        return [] if need else [Drop(t.addr) for t in self.active()]

    def plan(self, now: float, candidates: Sequence[Candidate]) -> list[Connect | Drop]:
        """The members to link to now, to keep ``want`` links; with every link open, the one link to
        drop for a better member now free (a seed rather than a member learnt second hand)."""
        if not self.need:
            return []
        missing = self.want - len(self.active())
        if missing <= 0:
            return self._upgrade(now, candidates)
        taken = {t.node for t in self.active() if t.node is not None}
        pool = [c for c in candidates if c.node not in taken and self._free(c.addr, now)]
        self.rng.shuffle(pool)
        pool.sort(key=lambda c: (PREFERRED.get(c.source, len(PREFERRED)), self._failures(c.addr)))
        out: list[Connect | Drop] = []
        for c in pool:
            if len(out) == missing:
                break
            if c.node is not None and c.node in taken:
                continue
            t = self.targets.setdefault(c.addr, Target(c.addr))
            t.node, t.connecting = c.node, True
            if c.node is not None:
                taken.add(c.node)
            out.append(Connect(c.addr))
        return out

    def _upgrade(self, now: float, candidates: Sequence[Candidate]) -> list[Connect | Drop]:
        rank = {c.addr: PREFERRED.get(c.source, len(PREFERRED)) for c in candidates}
        up = [t for t in self.active() if t.up]
        taken = {t.node for t in self.active()}
        free = [rank[c.addr] for c in candidates if c.node not in taken and self._free(c.addr, now)]
        if not up or not free:
            return []
        worst = max(up, key=lambda t: rank.get(t.addr, len(PREFERRED) + 1))
        return [Drop(worst.addr)] if min(free) < rank.get(worst.addr, len(PREFERRED) + 1) else []

    def _free(self, addr: str, now: float) -> bool:
        t = self.targets.get(addr)
        return t is None or (not t.up and not t.connecting and t.next_try <= now)

    def _failures(self, addr: str) -> int:
        t = self.targets.get(addr)
        return 0 if t is None else t.failures

    def up(self, addr: str, now: float) -> None:
        t = self.targets.setdefault(addr, Target(addr))
        t.up, t.connecting, t.failures, t.last_error, t.since = True, False, 0, None, now

    def down(self, addr: str, now: float, why: str, *, refused: bool = False) -> None:
        """A link ended or never came up: that member waits its backoff (jittered), none after a
        link that held ``STEADY`` seconds."""
        t = self.targets.setdefault(addr, Target(addr))
        held = None if not t.up or t.since is None else now - t.since
        t.up = t.connecting = False
        t.since = None
        if held is not None and not refused:  # one that worked is retried at once, or soon if it ended early
            t.failures = 0 if held >= STEADY else 1
        else:
            t.failures += 1
        t.next_try = now + backoff(t.failures, refused=refused) * self.rng.uniform(0.8, 1.2)
        t.last_error = why

    def next_due(self, now: float) -> float | None:
        """Seconds until a member waiting its backoff may be tried again, when links are missing."""
        if not self.need or len(self.active()) >= self.want:
            return None
        waits = [t.next_try - now for t in self.targets.values() if not t.up and not t.connecting]
        return max(0.0, min(waits)) if waits else None


@dataclass
class Held:
    """The links a reachable member holds for members nobody can call, within its caps."""

    per_source: int = LINKS_PER_SOURCE
    total: int = LINKS_TOTAL
    links: dict[bytes, str] = field(default_factory=dict)  # node -> source address

    def admit(self, node: bytes, source: str) -> str | None:
        """None when the link is taken (one of the same node is replaced), else why not."""
        if node in self.links:
            self.links[node] = source
            return None
        if len(self.links) >= self.total:
            return f"this member relays for {self.total} members already"
        if sum(1 for s in self.links.values() if s == source) >= self.per_source:
            return f"this member relays for {self.per_source} members at {source} already"
        self.links[node] = source
        return None

    def release(self, node: bytes) -> None:
        self.links.pop(node, None)
