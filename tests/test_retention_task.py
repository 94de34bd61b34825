"""The daemon's purging task (``peerd.retaining``) on a real replica and change feed, on the real clock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from mcp_server.wiring import Wiring
from peerd.retaining import keep_retention
from replica import Replica
from tests.waiting import patience

H = 2000  # ms: the task runs on the wall clock, so the horizon is short


async def until(pred: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + patience(seconds)
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_the_task_purges_when_a_horizon_is_set_and_again_when_the_next_message_expires(tmp_path: Path) -> None:
    """Setting a horizon starts a pass at once; a message that expires later is purged then, with no op landing
    in between (the task slept until its expiry); closing the waiter ends the task."""

    async def main() -> None:
        rep = Replica.open(tmp_path / "replica.db")
        wiring = Wiring.over(rep)
        waiter = wiring.waiter
        task = asyncio.create_task(keep_retention(rep, waiter))
        old = rep.send_message("alice", "bob", "old")
        await asyncio.sleep(2.2 * H / 1000)  # older than twice the horizon before there is one
        young = rep.send_message("alice", "bob", "young")
        rep.set_retention(H)
        await until(lambda: rep.retention().checked_at_ms is not None, 5, "the first pass")
        ids = {m.id for m in rep.message_log(0).messages}
        assert old.id not in ids and young.id in ids
        checked = rep.retention().checked_at_ms
        await until(lambda: rep.retention().removed_total.get("messages") == 2, 3 * H / 1000 + 5,
                    "the young message purged once it is past twice the horizon (and the pass recorded)")
        assert young.id not in {m.id for m in rep.message_log(0).messages}
        assert rep.retention().checked_at_ms != checked
        waiter.close()
        await asyncio.wait_for(task, patience(5))
        wiring.close()
        rep.close()

    asyncio.run(main())


def test_with_no_horizon_the_task_purges_nothing_and_ends_on_close(tmp_path: Path) -> None:
    """Keep everything: no pass runs (none is recorded), nothing is purged; the task ends when the waiter closes."""

    async def main() -> None:
        rep = Replica.open(tmp_path / "replica.db")
        wiring = Wiring.over(rep)
        waiter = wiring.waiter
        task = asyncio.create_task(keep_retention(rep, waiter))
        rep.send_message("alice", "bob", "kept")
        waiter.close()
        await asyncio.wait_for(task, patience(5))
        assert rep.retention().checked_at_ms is None and rep.stats()["messages"] == 1
        wiring.close()
        rep.close()

    asyncio.run(main())
