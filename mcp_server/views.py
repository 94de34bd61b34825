"""From replica values to tool results, as pure functions: VantagePeers' names and forms
(``messageId``, ``from``, ``createdAt`` in Unix ms ...), the list cursors, and the peer list merged
from profiles and senders.

Invariants: pure (values in, values out; no replica, no I/O); the hot results (``inbox_item``,
``peers_page``) are built as plain ``Wire`` dicts already in their output model's wire form (names,
order, JSON values); a cursor is opaque to agents, and one that does not decode is
``invalid_argument``, never an empty page.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from mcp_server import schemas as s
from mcp_server.calls import Wire
from replica import (
    InboxMessage,
    InvalidArgument,
    MessageRecord,
    Profile,
    SenderSeen,
)
from replica.names import name_key
from replica.stamps import iso_ms, ms_of_iso

RECENT_MS = 15 * 60 * 1000  # "reachable": seen in the last 15 minutes


def ms(stamp: str | None) -> int | None:
    """A replica time (ISO-8601, millisecond precision) as Unix ms, as VantagePeers shows times."""
    return None if stamp is None else ms_of_iso(stamp)


def encode_cursor(payload: dict[str, Any]) -> str:
    """An opaque page cursor: base64url of JSON, no padding (VantagePeers' form)."""
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(token: str | None, key: str) -> Any:
    """The ``key`` of a cursor this server returned, or None for no cursor (absent or empty)."""
    if not token:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error):
        raise InvalidArgument("invalid cursor: not a cursor this tool returned") from None
    if not isinstance(payload, dict) or key not in payload:
        raise InvalidArgument("invalid cursor: not a cursor of this tool")
    return payload[key]


def message_out(m: MessageRecord) -> s.MessageOut:
    return s.MessageOut(message_id=m.id, sender=m.sender, from_instance_id=m.sender_instance, channel=m.channel,
                        instance_id=m.target_instance, thread_id=m.thread, content=m.content,
                        created_at=ms_of_iso(m.created), session_day=m.session_day, tenant_id=m.tenant, seq=m.seq,
                        retracted=m.retracted is not None, retracted_at=ms(m.retracted),
                        from_node=None if m.from_node is None else s.NodeOut(id=m.from_node, name=m.from_node_name))


def inbox_item(m: InboxMessage) -> Wire:
    """``s.InboxItem`` in wire form."""
    return {"messageId": m.id, "receiptId": m.receipt_id, "from": m.sender, "fromInstanceId": m.sender_instance,
            "channel": m.channel, "instanceId": m.target_instance, "content": m.content,
            "createdAt": ms_of_iso(m.created), "deliveredAt": ms(m.delivered_at), "readAt": ms(m.read_at),
            "seq": m.seq, "fromNode": node_item(m.from_node, m.from_node_name)}


def node_item(node: str | None, name: str | None) -> Wire | None:
    """``s.NodeOut`` in wire form: the sending node of a message, None if not known."""
    return None if node is None else {"id": node, "name": name}


def profile_out(p: Profile) -> s.ProfileOut:
    """A profile with VantagePeers' defaults for what was never written (shown, not stored)."""
    static = {**p.static, **{k: v for k, v in (("role", ""), ("workspace", ""), ("capabilities", []))
                             if k not in p.static}}
    dynamic = {**p.dynamic, **{k: v for k, v in (("lastSeen", ms(p.updated)), ("sessionCount", 0))
                               if k not in p.dynamic}}
    return s.ProfileOut(orchestrator_id=p.orchestrator_id, instance_id=p.instance_id,
                        name=p.name if p.name is not None else p.instance_id or p.orchestrator_id,
                        static=static, dynamic=dynamic, created_at=ms(p.created), updated_at=ms(p.updated))


def profile_result(oid: str, p: Profile | None) -> s.ProfileResult:
    if p is None:
        return s.ProfileResult(profile_id=None, orchestrator_id=oid, name=None, profile=None)
    out = profile_out(p)
    return s.ProfileResult(profile_id=p.profile_id, orchestrator_id=p.orchestrator_id, name=out.name, profile=out)


def _number(value: object) -> int | float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _text(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _peer(p: Profile, instance: str | None, seen_ms: int | None, now_ms: int, *, own: bool) -> Wire:
    """One peer entry (``s.PeerOut`` in wire form) built on profile ``p`` (the entry's own, or its
    role's when ``own`` is false), with ``profile_out``'s defaults (lastSeen: its last update)."""
    static, dynamic = p.static, p.dynamic
    shown = dynamic["lastSeen"] if "lastSeen" in dynamic else ms(p.updated)
    last = max((t for t in (seen_ms, _number(shown) or None) if t is not None), default=None)
    name = p.name if p.name is not None else p.instance_id or p.orchestrator_id
    return {"id": p.orchestrator_id, "instanceId": instance or p.orchestrator_id,
            "name": name if own else instance or name, "role": _text(static.get("role")),
            "workspace": _text(static.get("workspace")), "currentTask": _text(dynamic.get("currentTask"), "idle"),
            "lastSeen": None if last is None else iso_ms(int(last)),
            "sessionCount": _number(dynamic.get("sessionCount", 0)),
            "reachable": last is not None and now_ms - last <= RECENT_MS, "profileId": p.profile_id if own else None}


PeerKey = tuple[str, str]


def merge_peers(profiles: Sequence[Profile], senders: Sequence[SenderSeen],
                now_ms: int) -> list[tuple[PeerKey, Wire]]:
    """One entry per profile (a role's, an instance's) and per sender (role, instance) without one,
    by (role, instance) key: what a profile says, and when the newest of its lastSeen, its updates
    and its messages was. A sender without a profile shows its role's profile, if any."""
    by_key = {(name_key(p.orchestrator_id), name_key(p.instance_id or "")): p for p in profiles}
    seen = {(name_key(x.role), name_key(x.instance or "")): x for x in senders}
    peers: dict[PeerKey, Wire] = {}
    for key, p in by_key.items():
        sender = seen.get(key)
        peers[key] = _peer(p, p.instance_id, ms(sender.last_seen) if sender else None, now_ms, own=True)
    for key, x in seen.items():
        if key in peers:
            continue
        base = by_key.get((key[0], ""))
        if base is None:
            peers[key] = {"id": x.role, "instanceId": x.instance or x.role, "name": x.instance or x.role, "role": "",
                          "workspace": "", "currentTask": "idle", "lastSeen": x.last_seen, "sessionCount": 0,
                          "reachable": now_ms - (ms(x.last_seen) or 0) <= RECENT_MS, "profileId": None}
        else:
            peers[key] = _peer(base, x.instance, ms(x.last_seen), now_ms, own=False)
    return [(k, peers[k]) for k in sorted(peers)]


def peers_page(peers: list[tuple[PeerKey, Wire]], after: object, limit: int) -> Wire:
    """The ``limit`` peers after the key ``after`` (a [role, instance] key) of an earlier page."""
    if after is not None and not (isinstance(after, list) and len(after) == 2 and all(isinstance(x, str)
                                                                                         for x in after)):
        raise InvalidArgument("invalid cursor: not a cursor of list_peers")
    start = 0 if after is None else next((i for i, (k, _p) in enumerate(peers) if k > (after[0], after[1])),
                                         len(peers))
    page = peers[start:start + limit]
    more = start + limit < len(peers)
    return {"items": [p for _k, p in page], "nextCursor": encode_cursor({"after": list(page[-1][0])}) if more else None}


# -- messaging -----------------------------------------------------------------------------
