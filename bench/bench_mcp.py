"""MCP tool-call latency over streamable HTTP (a real daemon) and over stdio (a real
`peerd mcp` process), each against a floor measured in the same run.

1. Against the floor: every hot tool (``mcp_server.tools.QUICK``): ``send_message``,
   ``check_messages`` returning 50 of 1,000 stored messages, ``poll`` returning 50 thread
   messages, ``list_peers`` (20 profiles), and the calls on one message, receipt, profile or
   thread (``mark_as_read``, ``message_status``, ``get_message``, ``get_profile``,
   ``set_summary``, ``whoami``, ``append``, ``has_unread``, ``thread_status``, ``mark_read``),
   on a replica of 1,000 messages. The floor is a bare MCP server (``mcp_floor.py``: the same SDK
   ``MCPServer``, the same transport) whose tools return the very payloads peerd returned.
   peerd and the floor are called in alternating blocks, so load elsewhere hits both.
   Target: p50 of each within 1.3x of its floor (a send: its recipient check, write and
   read-back are one transaction, `replica.service`). Beside it, with no target, peerd's p50
   against a second floor whose tools also declare peerd's output schemas: the SDK client
   validates every result against its tool's schema, and that cost is the client's, paid by
   the floor too once it publishes the same schemas. What is left is what peerd itself adds.
   Over stdio, also with no target, peerd's p50 against the floor served on peerd's own stdio
   transport (``mcp_server.pipes``: no worker thread per line, as the SDK's transport has): the
   bare floor keeps the SDK's transport, so part of peerd's lead there is its transport.
2. A big replica (100k messages): ``send_message`` and ``check_messages`` (10 of them)
   against the same calls made straight on the Python API (in-process, no MCP, no
   transport). Target: p50 <= 5 ms over HTTP.

The daemon is started by the test suite's harness (``tests/daemons.py``).

    uv run python bench/bench_mcp.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import (  # noqa: E402
    FLOOR,
    Figure,
    at_most,
    floor_http,
    mcp_session,
    note,
    percentile,
    print_summary,
    report,
    section,
)
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.types import CallToolResult  # noqa: E402
from sim import apply_in_batches, workload  # noqa: E402

from peerd.config import init_home  # noqa: E402
from replica import open_home  # noqa: E402
from tests.daemons import PEERD, Daemon  # noqa: E402 - needs the repo root on sys.path


def build_home(home: Path, messages: int) -> float:
    """A home whose replica holds ``messages`` foreign messages (4 origins); returns seconds."""
    init_home(home, name="bench")
    started = time.perf_counter()
    per = messages // 4
    with open_home(home) as rep:
        for raws in workload(4, per):
            apply_in_batches(rep, raws, 2_000)
        rep.catch_up()
    return time.perf_counter() - started


FLOOR_RATIO = 1.3  # target: peerd's p50 within this of the floor's
BLOCK = 25  # calls per block; peerd and the floor alternate blocks
STORED, FETCH, THREAD_MSGS, PROFILES = 1_000, 50, 100, 20


def build_small_home(home: Path) -> None:
    """1,000 messages for the role ``fetch``; a thread of 100 messages; 20 profiles. ``ids.json``
    names the thread, the first message and its receipt (what the calls on one item take), and an
    empty thread for ``append`` to grow (the thread the other calls read stays as it was)."""
    init_home(home, name="bench")
    with open_home(home) as rep:
        first = rep.send_message("writer", "fetch", "message 0: " + "lorem ipsum dolor sit amet " * 5)
        for i in range(1, STORED):
            rep.send_message("writer", "fetch", f"message {i}: " + "lorem ipsum dolor sit amet " * 5)
        alice, bob = rep.create_agent("alice"), rep.create_agent("bob")
        thread = rep.create_thread(alice, bob)
        for i in range(THREAD_MSGS):
            rep.append(thread, alice if i % 2 else bob, f"thread message {i}: " + "consectetur adipiscing " * 5)
        for i in range(PROFILES):
            rep.update_profile(f"role{i:02d}", f"Role {i}", {"role": "worker", "workspace": f"/w/{i}"},
                               {"currentTask": f"task {i}"})
        receipt = rep.check_messages("fetch", limit=1).messages[0].receipt_id  # its receipt, delivered
        appended = rep.create_thread(alice, bob)  # append grows a thread of its own, not the one read
    (home / "ids.json").write_text(json.dumps({"thread": thread, "message": first.id, "receipt": receipt,
                                               "append_thread": appended}))


def floor_calls(ids: dict[str, str]) -> dict[str, Callable[[int], tuple[str, dict[str, object]]]]:
    """Each measured tool (every hot one, ``mcp_server.tools.QUICK``): the arguments of call i
    (the same for peerd and the floor). ``ids``: see ``build_small_home``."""
    thread, message = ids.get("thread", ""), ids.get("message", "")
    return {
        "send_message": lambda i: ("send_message", {"from": "bench", "channel": "reader", "content": f"m{i}"}),
        "check_messages": lambda _i: ("check_messages", {"recipient": "fetch", "limit": FETCH}),
        "poll": lambda _i: ("poll", {"thread_id": thread, "after_seq": 0, "limit": 50}),
        "list_peers": lambda _i: ("list_peers", {"limit": PROFILES}),
        "mark_as_read": lambda _i: ("mark_as_read", {"receiptIds": [ids.get("receipt", "")]}),
        "message_status": lambda _i: ("message_status", {"messageId": message}),
        "get_message": lambda _i: ("get_message", {"messageId": message}),
        "get_profile": lambda _i: ("get_profile", {"orchestratorId": "role00"}),
        "set_summary": lambda i: ("set_summary", {"orchestratorId": "role01", "summary": f"task {i}"}),
        "whoami": lambda _i: ("whoami", {}),
        "append": lambda i: ("append", {"thread_id": ids.get("append_thread", ""), "sender_name": "alice",
                                        "content": f"a{i}"}),
        "has_unread": lambda _i: ("has_unread", {"thread_id": thread, "agent_name": "alice"}),
        "thread_status": lambda _i: ("thread_status", {"thread_id": thread, "agent_name": "alice"}),
        "mark_read": lambda _i: ("mark_read", {"thread_id": thread, "agent_name": "bob", "seq": 5}),
    }


async def call(client: Client, name: str, args: dict[str, object]) -> CallToolResult:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content
    return result


async def payloads(client: Client, ids: dict[str, str]) -> dict[str, object]:
    """peerd's structured result of each measured tool, for the floor to return."""
    out: dict[str, object] = {}
    for tool, make in floor_calls(ids).items():
        out[tool] = (await call(client, *make(0))).structured_content
    checked = out["check_messages"]
    assert isinstance(checked, dict) and len(checked["messages"]) == FETCH, "check_messages did not return 50"
    return out


async def output_schemas(client: Client) -> dict[str, object]:
    """The output schema peerd lists for each measured tool, for the second floor to declare."""
    listed = {tool.name: tool.output_schema for tool in (await client.list_tools()).tools}
    return {tool: listed[tool] for tool in floor_calls({}) if listed.get(tool) is not None}


async def against_floor(sides: Sequence[Client], ids: dict[str, str], count: int) -> dict[str, list[list[float]]]:
    """Latencies (ms) of each tool, one list per side (peerd, the floor, the floor with peerd's
    output schemas, and over stdio the floor on peerd's transport), in alternating blocks after a
    warm-up."""
    out: dict[str, list[list[float]]] = {}
    for tool, make in floor_calls(ids).items():
        samples: list[list[float]] = [[] for _ in sides]
        for client in sides:
            await timed(lambda i, c=client, m=make: call(c, *m(i)), 10)  # warm up
        for start in range(0, count, BLOCK):
            for side, client in enumerate(sides):
                samples[side] += await timed(lambda i, c=client, m=make, s=start: call(c, *m(s + i)), BLOCK)
        out[tool] = samples
    return out


def floor_figures(label: str, lat: dict[str, list[list[float]]]) -> list[Figure]:
    figs = []
    for tool, (ours, floor, schema_floor, *pipes_floor) in lat.items():
        name = f"{label} {tool}" + (f" ({FETCH} of {STORED:,})" if tool == "check_messages" else "")
        f50, f99 = percentile(floor, 50), percentile(floor, 99)
        note(f"{name}: floor p50 {f50:.2f} ms, p99 {f99:.2f} ms")
        figs.append(report(Figure(f"{name} p50", percentile(ours, 50), "ms", at_most(FLOOR_RATIO * f50), f50)))
        figs.append(report(Figure(f"{name} p99", percentile(ours, 99), "ms", None, f99)))
        figs.append(report(Figure(f"{name} p50, floor with output schemas", percentile(ours, 50), "ms", None,
                                  percentile(schema_floor, 50))))
        for same_transport in pipes_floor:
            figs.append(report(Figure(f"{name} p50, floor on peerd's stdio transport", percentile(ours, 50), "ms",
                                      None, percentile(same_transport, 50))))
    return figs


async def run_floors(root: Path, count: int) -> list[Figure]:
    home, payload_file, schema_file = root / "small", root / "payloads.json", root / "schemas.json"
    section(f"against the floor: {STORED:,} messages stored, a thread of {THREAD_MSGS}, {PROFILES} profiles")
    build_small_home(home)
    ids = json.loads((home / "ids.json").read_text())
    figures: list[Figure] = []
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home)])
    async with Client(params) as ours:
        payload_file.write_text(json.dumps(await payloads(ours, ids)))
        schema_file.write_text(json.dumps(await output_schemas(ours)))
        floor_args = [str(FLOOR), str(payload_file), "stdio"]
        floor_params = StdioServerParameters(command=sys.executable, args=floor_args)
        schema_params = StdioServerParameters(command=sys.executable, args=[*floor_args, str(schema_file)])
        pipes_args = [str(FLOOR), str(payload_file), "stdio-pipes"]
        pipes_params = StdioServerParameters(command=sys.executable, args=pipes_args)
        async with Client(floor_params) as floor, Client(schema_params) as schema_floor, \
                Client(pipes_params) as pipes_floor:
            figures += floor_figures("stdio", await against_floor((ours, floor, schema_floor, pipes_floor), ids,
                                                                  count))
    daemon = Daemon("small", home, 0, fleet_key="", log_level="warning")
    daemon.initialised = True
    info = await asyncio.to_thread(daemon.start)
    proc, url = await floor_http(payload_file)
    schema_proc, schema_url = await floor_http(payload_file, schema_file)
    try:
        async with mcp_session(info["mcp_url"], daemon.token) as ours, Client(url) as floor, \
                Client(schema_url) as schema_floor:
            figures += floor_figures("HTTP", await against_floor((ours, floor, schema_floor), ids, count))
    finally:
        for p in (proc, schema_proc):
            p.terminate()
            await p.wait()
        daemon.stop(30)
    return figures


async def timed(call: Callable[[int], Awaitable[object]], count: int) -> list[float]:
    out = []
    for i in range(count):
        t = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def tool_latencies(client: Client, count: int) -> dict[str, list[float]]:
    async def send(i: int) -> object:
        result = await client.call_tool("send_message", {"from": "bench", "channel": "reader", "content": f"m{i}"})
        assert not result.is_error, result.content
        return result

    async def check(_i: int) -> object:
        result = await client.call_tool("check_messages", {"recipient": "reader", "limit": 10})
        assert not result.is_error, result.content
        return result

    await timed(send, 20)  # warm up
    await timed(check, 20)
    return {"send_message": await timed(send, count), "check_messages": await timed(check, count)}


def direct_latencies(home: Path, count: int) -> dict[str, list[float]]:
    with open_home(home) as rep:
        def send(i: int) -> None:
            rep.send_message("bench", "reader", f"d{i}")

        def check(_i: int) -> None:
            rep.check_messages("reader", limit=10)

        out: dict[str, list[float]] = {"send_message": [], "check_messages": []}
        for name, fn in (("send_message", send), ("check_messages", check)):
            for i in range(count):
                t = time.perf_counter()
                fn(i)
                out[name].append((time.perf_counter() - t) * 1000)
    return out


def figures_for(label: str, lat: dict[str, list[float]], base: dict[str, list[float]],
                target: float | None) -> list[Figure]:
    figs = []
    for tool in ("send_message", "check_messages"):
        p50, p99 = percentile(lat[tool], 50), percentile(lat[tool], 99)
        b50, b99 = percentile(base[tool], 50), percentile(base[tool], 99)
        figs.append(report(Figure(f"{label} {tool} p50", p50, "ms", at_most(target) if target else None, b50)))
        figs.append(report(Figure(f"{label} {tool} p99", p99, "ms", None, b99)))
    return figs


async def run(messages: int, count: int, root: Path) -> list[Figure]:
    figures = await run_floors(root, count)
    home = root / "home"
    section(f"building a replica with {messages:,} messages")
    note(f"built in {build_home(home, messages):.1f} s (not timed)")
    section("baseline: the Python API in-process")
    base = direct_latencies(home, count)
    for tool, xs in base.items():
        note(f"{tool}: p50 {percentile(xs, 50):.3f} ms, p99 {percentile(xs, 99):.3f} ms")
    section("streamable HTTP to a running daemon (SDK client, one session)")
    daemon = Daemon("daemon", home, 0, fleet_key="", log_level="warning")
    daemon.initialised = True  # build_home made it
    info = await asyncio.to_thread(daemon.start)
    try:
        async with mcp_session(info["mcp_url"], daemon.token) as client:
            figures += figures_for("HTTP", await tool_latencies(client, count), base, 5.0)
    finally:
        daemon.stop(30)
    section("stdio to `peerd mcp` (SDK client)")
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home)])
    async with Client(params) as client:
        figures += figures_for("stdio", await tool_latencies(client, count), base, None)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MCP tool-call latency over HTTP and stdio")
    parser.add_argument("--quick", action="store_true", help="10k messages, fewer calls")
    args = parser.parse_args(argv)
    messages, count = (10_000, 100) if args.quick else (100_000, 500)
    print(f"peerd MCP latency benchmark; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(run(messages, count, Path(tmp)))
    print_summary(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
