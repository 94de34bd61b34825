"""Shared fixtures: real replicas (``:memory:`` or files), a peerd home, and an in-memory sync helper."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from replica import Replica, open_home

# Hypothesis fails an example that takes longer than a wall-clock deadline (200 ms by default) and a
# test whose data generation it finds slow; on a machine that other work loads, both fail tests that
# are correct. What a property test checks is its law, so none runs against the clock. Loaded here,
# before any test module is imported, so every ``@given`` and ``@settings`` inherits it.
settings.register_profile("peerd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("peerd")


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the commands the tests start, even when the suite itself runs as a
    background job: a shell starts those with SIGINT ignored, and a child inherits that
    (Python then never raises KeyboardInterrupt). A handler here is reset to the default
    in every child at exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pull(dst: Replica, src: Replica, budget: int = 64 * 1024) -> int:
    """Bring ``dst`` up to date with ``src`` page by page; returns ops applied."""
    applied = 0
    while True:
        page = src.ops_missing(dst.vector(), budget)
        if page.ops or page.ranges:  # the ranges cover what the source no longer holds (purged, retracted)
            applied += dst.apply(page.ops, page.ranges).new
        if not page.more:
            return applied


def sync_all(replicas: list[Replica]) -> None:
    for a in replicas:
        for b in replicas:
            if a is not b:
                pull(a, b)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A peerd home whose replica and key exist before any server process opens it."""
    path = tmp_path / "home"
    open_home(path).close()
    return path


@pytest.fixture
def mem() -> Iterator[Replica]:
    r = Replica.open(":memory:")
    yield r
    r.close()


@pytest.fixture
def file_replica(tmp_path: Path) -> Iterator[Replica]:
    r = Replica.open(tmp_path / "replica.db")
    yield r
    r.close()
