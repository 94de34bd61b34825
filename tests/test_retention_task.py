"""The daemon's purging task (``peerd.retaining``) on a real replica and change feed, on the real clock."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_with_no_horizon_a_landing_op_costs_the_task_no_worker_thread(tmp_path: Path) -> None:
    """The task looks at the horizon after every change, on the loop: with no horizon and no lock held
    elsewhere, sends wake it and nothing is handed to a worker thread; with another connection writing,
    the look that would wait goes to one."""

    async def main() -> None:
        rep = Replica.open(tmp_path / "replica.db")
        wiring = Wiring.over(rep)
        waiter = wiring.waiter
        offloaded: list[str] = []
        looked: list[int] = []
        horizon = rep.horizon_ms

        def counted() -> int:
            looked.append(waiter.mark)
            return horizon()

        rep.horizon_ms = counted  # type: ignore[method-assign]

        async def offload(fn: Callable[..., Any], *args: Any) -> Any:
            offloaded.append(getattr(fn, "__name__", repr(fn)))
            return await asyncio.to_thread(fn, *args)

        task = asyncio.create_task(keep_retention(rep, waiter, offload=offload))
        for i in range(5):
            sent = rep.send_message("alice", "bob", f"m{i}")
            await until(lambda s=sent.seq: looked and looked[-1] >= s, 5, "the task to look after the send")
        assert offloaded == []
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # another thread holds the connection: the next look cannot run on the loop
            with rep._store.lock:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(patience(10))
        other = Replica.open(tmp_path / "replica.db")
        other.send_message("carol", "bob", "from another connection")
        wiring.feed.advance(other.max_lseq())  # as the feed's watch would tell it
        try:
            await until(lambda: offloaded, 5, "the look handed to a worker thread")
        finally:
            release.set()
            holder.join()
        await until(lambda: looked and looked[-1] >= other.max_lseq(), 5, "that look done")
        assert offloaded == ["counted"]
        other.close()
        waiter.close()
        await asyncio.wait_for(task, patience(5))
        wiring.close()
        rep.close()

    asyncio.run(main())
