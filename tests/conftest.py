"""Shared fixtures: real replicas (``:memory:`` or files) and an in-memory sync helper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replica import Replica


def pull(dst: Replica, src: Replica, budget: int = 64 * 1024) -> int:
    """Bring ``dst`` up to date with ``src`` page by page; returns ops applied."""
    applied = 0
    while True:
        page = src.ops_missing(dst.vector(), budget)
        if page.ops:
            applied += dst.apply(page.ops).new
        if not page.more:
            return applied


def sync_all(replicas: list[Replica]) -> None:
    for a in replicas:
        for b in replicas:
            if a is not b:
                pull(a, b)


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
