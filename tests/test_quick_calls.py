"""The hot MCP calls run on the event loop and never wait there: ``Store.no_wait`` refuses to
wait for a lock held elsewhere (nothing written), and the call then runs on a worker thread
(``mcp_server.calls``). Remembered reads (``ReplicaCore._remembered``) never outlive a commit."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from mcp_server.tools import QUICK, TOOLS
from peerd.config import init_home
from replica import Replica, open_home
from replica.errors import WouldWait
from replica.store import BUSY_TIMEOUT_MS
from tests.daemons import PEERD
from tests.waiting import patience


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    init_home(path, name="quick")
    return path


@pytest.fixture
def replica(home: Path) -> Iterator[Replica]:
    r = open_home(home)
    yield r
    r.close()


@pytest.fixture
def other_writer(home: Path) -> Iterator[sqlite3.Connection]:
    """Another connection to the replica file holding its write lock (as a daemon writing a batch)."""
    conn = sqlite3.connect(home / "replica.db", isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    if conn.in_transaction:
        conn.execute("COMMIT")
    conn.close()


def busy_timeout(r: Replica) -> int:
    return int(r._store.conn.execute("PRAGMA busy_timeout").fetchone()[0])


def test_a_write_that_would_wait_for_another_connection_raises_and_writes_nothing(
        replica: Replica, other_writer: sqlite3.Connection) -> None:
    before = replica.max_lseq()
    with pytest.raises(WouldWait), replica.no_wait():
        replica.send_message("alpha", "beta", "not now")
    with replica._store.read():  # waiting calls wait again
        assert busy_timeout(replica) == BUSY_TIMEOUT_MS
    with replica.no_wait():  # reads never wait for a writer (WAL)
        assert replica.max_lseq() == before and replica.list_profiles() == []
    other_writer.execute("COMMIT")
    with replica.no_wait():
        replica.send_message("alpha", "beta", "now")
    assert [m.content for m in replica.check_messages("beta").messages] == ["now"]


def test_the_replica_in_use_by_another_thread_raises_at_once(replica: Replica) -> None:
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with replica._store.lock:
            holding.set()
            done.wait()

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(patience(10))
        with pytest.raises(WouldWait), replica.no_wait():
            pytest.fail("the block ran although another thread holds the replica")
    finally:
        done.set()
        t.join()


def test_after_a_commit_the_rest_of_the_block_waits_as_usual(replica: Replica) -> None:
    """A block that has committed may not be run again, so it no longer refuses to wait."""
    with replica.no_wait():
        with replica._store.read():
            assert busy_timeout(replica) == 0
        replica.send_message("alpha", "beta", "one")
        with replica._store.read():
            assert busy_timeout(replica) == BUSY_TIMEOUT_MS
        replica.send_message("alpha", "beta", "two")
    assert len(replica.check_messages("beta").messages) == 2


def test_remembered_profiles_are_read_again_after_any_commit(home: Path, replica: Replica) -> None:
    replica.update_profile("alpha", "Alpha")
    assert [p.name for p in replica.list_profiles()] == ["Alpha"]
    with open_home(home) as other:  # another connection, as another process
        other.update_profile("alpha", "Alpha 2")
        other.update_profile("beta", "Beta")
    assert [p.name for p in replica.list_profiles()] == ["Alpha 2", "Beta"]
    replica.update_profile("beta", "Beta 2")  # this connection's own commit
    assert [p.name for p in replica.list_profiles()] == ["Alpha 2", "Beta 2"]


def test_every_quick_tool_exists() -> None:
    assert {t.name for t in TOOLS} >= QUICK
    assert {t.name for t in TOOLS if t.quick} == QUICK


async def test_a_send_that_meets_a_busy_replica_waits_on_a_worker_thread_not_on_the_loop(home: Path) -> None:
    """A real ``peerd mcp``: while another connection holds the write lock, a send waits, and the
    same session is still served (the loop is free); once the lock is released the send is stored,
    once."""
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--role", "alpha"])
    async with Client(params) as c:
        assert not (await c.call_tool("whoami", {})).is_error  # the server is up, its replica open
        other = sqlite3.connect(home / "replica.db", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            send = asyncio.create_task(c.call_tool("send_message", {"channel": "beta", "content": "after the lock"}))
            # A hang guard, shorter than the busy timeout a send waiting on the loop would block it for.
            listed = await asyncio.wait_for(c.list_tools(), timeout=BUSY_TIMEOUT_MS / 1000 / 2)
            assert listed.tools and not send.done()
            other.execute("COMMIT")
        finally:
            other.close()
        result = await send
        assert not result.is_error, result.content
    with open_home(home) as r:
        assert [m.content for m in r.check_messages("beta").messages] == ["after the lock"]
