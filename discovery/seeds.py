"""Seed lists: fixed ``HOST:PORT`` entries that reach peers on other networks.

Invariants:
- Parsing is pure and strict: ``parse_seed`` accepts ``host:port``,
  ``a.b.c.d:port`` and ``[ipv6]:port`` (ASCII only: a port of ASCII digits,
  host-name labels of ASCII letters, digits, ``-`` and ``_``) and raises
  ``SeedError`` (a ``ValueError``) with a message that names the entry and the
  fix. ``parse_address`` holds a host and port from elsewhere (a peer's
  exchange record) to exactly the same rules.
- A candidate's ``host`` is the seed's host as written (brackets removed);
  its ``addresses`` are the addresses that host resolved to. Literal IPs are
  never looked up; names are re-resolved every ``resolve_interval`` seconds
  with the loop's ``getaddrinfo`` (a worker thread, never blocking the loop).
- ``found`` is called for a seed when it first resolves, when its resolved
  addresses change, and when a retry is due after ``report_failure``.
  Retries follow ``Backoff`` with jitter; ``report_success`` resets the count
  and cancels a pending retry. Nothing else re-announces a seed, so a
  failing seed is never hammered.
- Failed look-ups are retried with the same backoff and logged once per
  streak (logger ``discovery.seeds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from discovery.backoff import Backoff
from discovery.source import (
    FoundCallback,
    GoneCallback,
    PeerCandidate,
    SeedError,
    call_safely,
)

__all__ = ["Resolver", "Seed", "SeedSource", "format_seed", "parse_address", "parse_seed", "parse_seeds"]

log = logging.getLogger("discovery.seeds")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""Resolve ``(host, port)`` to IP address strings; raise ``OSError`` on failure."""

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")
_FORMAT_HINT = "use HOST:PORT, A.B.C.D:PORT or [IPV6]:PORT"


@dataclass(frozen=True)
class Seed:
    """One parsed seed. ``host`` has no brackets; ``literal`` is True for IP addresses."""

    host: str
    port: int
    literal: bool

    def __str__(self) -> str:
        return format_seed(self.host, self.port)

    def key(self) -> tuple[str, int]:
        """Identity for de-duplication: host names are case-insensitive."""
        return (self.host.lower(), self.port)


def format_seed(host: str, port: int) -> str:
    """Render ``host:port``, bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_port(text: str, entry: str, default_port: int | None) -> int:
    if text == "":
        if default_port is None:
            raise SeedError(f"seed {entry!r} has no port; {_FORMAT_HINT}")
        return default_port
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise SeedError(f"seed {entry!r}: port {text!r} is not a number in 1..65535")
    port = int(text)
    if not 1 <= port <= 65535:
        raise SeedError(f"seed {entry!r}: port {port} is outside 1..65535")
    return port


def _check_hostname(host: str, entry: str) -> bool:
    """Validate a host; return True when it is an IPv4 literal."""
    with contextlib.suppress(ValueError):
        ipaddress.IPv4Address(host)
        return True
    name = host.removesuffix(".")
    labels = name.split(".")
    if all(label.isdigit() for label in labels):
        raise SeedError(f"seed {entry!r}: {host!r} is not a valid IPv4 address")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise SeedError(
            f"seed {entry!r}: {host!r} is not a valid host name "
            "(letters, digits and hyphens, dot-separated labels of at most 63 characters)"
        )
    return False


def parse_seed(text: str, default_port: int | None = None) -> Seed:
    """Parse one seed entry; raise ``SeedError`` saying what is wrong.

    ``default_port`` fills in a missing port (``host`` or ``[v6]``); without
    it a port is required.
    """
    entry = text.strip()
    if not entry:
        raise SeedError(f"empty seed entry; {_FORMAT_HINT}")
    if entry.startswith("["):
        addr, sep, rest = entry[1:].partition("]")
        if not sep:
            raise SeedError(f"seed {entry!r}: missing ']' after the IPv6 address")
        if rest and not rest.startswith(":"):
            raise SeedError(f"seed {entry!r}: expected ':PORT' after ']'")
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            raise SeedError(f"seed {entry!r}: {addr!r} is not a valid IPv6 address") from None
        return Seed(addr, _parse_port(rest[1:], entry, default_port), literal=True)
    if entry.count(":") > 1:
        raise SeedError(f"seed {entry!r}: IPv6 addresses need brackets, as in [ADDRESS]:PORT")
    host, sep, port_text = entry.partition(":")
    if sep and port_text == "":
        raise SeedError(f"seed {entry!r} has an empty port; {_FORMAT_HINT}")
    if not host:
        raise SeedError(f"seed {entry!r} has no host; {_FORMAT_HINT}")
    literal = _check_hostname(host, entry)
    return Seed(host, _parse_port(port_text, entry, default_port), literal=literal)


def parse_address(host: object, port: object) -> Seed:
    """A host and port learnt from elsewhere (a peer's record), held to the rules of a seed
    entry: ``host`` a name or IP literal (an IPv6 one without brackets), ``port`` an int
    (never a bool) in 1..65535. The result's host is the canonical one to dial."""
    if not isinstance(host, str):
        raise SeedError(f"host {host!r} is not a string")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise SeedError(f"port {port!r} is not a number in 1..65535")
    if host != host.strip() or not host or "[" in host or "]" in host:
        raise SeedError(f"host {host!r} is not a host name or IP address")
    return parse_seed(format_seed(host, port))


def parse_seeds(entries: Sequence[str], default_port: int | None = None) -> tuple[Seed, ...]:
    """Parse a seed list, dropping duplicates (first occurrence wins)."""
    if isinstance(entries, str):
        raise SeedError("seeds must be a list of HOST:PORT strings, not one string")
    seen: dict[tuple[str, int], Seed] = {}
    for entry in entries:
        seed = parse_seed(entry, default_port)
        seen.setdefault(seed.key(), seed)
    return tuple(seen.values())


def unique_addresses(addresses: Sequence[str]) -> tuple[str, ...]:
    """Addresses in first-seen order without repeats."""
    return tuple(dict.fromkeys(addresses))


async def loop_resolver(host: str, port: int) -> Sequence[str]:
    """Resolve with the running loop's ``getaddrinfo`` (runs in a worker thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return unique_addresses([str(info[4][0]) for info in infos])


class _SeedState:
    """Mutable schedule of one seed; only touched on the event loop."""

    def __init__(self, seed: Seed) -> None:
        self.seed = seed
        self.addresses: tuple[str, ...] = (seed.host,) if seed.literal else ()
        self.failures = 0
        self.resolve_failures = 0
        self.resolve_at = math.inf if seed.literal else 0.0
        self.retry_at: float | None = 0.0 if seed.literal else None
        self.wake = asyncio.Event()

    def matches(self, host: str, port: int) -> bool:
        return port == self.seed.port and (
            host.lower() == self.seed.host.lower() or host in self.addresses
        )

    def candidate(self) -> PeerCandidate:
        return PeerCandidate(
            host=self.seed.host, port=self.seed.port, source="seed", addresses=self.addresses
        )


class SeedSource:
    """A ``DiscoverySource`` over a fixed list of seeds.

    ``seeds`` are validated at construction (``SeedError`` on a bad entry).
    The daemon reports the outcome of dialing a candidate with
    ``report_failure(host, port)`` / ``report_success(host, port)``, using the
    candidate's ``host`` or one of its ``addresses``; unknown pairs are ignored.
    Like every method here, they must be called on the event loop running the source.
    """

    def __init__(
        self,
        seeds: Sequence[str],
        resolve_interval: float = 60.0,
        *,
        default_port: int | None = None,
        backoff: Backoff | None = None,
        resolver: Resolver | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not resolve_interval > 0:
            raise ValueError(f"resolve_interval must be > 0, got {resolve_interval}")
        self.seeds = parse_seeds(seeds, default_port)
        self._resolve_interval = resolve_interval
        self._backoff = backoff or Backoff()
        self._resolver = resolver or loop_resolver
        self._rng = rng
        self._states = [_SeedState(seed) for seed in self.seeds]
        self._tasks: set[asyncio.Task[None]] = set()
        self._found: FoundCallback | None = None

    async def start(self, found: FoundCallback, gone: GoneCallback) -> None:
        """Start one background task per seed; returns at once. ``gone`` is never called."""
        del gone  # seeds have no node id to report gone
        if self._found is not None:
            raise RuntimeError("SeedSource already started")
        self._found = found
        for state in self._states:
            state.wake = asyncio.Event()
            task = asyncio.get_running_loop().create_task(
                self._run(state), name=f"seed {state.seed}"
            )
            self._tasks.add(task)

    async def stop(self) -> None:
        """Cancel the background tasks; no callback runs after this returns."""
        self._found = None
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def report_failure(self, host: str, port: int) -> None:
        """The daemon could not reach this seed: retry after the next backoff delay."""
        for state in self._matching(host, port):
            state.failures += 1
            delay = self._backoff.next_delay(state.failures, self._rng)
            state.retry_at = asyncio.get_running_loop().time() + delay
            log.debug("seed %s failed %d time(s); retry in %.1fs", state.seed, state.failures, delay)
            state.wake.set()

    def report_success(self, host: str, port: int) -> None:
        """The daemon reached this seed: reset its failure count and drop any pending retry."""
        for state in self._matching(host, port):
            state.failures = 0
            state.retry_at = None
            state.wake.set()

    def failures(self, host: str, port: int) -> int:
        """Consecutive failures reported for this seed (0 if unknown)."""
        return max((s.failures for s in self._matching(host, port)), default=0)

    def _matching(self, host: str, port: int) -> list[_SeedState]:
        return [state for state in self._states if state.matches(host, port)]

    def _emit(self, state: _SeedState) -> None:
        if self._found is not None and state.addresses:
            call_safely(log, self._found, state.candidate())

    async def _run(self, state: _SeedState) -> None:
        loop = asyncio.get_running_loop()
        while True:
            state.wake.clear()
            if loop.time() >= state.resolve_at:
                await self._resolve(state)
            if state.retry_at is not None and loop.time() >= state.retry_at:
                state.retry_at = None
                self._emit(state)
            wake_at = min(state.resolve_at, state.retry_at or math.inf)
            timeout = None if wake_at == math.inf else max(0.0, wake_at - loop.time())
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancellation
                async with asyncio.timeout(timeout):
                    await state.wake.wait()

    async def _resolve(self, state: _SeedState) -> None:
        loop = asyncio.get_running_loop()
        try:
            addresses = unique_addresses(await self._resolver(state.seed.host, state.seed.port))
            if not addresses:
                raise OSError("no addresses")
        except OSError as exc:
            state.resolve_failures += 1
            if state.resolve_failures == 1:
                log.warning("seed %s: cannot resolve %r (%s); retrying", state.seed,
                            state.seed.host, exc)
            delay = self._backoff.next_delay(state.resolve_failures, self._rng)
            state.resolve_at = loop.time() + min(delay, self._resolve_interval)
            return
        if state.resolve_failures:
            log.info("seed %s resolves again: %s", state.seed, ", ".join(addresses))
        state.resolve_failures = 0
        state.resolve_at = loop.time() + self._resolve_interval
        if addresses != state.addresses:
            # A new address is a new target: try it now, not after an old backoff.
            state.addresses = addresses
            state.failures = 0
            state.retry_at = loop.time()
