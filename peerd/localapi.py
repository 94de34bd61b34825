"""The local JSON API: status, messaging, the operator views and the dashboard's
live event stream, used by the CLI, the dashboard and tests.

Invariants:
* Every handler checks its arguments through the replica API (which raises
  InvalidArgument / NotFound with a clear message) and runs SQLite work in a
  worker thread; the operator views only read (see ``peerd.dashboard.views``).
* A request that waits (``/api/check`` and ``/api/messages`` with ``wait``,
  the ``/api/events`` stream) wakes on ``node.changes``, never busy-polls, is
  bounded in time, and ends within about a second once the daemon starts to
  shut down (its ``daemon.json`` is gone), so an open dashboard never holds a
  daemon up.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from peerd import home as homes
from peerd.dashboard import page_routes, views
from peerd.local import read_json, route
from peerd.node import Node
from replica import InvalidArgument
from replica.api import DEFAULT_LIMIT

WAIT_CAP = 300.0
MESSAGES_WAIT_CAP = 60.0
STREAM_SECONDS = 60.0  # an event stream ends after this long; EventSource reconnects by itself
KEEPALIVE_SECONDS = 5.0
SLICE_SECONDS = 1.0  # how often a waiting request looks whether the daemon is shutting down
RETRY_MS = 1000


def _opt(data: dict[str, Any], key: str) -> Any:
    return data.get(key)


async def status(node: Node, info: dict[str, Any]) -> dict[str, Any]:
    stats = await asyncio.to_thread(node.rep.stats)
    peers = await node.peers_report()
    return {
        **info,
        "uptime": round(time.time() - node.started, 1),
        "totals": stats,
        "peers": peers,
        "live_peers": sum(1 for p in peers if p["reachable"]),
        "lag": sum(p["lag"] or 0 for p in peers if p["reachable"]),
        "counters": dict(node.counters),
        "catchup": None if node.catchup is None else node.catchup.to_dict(),
        "mdns": None if node.mdns is None else {"active": node.mdns.active, "announced": node.mdns.announced,
                                                 "problem": node.mdns.problem},
        "settings": settings(node),
        "now": time.time(),
    }


def settings(node: Node) -> dict[str, Any]:
    """The settings in force (config.toml plus command-line flags) that operators ask about."""
    cfg = node.cfg
    return {"port": node.peer_port, "mdns": cfg.mdns, "seeds": list(cfg.seeds),
            "gossip_interval": cfg.gossip_interval, "gossip_max_interval": cfg.gossip_max_interval,
            "push_fanout": cfg.push_fanout}


# -- query parameters -------------------------------------------------------------------------


def int_param(r: Request, name: str) -> int | None:
    raw = r.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {raw!r}") from None


def limit_param(r: Request, default: int = DEFAULT_LIMIT) -> int:
    value = int_param(r, "limit")
    return default if value is None else value


def float_param(r: Request, name: str, cap: float) -> float:
    raw = r.query_params.get(name)
    if raw is None or raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value >= 0:
        raise InvalidArgument(f"{name} must be >= 0")
    return min(value, cap)


def flag_param(r: Request, name: str) -> bool:
    return r.query_params.get(name, "").lower() in ("1", "true", "yes", "on")


def str_param(r: Request, name: str) -> str | None:
    raw = r.query_params.get(name)
    return None if raw is None or raw.strip() == "" else raw


def check_wait(value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("wait must be a number of seconds >= 0")
    return min(float(value), WAIT_CAP)


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    """One server-sent event."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def shutting_down(info: dict[str, Any]) -> Callable[[], bool]:
    """True once this daemon's daemon.json is gone (the first step of a clean stop)."""
    home = info.get("home")
    if not home:
        return lambda: False
    path = homes.daemon_json_path(Path(str(home)))
    return lambda: not path.exists()


async def wait_for(node: Node, seen: int, within: float, closing: Callable[[], bool]) -> bool:
    """Wait up to ``within`` s for a change after version ``seen``; False if the daemon is closing."""
    deadline = time.monotonic() + within
    while not closing():
        left = deadline - time.monotonic()
        if left <= 0 or await node.changes.wait(seen, min(left, SLICE_SECONDS)) != seen:
            return True
    return False


def build_routes(node: Node, info: dict[str, Any]) -> list[BaseRoute]:
    closing = shutting_down(info)
    return [*_node_routes(node, info), *_messaging_routes(node, closing), *_view_routes(node, closing),
            *page_routes()]


def _node_routes(node: Node, info: dict[str, Any]) -> list[BaseRoute]:
    rep = node.rep

    async def get_status(_r: Request) -> Any:
        return await status(node, info)

    async def get_peers(_r: Request) -> Any:
        return await node.peers_report()

    async def digest(_r: Request) -> Any:
        digest, size = await asyncio.to_thread(lambda: (rep.state_digest(), len(rep.vector())))
        return {"digest": digest, "vector_size": size}

    return [
        route("/api/status", get_status, ["GET"]),
        route("/api/peers", get_peers, ["GET"]),
        route("/api/digest", digest, ["GET"]),
    ]


def _messaging_routes(node: Node, closing: Callable[[], bool]) -> list[BaseRoute]:
    rep = node.rep

    async def send(r: Request) -> Any:
        d = await read_json(r)
        sent = await asyncio.to_thread(
            rep.send_message, d.get("from"), d.get("channel"), d.get("content"),  # type: ignore[arg-type]
            _opt(d, "instanceId"), _opt(d, "fromInstanceId"),
        )
        return sent.to_dict()

    async def check(r: Request) -> Any:
        d = await read_json(r)
        deadline = time.monotonic() + check_wait(d.get("wait", 0))
        include_read = d.get("all", False)
        if not isinstance(include_read, bool):
            raise InvalidArgument("all must be true or false")
        while True:
            seen = node.changes.version
            inbox = await asyncio.to_thread(
                views.inbox, rep, d.get("recipient"), _opt(d, "recipientInstanceId"),  # type: ignore[arg-type]
                include_read=include_read, since=_opt(d, "since"), limit=d.get("limit", 50),
            )
            left = deadline - time.monotonic()
            if inbox["messages"] or left <= 0 or not await wait_for(node, seen, left, closing):
                return inbox

    async def read(r: Request) -> Any:
        d = await read_json(r)
        return {"marked": await asyncio.to_thread(rep.mark_as_read, d.get("receiptIds"))}  # type: ignore[arg-type]

    async def msg_status(r: Request) -> Any:
        rows = await asyncio.to_thread(rep.message_status, r.path_params["message_id"])
        return [s.to_dict() for s in rows]

    async def update_profile(r: Request) -> Any:
        d = await read_json(r)
        p = await asyncio.to_thread(
            rep.update_profile, d.get("orchestratorId"), d.get("name"), d.get("static"), d.get("dynamic"),  # type: ignore[arg-type]
        )
        return p.to_dict()

    async def get_profile(r: Request) -> Any:
        p = await asyncio.to_thread(rep.get_profile, r.path_params["orchestrator_id"])
        return None if p is None else p.to_dict()

    async def list_profiles(_r: Request) -> Any:
        return [p.to_dict() for p in await asyncio.to_thread(rep.list_profiles)]

    return [
        route("/api/send", send, ["POST"]),
        route("/api/check", check, ["POST"]),
        route("/api/read", read, ["POST"]),
        route("/api/messages/{message_id}/status", msg_status, ["GET"]),
        route("/api/profiles", list_profiles, ["GET"]),
        route("/api/profiles", update_profile, ["POST"]),
        route("/api/profiles/{orchestrator_id}", get_profile, ["GET"]),
    ]


def _view_routes(node: Node, closing: Callable[[], bool]) -> list[BaseRoute]:
    rep = node.rep

    async def messages(r: Request) -> Any:
        after, limit = int_param(r, "after"), limit_param(r)
        deadline = time.monotonic() + float_param(r, "wait", MESSAGES_WAIT_CAP)
        while True:
            seen = node.changes.version
            out = await asyncio.to_thread(views.message_log, rep, after=after, limit=limit,
                                          with_recipients=flag_param(r, "receipts"))
            left = deadline - time.monotonic()
            if out["messages"] or after is None or left <= 0 or not await wait_for(node, seen, left, closing):
                return out

    async def search(r: Request) -> Any:
        return await asyncio.to_thread(
            views.search, rep, r.query_params.get("q", ""), from_=str_param(r, "from"),
            channel=str_param(r, "channel"), since=int_param(r, "since"), limit=limit_param(r),
            with_recipients=flag_param(r, "receipts"),
        )

    async def threads(_r: Request) -> Any:
        return await asyncio.to_thread(views.threads, rep)

    async def events(_r: Request) -> Response:
        return StreamingResponse(event_stream(node, closing), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return [
        route("/api/messages", messages, ["GET"]),
        route("/api/search", search, ["GET"]),
        route("/api/threads", threads, ["GET"]),
        Route("/api/events", events, methods=["GET"]),
    ]


async def event_stream(node: Node, closing: Callable[[], bool]) -> AsyncIterator[str]:
    """``hello``, then a ``change`` event whenever the replica changes; ends after
    STREAM_SECONDS (the browser reconnects) or when the daemon shuts down."""
    seen = node.changes.version
    yield f"retry: {RETRY_MS}\n\n" + sse("hello", {"version": seen, "node_id": node.rep.node_id})
    end = time.monotonic() + STREAM_SECONDS
    quiet_since = time.monotonic()
    while time.monotonic() < end and not closing():
        now = await node.changes.wait(seen, SLICE_SECONDS)
        if now != seen:
            seen = now
            quiet_since = time.monotonic()
            yield sse("change", {"version": now})
        elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
