"""How ``peerd`` prints results for people: pure functions from the JSON-ready
dicts the local API returns (and ``--json`` prints as they are) to text.

Invariants: no I/O and no state; the same dict gives the same text whether it
came from the daemon or from the replica file directly; a missing value shows
as ``-`` in tables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from peerd.cli.retention import status_lines
from peerd.cli.roles import node_text, pin_status_lines
from replica.models import receipt_state
from replica.stamps import iso_ms

BAR_WIDTH = 30


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 message``, ``0 messages``, ``1,234 ops``."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 90:
        return f"{seconds:.0f}s ago" if seconds >= 1 else "now"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_bar(catchup: dict[str, Any], width: int = BAR_WIDTH) -> str:
    """``catching up from PEER [#####-----] 45.2% 4,520/10,000 ops 1,234 ops/s ETA 4s``."""
    pct = max(0.0, min(100.0, float(catchup.get("percent") or 0.0)))
    filled = round(width * pct / 100)
    eta = "ETA ?" if catchup.get("eta") is None else f"ETA {duration(catchup['eta'])}"
    return (f"catching up from {catchup['peer']}  [{'#' * filled}{'-' * (width - filled)}] {pct:5.1f}%  "
            f"{catchup['done']:,}/{catchup['total']:,} ops  {catchup['rate']:,.0f} ops/s  {eta}")


def peer_error(p: dict[str, Any]) -> str:
    """A down peer's last error, without the address the table already shows."""
    err = str(p.get("last_error") or "")
    return "" if p["reachable"] else err.removeprefix(f"{p['address']}: ")


def format_peers(peers: list[dict[str, Any]], mdns: bool | None = None) -> str:
    if not peers:
        if mdns:
            return ("no peers yet (mDNS is on and has found no member of this fleet on this LAN; for one elsewhere "
                    "add a seed: peerd run --seed HOST:PORT, or seeds in config.toml)")
        return ("no peers yet (mDNS is off: turn it on with mdns = true in config.toml, or add a seed: "
                "peerd run --seed HOST:PORT)")
    rows = []
    for p in peers:
        live = "yes" if p["reachable"] else "no"
        error = peer_error(p)
        node = (p["node_id"] or "?")[:16]
        if p.get("name"):
            node = f"{p['name']} ({node})"
        wire = p.get("wire") or "?"
        if not wire.isdigit() and wire != "?":  # no version in common: say it where the errors go
            error, wire = wire, "none"
        if p.get("relay"):
            live = f"{live}, {p['relay']}"
        rows.append((p["address"], node, p["found_by"], live, ago(p["last_seen_ago"]),
                     ago(p["last_sync_ago"]), "?" if p["lag"] is None else p["lag"], wire,
                     error if len(error) <= 70 else error[:69] + "…"))
    return table(rows, ["PEER", "NODE", "FOUND BY", "LIVE", "SEEN", "SYNCED", "LAG", "WIRE", "ERROR"])


def format_status(d: dict[str, Any]) -> str:
    t = d["totals"]
    lines = [
        f"node    {d['name']}  {d['node_id'][:16]}  up {duration(d.get('uptime'))}",
        f"fleet   {d['fleet_id']}",
        f"peer    {d['peer_url']}",
        f"local   {d['local_url']}  (dashboard {d['local_url']}/dashboard, MCP {d['mcp_url']})",
        f"totals  {plural(t['messages'], 'message')}, {plural(t['receipts'], 'receipt')}, "
        f"{plural(t['ops'], 'op')} from {plural(t['origins'], 'node')}",
        *newer_lines(t),
        *pin_status_lines(t),
        f"peers   {d['live_peers']} of {len(d['peers'])} live; peers lack {d['lag']:,} of our ops",
    ]
    conf = d.get("settings")
    if isinstance(conf, dict):
        seeds = ", ".join(conf.get("seeds") or []) or "none"
        lines.append(f"finding mDNS {'on' if conf.get('mdns') else 'off'}; seeds: {seeds}")
    if d.get("catchup"):
        lines.append(progress_bar(d["catchup"]))
    lines += snapshot_lines(d.get("snapshot") or {}) + relay_lines(d.get("relay") or {})
    lines += fleet_lines(d) + status_lines(d)
    mdns = conf.get("mdns") if isinstance(conf, dict) else None
    return "\n".join(lines) + "\n\n" + format_peers(d["peers"], mdns)


def relay_lines(relay: dict[str, Any]) -> list[str]:
    """The return path (``peerd.relaylink``): whether this member can be called, who relays for it,
    for whom it relays."""
    if not relay or (relay.get("reachable") is not False and not relay.get("relaying_for")):
        return []  # nothing to say beyond the peer table: a member that can be called, relaying for none
    reach = {True: "other members can call this one", False: "other members cannot call this one",
             None: "not known yet whether other members can call this one"}[relay.get("reachable")]
    how = "" if relay.get("setting") == "auto" else " (reachable in config.toml)"
    lines = [f"reach   {reach}{how}"]

    def who(r: dict[str, Any]) -> str:
        return f"{r['name']} ({r['address']})" if r.get("name") else str(r["address"])

    if relay.get("via"):
        lines.append(f"relay   relayed by {', '.join(who(r) for r in relay['via'])}: they push to this member down "
                     "its links")
    elif relay.get("reachable") is False:
        lines.append("relay   no link to a reachable member yet: mail waits for this member's own rounds")
    if relay.get("relaying_for"):
        lines.append(f"relay   relaying for {', '.join(who(r) for r in relay['relaying_for'])}")
    return lines


def snapshot_lines(snap: dict[str, Any]) -> list[str]:
    """A snapshot being taken, its signatures still to check, forged ops found (peerd.snapshotting)."""
    lines = []
    if snap.get("taking"):
        lines.append(f"snapshot taking one from {snap['taking']['peer']} (signed by {snap['taking']['signer'][:16]})")
    elif snap.get("unchecked"):
        lines.append(f"snapshot {snap['unchecked']:,} ops taken in a snapshot still to have their signatures checked "
                     "(in the background)")
    for signer, n in (snap.get("forged") or {}).items():
        lines.append(f"FORGED  {n:,} ops that member {signer[:16]} vouched for in a snapshot did not verify: dropped "
                     f"and fetched again; see peerd doctor")
    return lines


def newer_lines(totals: dict[str, Any]) -> list[str]:
    """Ops held from a newer peerd, if any: what they are and what to do."""
    held = totals.get("newer_ops") or 0
    if not held:
        return []
    kinds = totals.get("newer_kinds") or {}
    what = f" ({', '.join(f'{k} x{n}' for k, n in sorted(kinds.items()))})" if kinds else ""
    return [f"newer   {plural(held, 'op')} from a newer peerd{what}: held and passed on, not applied here; "
            "upgrading this peerd applies them"]


def fleet_lines(d: dict[str, Any]) -> list[str]:
    """Membership news for people: removed, join requests waiting, other fleets on this LAN."""
    lines = []
    fleet = d.get("fleet") or {}
    if fleet.get("removed_here"):
        lines.append("REMOVED this node was removed from the fleet and no longer syncs; to take part again, "
                     "join with a fresh --home (peerd join --lan)")
    elif fleet.get("admitted_here") is False:
        lines.append(f"NOT IN  no member has let this node in yet, so the fleet refuses its messages; on a member: "
                     f"peerd admit {d.get('node_id', 'NODE_ID')} (or join with peerd join)")
    if fleet.get("conflicts"):
        lines.append(f"fleet   {len(fleet['conflicts'])} node(s) removed by removals that conflicted (each removed "
                     "the other): see docs/security.md, conflicting removals")
    if d.get("join_requests"):
        lines.append(f"joins   {d['join_requests']} request(s) waiting for approval: see peerd requests")
    for other in d.get("other_fleets") or []:
        nodes = ", ".join(f"{n.get('name') or n['node_id']} at {n['address']}" for n in other["nodes"])
        lines.append(f"LAN     another fleet {other['fleet_id']} is on this LAN ({nodes}); "
                     f"join it: {other['join']}")
    return lines


def _who(role: str, instance: str | None) -> str:
    return f"{role}@{instance}" if instance else role


def format_message(m: dict[str, Any]) -> str:
    """One line of the log: arrival position, time, sender -> target, text."""
    target = (f"thread {m['threadId']}" if m.get("threadId")
              else _who(m.get("channel") or "?", m.get("instanceId")))
    content = " ".join(str(m["content"]).splitlines()) or '""'
    return f"#{m['seq']:<6} {when(m['createdAt'])}  {_who(m['from'], m.get('fromInstanceId'))} -> {target}: {content}"


def format_log(d: dict[str, Any]) -> str:
    return "\n".join(map(format_message, d["messages"])) or "no messages yet"


def format_inbox(d: dict[str, Any], *, all_: bool = False) -> str:
    if not d["messages"]:
        return "no messages" if all_ else "no unread messages"
    return "\n".join(format_inbox_message(m) for m in d["messages"])


def when(ms: int | None) -> str:
    """A time of the one vocabulary (Unix ms) as people read it (ISO-8601 UTC)."""
    return "-" if ms is None else iso_ms(ms)


def format_inbox_message(m: dict[str, Any]) -> str:
    state = receipt_state(m.get("deliveredAt"), m.get("readAt"))
    return (f"[{when(m['createdAt'])}] {_who(m['from'], m.get('fromInstanceId'))} -> {m['channel']}: "
            f"{m['content']}\n    receipt {m['receiptId']}  ({state})  from node {node_text(m.get('fromNode'))}")


def format_search(d: dict[str, Any]) -> str:
    if not d["hits"]:
        return f"no messages match {d['query']!r}"
    return "\n".join(f"{format_message(h)}\n    id {h['messageId']}" for h in d["hits"])


def format_threads(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no threads"
    return table([(r["thread_id"], ", ".join(r["participants"]), r["message_count"], r["latest_activity"])
                  for r in rows], ["THREAD", "PARTICIPANTS", "MESSAGES", "LATEST"])


def _clip(text: str | None, n: int = 40) -> str | None:
    if text is None:
        return None
    flat = " ".join(text.splitlines())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _object_text(obj: dict[str, Any]) -> str | None:
    """A profile's static or dynamic object in one line: a lone text value alone, or key=value pairs."""
    obj = {k: v for k, v in obj.items() if v not in ("", [], {}, None)}  # VantagePeers' empty defaults
    if not obj:
        return None
    if len(obj) == 1 and isinstance(value := next(iter(obj.values())), str):
        return value
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in obj.items())


def _profile_id(p: dict[str, Any]) -> str:
    return f"{p['orchestratorId']}/{p['instanceId']}" if p.get("instanceId") else str(p["orchestratorId"])


def _dynamic(p: dict[str, Any]) -> dict[str, Any]:
    """A profile's dynamic object without the defaults the one view fills in (VantagePeers'
    ``lastSeen``: the last update, ``sessionCount``: 0), which people need not read."""
    return {k: v for k, v in p["dynamic"].items()
            if not (k == "lastSeen" and v == p.get("updatedAt")) and not (k == "sessionCount" and v == 0)}


def format_profiles(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no profiles"
    return table([(_profile_id(p), p["name"], _clip(_object_text(p["static"])), _clip(_object_text(_dynamic(p))),
                   when(p["updatedAt"])) for p in rows], ["ID", "NAME", "STATIC", "DYNAMIC", "UPDATED"])


def format_profile(p: dict[str, Any]) -> str:
    rows = [("id", _profile_id(p)), ("name", p["name"]), ("static", _object_text(p["static"])),
            ("dynamic", _object_text(_dynamic(p))), ("updated", when(p["updatedAt"]))]
    return "\n".join(f"{k:<8} {'-' if v is None else v}" for k, v in rows)


def format_message_status(d: dict[str, Any]) -> str:
    """Who a message reached: one row per recipient (role, instance) with its state."""
    rows = d["recipients"]
    if not rows:
        return (f"message {d['messageId']}: no recipients known yet "
                "(a broadcast reaches each role with a profile as it appears)")
    read = sum(1 for r in rows if r["state"] == "read")
    delivered = sum(1 for r in rows if r["state"] == "delivered")
    head = (f"message {d['messageId']}: {read} of {plural(len(rows), 'recipient')} read, {delivered} delivered"
            f" and not read, {len(rows) - read - delivered} pending")
    return head + "\n" + table([(r["role"], r["instanceId"], r["state"], when(r["deliveredAt"]) if r["deliveredAt"]
                                 else None, when(r["readAt"]) if r["readAt"] else None,
                                 when(r["acknowledgedAt"]) if r.get("acknowledgedAt") else None) for r in rows],
                               ["ROLE", "INSTANCE", "STATE", "DELIVERED", "READ", "ACKNOWLEDGED"])


def login_minutes() -> int:
    from mcp_server.localauth import LOGIN_TTL  # noqa: PLC0415 - only the daemon's ready lines need it

    return int(LOGIN_TTL // 60)


def format_login(d: dict[str, Any]) -> str:
    """``peerd dashboard``: the one-time link, and what it does."""
    return (f"{d['url']}\nopen it in a browser within {max(1, int(d['expires_in']) // 60)} minutes: it works once, "
            "and signs that browser in to this daemon's dashboard")


def format_orientation(info: dict[str, Any], *, flag: str, new_fleet: bool) -> str:
    """What ``peerd run`` says once ready: where things are, how to stop it, how to invite."""
    lines = [
        "peerd is running",
        f"  home       {info['home']}",
        f"  node       {info['name']}  ({str(info['node_id'])[:16]})",
        f"  fleet      {info['fleet_id']}" + ("  (a new fleet, made just now)" if new_fleet else ""),
        f"  peer       {str(info['peer_url']).removeprefix('http://')}  (other machines reach this node here)",
        f"  dashboard  {info['local_url']}/dashboard",
        *([f"  login      {info['login_url']}  (opens the dashboard in a browser: once, within "
           f"{login_minutes()} minutes; a new link: peerd dashboard{flag})"] if info.get("login_url") else []),
        f"  MCP        {info['mcp_url']}",
        f"  stop       Ctrl-C here, or from another terminal: peerd stop{flag}",
    ]
    if new_fleet:
        lines.append(f"  invite     to add a machine on this LAN, run there: peerd join --lan  then here: "
                     f"peerd approve CODE{flag}  (or here: peerd invite{flag}  then there: peerd join TOKEN)")
    return "\n".join(lines)
