"""The local API of pairing and membership: join requests, one-time codes, removing a node,
and taking a new config after ``peerd join``.

Invariants:
* Every route goes through ``peerd.apiargs`` (400 for a bad field, 404 for an unknown code or node);
  a refusal of the pairing desk keeps its meaning (unknown: 404, anything else: 400), never a 500.
* ``resolve_node`` is pure: a node is named by a prefix of its id (at least 4 hex digits) or by its
  name; an ambiguous or unknown name is an error listing what would match, and removes nothing.
* Removing writes one signed rekey op (``Replica.remove_node``), rotating one with no removal
  (``Replica.rotate``); either switches this node to the new key at once; nothing is written when
  the node cannot be resolved or removed, or this node may not change the fleet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute

from peerd.apiargs import read_json, req_str, route
from peerd.config import fleet_id, new_fleet_key
from peerd.node import Node
from peerd.pairing.desk import CODE_TTL
from replica import InvalidArgument, NotFound
from replica.fleet import FleetView

MAX_CODE_TTL = 24 * 3600.0
MIN_PREFIX = 4


def _label(key: bytes, names: dict[bytes, str]) -> str:
    name = names.get(key)
    return f"{name} ({key.hex()[:16]})" if name else key.hex()[:16]


def resolve_node(text: str, known: Iterable[bytes], names: dict[bytes, str]) -> bytes:
    """The node ``text`` names (an id prefix or a name); NotFound or InvalidArgument otherwise."""
    wanted = text.strip().lower()
    keys = sorted(set(known))
    if len(wanted) >= MIN_PREFIX and all(c in "0123456789abcdef" for c in wanted):
        hits = [k for k in keys if k.hex().startswith(wanted)]
    else:
        hits = [k for k in keys if names.get(k, "").lower() == wanted]
    if len(hits) == 1:
        return hits[0]
    listing = ", ".join(_label(k, names) for k in keys) or "none"
    if not hits:
        raise NotFound(f"no node named {text!r} or with an id starting so; known nodes: {listing}")
    raise InvalidArgument(f"{text!r} names {len(hits)} nodes ({', '.join(_label(k, names) for k in hits)}); "
                          "give more of the node id")


def _names(node: Node, view: FleetView) -> dict[bytes, str]:
    """Names of nodes: the ones members were let in under, then the ones peers go by."""
    names = {k: a.name for k, a in view.admitted.items()}
    known = (*view.origins, *view.admitted)
    for p in node.table.peers.values():
        if p.name and p.node:
            for k in known:
                if k.startswith(p.node):
                    names.setdefault(k, p.name)
    names[node.rep.node_key] = node.cfg.name
    return names


def fleet_report(node: Node, view: FleetView) -> dict[str, Any]:
    names = _names(node, view)
    st = view.standing
    everyone = sorted({*view.origins, *view.admitted, *st.removed, node.rep.node_key})
    return {
        "fleet_id": node.keys.fleet_id, "epoch": node.keys.epoch, "removed_here": node.keys.removed,
        "previous_fleet_ids": list(node.keys.previous_ids),
        "nodes": [{"node_id": k.hex(), "name": names.get(k), "me": k == node.rep.node_key,
                   "admitted": st.counts(k), "removed": k in st.removed, "upto": st.removed.get(k),
                   "conflict": k in st.conflicts} for k in everyone],
    }


def pairing_routes(node: Node, reload: Callable[[], Awaitable[dict[str, Any]]]) -> list[BaseRoute]:
    host = node.pairing

    async def requests(_r: Request) -> Any:
        return host.requests()

    async def approve(r: Request) -> Any:
        code = req_str(await read_json(r), "code")
        return await host.approve(code)  # a DeskError carries its own status (replica.errors.face)

    async def reject(r: Request) -> Any:
        code = req_str(await read_json(r), "code")
        return host.reject(code)  # a DeskError carries its own status (replica.errors.face)

    async def new_code(r: Request) -> Any:
        d = await read_json(r)
        ttl = d.get("expires", CODE_TTL)
        if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not 0 < ttl <= MAX_CODE_TTL:
            raise InvalidArgument(f"expires must be a number of seconds from 1 to {int(MAX_CODE_TTL)}")
        return {**host.new_code(float(ttl)), "addresses": node.lan_seeds()}

    async def fleet(_r: Request) -> Any:
        return fleet_report(node, await asyncio.to_thread(node.rep.fleet_view))

    async def remove(r: Request) -> Any:
        text = req_str(await read_json(r), "node")
        view = await asyncio.to_thread(node.rep.fleet_view)
        names = _names(node, view)
        target = resolve_node(text, (*view.origins, *view.admitted, node.rep.node_key), names)
        key = new_fleet_key()
        started = time.monotonic()
        rekey = await asyncio.to_thread(node.rep.remove_node, target, key, fleet_id(key))
        await node.refresh_keys()
        return {"removed": target.hex(), "name": names.get(target), "upto": rekey.removes[target],
                "fleet_id": rekey.fleet_id, "epoch": rekey.epoch, "members": len(rekey.entries),
                "took": round(time.monotonic() - started, 3)}

    async def rotate(_r: Request) -> Any:
        key = new_fleet_key()
        rekey = await asyncio.to_thread(node.rep.rotate, key, fleet_id(key))
        await node.refresh_keys()
        return {"fleet_id": rekey.fleet_id, "epoch": rekey.epoch, "members": len(rekey.entries)}

    async def reload_config(_r: Request) -> Any:
        return await reload()

    return [
        route("/api/pair/requests", requests, ["GET"]),
        route("/api/pair/approve", approve, ["POST"]),
        route("/api/pair/reject", reject, ["POST"]),
        route("/api/pair/code", new_code, ["POST"]),
        route("/api/fleet", fleet, ["GET"]),
        route("/api/fleet/remove", remove, ["POST"]),
        route("/api/fleet/rotate", rotate, ["POST"]),
        route("/api/fleet/reload", reload_config, ["POST"]),
    ]
