"""What the daemon lets outsiders hold: open files, connections per source and in total.

Invariants:
* ``raise_open_file_limit`` lifts the soft ``RLIMIT_NOFILE`` towards the hard
  limit (never above ``TARGET_NOFILE``) once, at start; it never lowers it and
  never fails the daemon (a system that refuses keeps the old limit).
* Connection caps are sized from the soft limit so that both listeners at
  their caps, the client pool, SQLite and one accept burst per port still fit
  under it: the local port and the peer port each take at most a quarter, and
  the rest stays free. So ``accept()`` never runs out of file descriptors, and
  asyncio never loops on ``socket.accept() out of system resource``.
* ``Gate`` admits a connection only while its source holds fewer than
  ``per_source`` and all sources fewer than ``total``; every admitted
  connection is released exactly once. Pure counting, no I/O.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

TARGET_NOFILE = 65536  # enough for every cap below at its ceiling; more only costs kernel memory
PEER_CONNECTIONS = 1024  # ceiling of the peer port's total cap
PEER_PER_SOURCE = 32  # connections one address may hold on the peer port (a few nodes behind one NAT)
LOCAL_CONNECTIONS = 512  # ceiling of the local port's cap
MIN_CAP = 16


def open_file_limit() -> int:
    """The soft open-file limit (-1 when unlimited)."""
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def raise_open_file_limit(target: int = TARGET_NOFILE) -> int:
    """Lift the soft open-file limit to ``min(hard, target)`` where allowed; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # a container or sandbox may refuse: keep what we have
            return int(soft)
        return want
    return int(soft)


def connection_cap(soft_nofile: int, ceiling: int) -> int:
    """How many connections one listener may hold: a quarter of the open-file limit
    (the other listener, the client pool, SQLite and logs need the rest), at least
    ``MIN_CAP``, at most ``ceiling``."""
    if soft_nofile < 0:  # RLIM_INFINITY
        return ceiling
    return max(MIN_CAP, min(ceiling, soft_nofile // 4))


def peer_caps(soft_nofile: int, per_source: int = PEER_PER_SOURCE) -> tuple[int, int]:
    """(total, per source) connection caps of the peer port under this open-file limit, the
    per-source one at most ``per_source`` (config: ``peer_connections_per_address``)."""
    total = connection_cap(soft_nofile, PEER_CONNECTIONS)
    return total, max(1, min(per_source, total // 4))


@dataclass
class Gate:
    """Counts open connections per source address and in total; refuses over either cap."""

    total: int
    per_source: int
    _open: dict[str, int] = field(default_factory=dict)
    _count: int = 0

    def admit(self, source: str) -> bool:
        """Take a slot for ``source``; False (nothing taken) when a cap is reached."""
        held = self._open.get(source, 0)
        if self._count >= self.total or held >= self.per_source:
            return False
        self._open[source] = held + 1
        self._count += 1
        return True

    def release(self, source: str) -> None:
        """Give back a slot ``admit`` took."""
        held = self._open.get(source, 0)
        if held <= 0:
            return
        self._count -= 1
        if held == 1:
            del self._open[source]
        else:
            self._open[source] = held - 1

    @property
    def count(self) -> int:
        return self._count

    def held(self, source: str) -> int:
        return self._open.get(source, 0)
