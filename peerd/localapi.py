"""The local JSON API: status, messaging, the operator views and the dashboard's
live event stream, used by the CLI, the dashboard and tests.

Invariants:
* Every handler takes its arguments through ``peerd.apiargs`` (a missing or
  wrong-typed field is a 400 naming it) and the replica API (which raises
  InvalidArgument / NotFound with a clear message) and runs SQLite work in a
  worker thread; the operator views only read (see ``peerd.dashboard.views``).
* A request that waits (``/api/check`` and ``/api/messages`` with ``wait``,
  the ``/api/events`` and ``/api/feed`` streams) wakes on the process's change
  feed (``node.waiter``), never polls, is bounded in time (``/api/feed`` only by
  the daemon's life), and ends at once when the daemon starts to shut down
  (the daemon closes the waiter: an event), so an open dashboard or a
  ``peerd mcp`` following the feed never holds a daemon up.
* Marks (``version`` in events, ``lseq`` in the feed) are the replica's
  ``max_lseq``: they only grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from peerd.apiargs import opt_bool, opt_int, opt_str, parse_int, parse_text, read_json, req_str, route, str_list
from peerd.dashboard import page_routes, views
from peerd.home import CLIENT_HEADER
from peerd.node import Node
from replica import InvalidArgument
from replica.api import DEFAULT_LIMIT, now_ms
from replica.feed import FeedWaiter
from replica.service import CLI_WORDS, Service

WAIT_CAP = 300.0
MESSAGES_WAIT_CAP = 60.0
STREAM_SECONDS = 60.0  # an event stream ends after this long; EventSource reconnects by itself
KEEPALIVE_SECONDS = 5.0
RETRY_MS = 1000


async def status(node: Node, info: dict[str, Any]) -> dict[str, Any]:
    stats: dict[str, Any] = dict(await asyncio.to_thread(node.rep.stats))
    if stats.get("newer_ops"):
        stats["newer_kinds"] = await asyncio.to_thread(node.rep.newer_ops)
    peers = await node.peers_report()
    return {
        **info,
        "fleet_id": node.keys.fleet_id,
        "fleet": {"epoch": node.keys.epoch, "removed_here": node.keys.removed,
                  "admitted_here": node.admitted_here, "conflicts": node.conflicts,
                  "previous_fleet_ids": list(node.keys.previous_ids)},
        "other_fleets": node.others.report(time.time()),
        "join_requests": len(node.pairing.requests()),
        "uptime": round(time.time() - node.started, 1),
        "totals": stats,
        "peers": peers,
        "live_peers": sum(1 for p in peers if p["reachable"]),
        "lag": sum(p["lag"] or 0 for p in peers if p["reachable"]),
        "counters": dict(node.counters),
        "waiting": node.waiter.waiting,
        "catchup": node.catchup_report(),
        "snapshot": node.snapshots.status(),
        "relay": node.relay.report(),
        "own_history_ahead": None if node.own_ahead is None else node.own_ahead.to_dict(),
        "mdns": None if node.mdns is None else {"active": node.mdns.active, "announced": node.mdns.announced,
                                                 "problem": node.mdns.problem},
        "settings": settings(node),
        "retention": (await asyncio.to_thread(node.rep.retention)).to_dict(),
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
    return parse_int(raw, name)


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
    return None if raw is None or raw.strip() == "" else parse_text(raw, name)


def check_wait(value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InvalidArgument("wait must be a number of seconds >= 0")
    return min(float(value), WAIT_CAP)


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    """One server-sent event."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def wait_for(waiter: FeedWaiter, seen: int, within: float) -> bool:
    """Wait up to ``within`` s for the mark to pass ``seen``; False if the daemon is closing."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await waiter.wait_beyond(seen)
    return not waiter.closed


def build_routes(node: Node, info: dict[str, Any]) -> list[BaseRoute]:
    return [*_node_routes(node, info), *_messaging_routes(node), *_view_routes(node), *page_routes()]


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


def _messaging_routes(node: Node) -> list[BaseRoute]:
    """The messaging use cases, each one ``replica.service.Service`` call in its vocabulary."""
    tools, cli = Service(node.rep), Service(node.rep, CLI_WORDS)

    def door(r: Request) -> Service:
        """The service in the caller's words: the command line says who it is (``CLIENT_HEADER``)."""
        return cli if r.headers.get(CLIENT_HEADER) == "cli" else tools

    svc = tools

    async def send(r: Request) -> Any:
        d = await read_json(r)
        sent = await asyncio.to_thread(
            svc.send, req_str(d, "from"), req_str(d, "channel"), req_str(d, "content"),
            instance=opt_str(d, "instanceId"), from_instance=opt_str(d, "fromInstanceId"),
        )
        return sent.wire()

    async def check(r: Request) -> Any:
        d = await read_json(r)
        deadline = time.monotonic() + check_wait(d.get("wait", 0))
        recipient, instance = req_str(d, "recipient"), opt_str(d, "recipientInstanceId")
        since, limit, include_read = opt_int(d, "since"), opt_int(d, "limit"), opt_bool(d, "all")
        warning = None  # the first look's: a role never seen is known once it has looked
        while True:
            seen = node.waiter.mark
            inbox = await asyncio.to_thread(svc.inbox, recipient, instance, since,
                                            DEFAULT_LIMIT if limit is None else limit, include_read=include_read,
                                            now_ms=now_ms())
            warning = warning or inbox.get("warning")
            left = deadline - time.monotonic()
            if inbox["messages"] or left <= 0 or not await wait_for(node.waiter, seen, left):
                return {**inbox, "warning": warning}

    async def read(r: Request) -> Any:
        d = await read_json(r)
        done = await asyncio.to_thread(door(r).mark, str_list(d, "receiptIds"), opt_str(d, "callerOrchestrator"))
        return done.wire()

    async def retract(r: Request) -> Any:
        d = await read_json(r)
        return await asyncio.to_thread(svc.retract, req_str(d, "messageId"), req_str(d, "from"))

    async def msg_status(r: Request) -> Any:
        return await asyncio.to_thread(door(r).status, r.path_params["message_id"])

    async def update_profile(r: Request) -> Any:
        d = await read_json(r)
        return await asyncio.to_thread(
            svc.update_profile, req_str(d, "orchestratorId"), opt_str(d, "name"), opt_str(d, "static"),
            opt_str(d, "dynamic"),
        )

    async def get_profile(r: Request) -> Any:
        return await asyncio.to_thread(svc.profile, r.path_params["orchestrator_id"])

    async def list_profiles(_r: Request) -> Any:
        return await asyncio.to_thread(svc.profiles)

    return [
        route("/api/send", send, ["POST"]),
        route("/api/check", check, ["POST"]),
        route("/api/read", read, ["POST"]),
        route("/api/retract", retract, ["POST"]),
        route("/api/messages/{message_id}/status", msg_status, ["GET"]),
        route("/api/profiles", list_profiles, ["GET"]),
        route("/api/profiles", update_profile, ["POST"]),
        route("/api/profiles/{orchestrator_id}", get_profile, ["GET"]),
    ]


def _view_routes(node: Node) -> list[BaseRoute]:
    rep = node.rep

    async def messages(r: Request) -> Any:
        after, limit = int_param(r, "after"), limit_param(r)
        deadline = time.monotonic() + float_param(r, "wait", MESSAGES_WAIT_CAP)
        while True:
            seen = node.waiter.mark
            out = await asyncio.to_thread(views.message_log, rep, after=after, limit=limit,
                                          with_recipients=flag_param(r, "receipts"))
            left = deadline - time.monotonic()
            if out["messages"] or after is None or left <= 0 or not await wait_for(node.waiter, seen, left):
                return out

    async def search(r: Request) -> Any:
        return await asyncio.to_thread(
            views.search, rep, parse_text(r.query_params.get("q", ""), "q"), from_=str_param(r, "from"),
            channel=str_param(r, "channel"), since=int_param(r, "since"), limit=limit_param(r),
            with_recipients=flag_param(r, "receipts"),
        )

    async def threads(_r: Request) -> Any:
        return await asyncio.to_thread(views.threads, rep)

    async def events(_r: Request) -> Response:
        return StreamingResponse(event_stream(node), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def feed(_r: Request) -> Response:
        return StreamingResponse(feed_stream(node.waiter), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store"})

    return [
        route("/api/messages", messages, ["GET"]),
        route("/api/search", search, ["GET"]),
        route("/api/threads", threads, ["GET"]),
        Route("/api/events", events, methods=["GET"]),
        Route("/api/feed", feed, methods=["GET"]),
    ]


async def event_stream(node: Node) -> AsyncIterator[str]:
    """``hello``, then a ``change`` event whenever the replica changes; ends after
    STREAM_SECONDS (the browser reconnects) or at once when the daemon shuts down."""
    waiter = node.waiter
    seen = waiter.mark
    yield f"retry: {RETRY_MS}\n\n" + sse("hello", {"version": seen, "node_id": node.rep.node_id})
    end = time.monotonic() + STREAM_SECONDS
    while (left := end - time.monotonic()) > 0:
        if not await wait_for(waiter, seen, min(left, KEEPALIVE_SECONDS)):
            return
        if waiter.mark > seen:
            seen = waiter.mark
            yield sse("change", {"version": seen})
        else:
            yield ": keepalive\n\n"


async def feed_stream(waiter: FeedWaiter) -> AsyncIterator[str]:
    """The change stream other local processes follow (``peerd mcp``): one line
    ``{"lseq": N}`` at once, then one each time the mark moves (bursts coalesce),
    until the daemon shuts down. Quiet while nothing changes: the reader learns
    that the daemon is gone from the connection closing."""
    seen = waiter.mark
    yield json.dumps({"lseq": seen}) + "\n"
    while True:
        await waiter.wait_beyond(seen)
        if waiter.closed:
            return
        seen = waiter.mark
        yield json.dumps({"lseq": seen}) + "\n"
