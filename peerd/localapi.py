"""The local JSON API: status and the messaging calls, used by the CLI and tests.

Every handler checks its arguments through the replica API (which raises
InvalidArgument / NotFound with a clear message) and runs SQLite work in a
worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute

from peerd.local import read_json, route
from peerd.node import Node
from replica import InvalidArgument

WAIT_CAP = 300.0


def _opt(data: dict[str, Any], key: str) -> Any:
    return data.get(key)


def status(node: Node, info: dict[str, Any]) -> dict[str, Any]:
    stats = node.rep.stats()
    peers = node.peers_report()
    return {
        **info,
        "uptime": round(time.time() - node.started, 1),
        "totals": stats,
        "peers": peers,
        "live_peers": sum(1 for p in peers if p["reachable"]),
        "lag": sum(p["lag"] or 0 for p in peers if p["reachable"]),
        "counters": dict(node.counters),
        "catchup": None if node.catchup is None else node.catchup.to_dict(),
    }


def build_routes(node: Node, info: dict[str, Any]) -> list[BaseRoute]:
    rep = node.rep

    async def get_status(_r: Request) -> Any:
        return await asyncio.to_thread(status, node, info)

    async def get_peers(_r: Request) -> Any:
        return await asyncio.to_thread(node.peers_report)

    async def send(r: Request) -> Any:
        d = await read_json(r)
        sent = await asyncio.to_thread(
            rep.send_message, d.get("from"), d.get("channel"), d.get("content"),  # type: ignore[arg-type]
            _opt(d, "instanceId"), _opt(d, "fromInstanceId"),
        )
        return sent.to_dict()

    async def check(r: Request) -> Any:
        d = await read_json(r)
        wait = d.get("wait", 0)
        if not isinstance(wait, int | float) or isinstance(wait, bool) or wait < 0:
            raise InvalidArgument("wait must be a number of seconds >= 0")
        deadline = time.monotonic() + min(float(wait), WAIT_CAP)
        while True:
            seen = node.changes.version
            inbox = await asyncio.to_thread(
                rep.check_messages, d.get("recipient"), _opt(d, "recipientInstanceId"),  # type: ignore[arg-type]
                _opt(d, "since"), d.get("limit", 50),
            )
            left = deadline - time.monotonic()
            if inbox.messages or left <= 0:
                return inbox.to_dict()
            await node.changes.wait(seen, left)

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

    async def digest(_r: Request) -> Any:
        return {"digest": await asyncio.to_thread(rep.state_digest), "vector_size": len(rep.vector())}

    return [
        route("/api/status", get_status, ["GET"]),
        route("/api/peers", get_peers, ["GET"]),
        route("/api/send", send, ["POST"]),
        route("/api/check", check, ["POST"]),
        route("/api/read", read, ["POST"]),
        route("/api/messages/{message_id}/status", msg_status, ["GET"]),
        route("/api/profiles", list_profiles, ["GET"]),
        route("/api/profiles", update_profile, ["POST"]),
        route("/api/profiles/{orchestrator_id}", get_profile, ["GET"]),
        route("/api/digest", digest, ["GET"]),
    ]
