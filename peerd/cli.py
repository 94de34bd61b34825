"""The ``peerd`` command line.

Commands: ``init``, ``invite``, ``join``, ``run``, ``mcp`` set up and serve a
node; ``status``, ``peers`` ask the running daemon; ``send``, ``inbox``,
``read``, ``log``, ``search``, ``threads``, ``profile`` work through the
running daemon, or straight on the replica file when none runs; ``doctor``
checks the home, config, key, ports, mDNS, seeds, peers and clocks and says
what to fix. Every command takes ``--home DIR`` (default: ``$PEERD_HOME``,
else the user data folder) and ``--json`` (machine-readable output; with
``--watch`` / ``--follow``, one JSON object per line).

Exit codes:
  0    success (also when ``--watch`` / ``--follow`` is stopped with Ctrl-C)
  1    the request failed: bad argument, unknown id, the daemon refused it
  2    usage error: unknown command or flag, missing or malformed argument
  3    no daemon is running for this home (``status``, ``peers``), or it stopped answering
  4    no peerd home there (run ``peerd init``) for a command that works on the replica
  5    ``peerd doctor`` found at least one problem
  130  interrupted (Ctrl-C) anywhere else
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from peerd import home as homes
from peerd.config import Config, decode_fleet_key, encode_fleet_key, init_home, load_config, with_overrides
from peerd.errors import ConfigError, DaemonError
from peerd.invite import apply_invite, make_invite
from replica import PeerdError, Replica, open_home

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
EXIT_NO_HOME = 4
EXIT_UNHEALTHY = 5
EXIT_INTERRUPTED = 130

HTTP_TIMEOUT = 30.0
FOLLOW_WAIT = 25.0  # seconds one long-poll of --follow waits for news
OFFLINE_POLL = 0.5  # seconds between looks at the replica when following with no daemon
BAR_WIDTH = 30

# The local API is on this machine's loopback: never send it through a proxy named in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def _home(args: argparse.Namespace) -> Path:
    return homes.resolve_home(args.home)


def _emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text(data), flush=True)


def _emit_line(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    """One record of a stream (--follow): a JSON line, or its text form."""
    print(json.dumps(data, default=str) if args.json else text(data), flush=True)


# -- pure formatting ----------------------------------------------------------------------------


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


def format_peers(peers: list[dict[str, Any]]) -> str:
    if not peers:
        return "no peers yet (add a seed with --seed HOST:PORT, or turn mDNS on)"
    rows = []
    for p in peers:
        live = "yes" if p["reachable"] else "no"
        error = peer_error(p)
        node = (p["node_id"] or "?")[:16]
        if p.get("name"):
            node = f"{p['name']} ({node})"
        rows.append((p["address"], node, p["found_by"], live, ago(p["last_seen_ago"]),
                     ago(p["last_sync_ago"]), "?" if p["lag"] is None else p["lag"],
                     error if len(error) <= 70 else error[:69] + "…"))
    return table(rows, ["PEER", "NODE", "FOUND BY", "LIVE", "SEEN", "SYNCED", "LAG", "ERROR"])


def format_status(d: dict[str, Any]) -> str:
    t = d["totals"]
    lines = [
        f"node    {d['name']}  {d['node_id'][:16]}  up {duration(d.get('uptime'))}",
        f"fleet   {d['fleet_id']}",
        f"peer    {d['peer_url']}",
        f"local   {d['local_url']}  (dashboard {d['local_url']}/dashboard, MCP {d['mcp_url']})",
        f"totals  {t['messages']:,} messages, {t['receipts']:,} receipts, {t['ops']:,} ops from "
        f"{t['origins']} nodes",
        f"peers   {d['live_peers']} of {len(d['peers'])} live; peers lack {d['lag']:,} of our ops",
    ]
    conf = d.get("settings")
    if isinstance(conf, dict):
        seeds = ", ".join(conf.get("seeds") or []) or "none"
        lines.append(f"finding mDNS {'on' if conf.get('mdns') else 'off'}; seeds: {seeds}")
    if d.get("catchup"):
        lines.append(progress_bar(d["catchup"]))
    return "\n".join(lines) + "\n\n" + format_peers(d["peers"])


def _who(role: str, instance: str | None) -> str:
    return f"{role}@{instance}" if instance else role


def format_message(m: dict[str, Any]) -> str:
    """One line of the log: arrival position, time, sender -> target, text."""
    target = (f"thread {m['thread']}" if m.get("thread")
              else _who(m.get("channel") or "?", m.get("target_instance")))
    content = " ".join(str(m["content"]).splitlines()) or '""'
    return f"#{m['seq']:<6} {m['created']}  {_who(m['sender'], m.get('sender_instance'))} -> {target}: {content}"


def format_inbox(d: dict[str, Any], *, all_: bool = False) -> str:
    if not d["messages"]:
        return "no messages" if all_ else "no unread messages"
    return "\n".join(format_inbox_message(m) for m in d["messages"])


def format_inbox_message(m: dict[str, Any]) -> str:
    state = "read" if m.get("read_at") else "delivered" if m.get("delivered_at") else "pending"
    return (f"[{m['created']}] {_who(m['sender'], m.get('sender_instance'))} -> {m['channel']}: {m['content']}\n"
            f"    receipt {m['receipt_id']}  ({state})")


def format_search(d: dict[str, Any]) -> str:
    if not d["hits"]:
        return f"no messages match {d['query']!r}"
    return "\n".join(f"{format_message(h)}\n    id {h['id']}" for h in d["hits"])


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


def format_profiles(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no profiles"
    return table([(p["orchestrator_id"], p["name"], _clip(p["static"]), _clip(p["dynamic"]), p["updated"])
                  for p in rows], ["ID", "NAME", "STATIC", "DYNAMIC", "UPDATED"])


def format_profile(p: dict[str, Any]) -> str:
    rows = [("id", p["orchestrator_id"])] + [(k, p[k]) for k in ("name", "static", "dynamic", "updated")]
    return "\n".join(f"{k:<8} {'-' if v is None else v}" for k, v in rows)


def parse_settings(items: Sequence[str]) -> dict[str, str]:
    """``name=... static=... dynamic=...`` into a dict; a bad item is a usage error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ("name", "static", "dynamic"):
            raise CliError(f"--set takes name=..., static=... or dynamic=..., not {item!r}", EXIT_USAGE)
        out[key] = value
    return out


# -- where requests go: the running daemon, or the replica file ----------------------------------


class Backend(Protocol):
    """What the messaging commands need; served by the daemon or by the replica directly."""

    live: bool  # a daemon answers (waits block there) rather than the replica file itself

    def send(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def inbox(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def read(self, receipts: list[str]) -> dict[str, Any]: ...
    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]: ...
    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]: ...
    def threads(self) -> list[dict[str, Any]]: ...
    def profiles(self) -> list[dict[str, Any]]: ...
    def profile(self, oid: str) -> dict[str, Any] | None: ...
    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]: ...
    def close(self) -> None: ...


class DaemonBackend:
    """The running daemon's local API."""

    def __init__(self, url: str) -> None:
        self.live = True
        self.url = url

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, Any] | None = None, timeout: float = HTTP_TIMEOUT) -> Any:
        qs = {k: v for k, v in (query or {}).items() if v is not None}
        full = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(qs)}" if qs else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(full, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
            try:
                detail = json.loads(raw or b"{}").get("error", exc.reason)
            except (ValueError, AttributeError):
                detail = exc.reason
            raise CliError(str(detail)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise CliError(f"the daemon at {self.url} did not answer ({exc}); is it still running?",
                           EXIT_NO_DAEMON) from None

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/send", body))

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/check", body, timeout=HTTP_TIMEOUT + float(body.get("wait") or 0)))

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/read", {"receiptIds": receipts}))

    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]:
        return dict(self.call("GET", "/api/messages", query={"after": after, "limit": limit, "wait": wait or None},
                              timeout=HTTP_TIMEOUT + wait))

    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]:
        return dict(self.call("GET", "/api/search", query={"q": query, "from": from_, "channel": channel,
                                                            "since": since, "limit": limit}))

    def threads(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/api/threads"))

    def profiles(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/api/profiles"))

    def profile(self, oid: str) -> dict[str, Any] | None:
        out = self.call("GET", f"/api/profiles/{urllib.parse.quote(oid, safe='')}")
        return None if out is None else dict(out)

    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]:
        return dict(self.call("POST", "/api/profiles", {"orchestratorId": oid, **fields}))

    def close(self) -> None:
        pass


class OfflineBackend:
    """The replica file itself, when no daemon runs (a daemon started later pushes what we wrote)."""

    def __init__(self, home: Path) -> None:
        self.live = False
        self.rep: Replica = open_home(home)

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.rep.send_message(body["from"], body["channel"], body["content"], body.get("instanceId"),
                                     body.get("fromInstanceId")).to_dict()

    def inbox(self, body: dict[str, Any]) -> dict[str, Any]:
        from peerd.dashboard import views  # noqa: PLC0415 - only the offline path needs it here

        return views.inbox(self.rep, body["recipient"], body.get("recipientInstanceId"),
                           include_read=bool(body.get("all")), since=body.get("since"), limit=body.get("limit", 50))

    def read(self, receipts: list[str]) -> dict[str, Any]:
        return {"marked": self.rep.mark_as_read(receipts)}

    def log(self, after: int | None, limit: int, wait: float) -> dict[str, Any]:
        from peerd.dashboard import views  # noqa: PLC0415

        return views.message_log(self.rep, after=after, limit=limit)

    def search(self, query: str, from_: str | None, channel: str | None, since: int | None,
               limit: int) -> dict[str, Any]:
        from peerd.dashboard import views  # noqa: PLC0415

        return views.search(self.rep, query, from_=from_, channel=channel, since=since, limit=limit)

    def threads(self) -> list[dict[str, Any]]:
        from peerd.dashboard import views  # noqa: PLC0415

        return views.threads(self.rep)

    def profiles(self) -> list[dict[str, Any]]:
        return [p.to_dict() for p in self.rep.list_profiles()]

    def profile(self, oid: str) -> dict[str, Any] | None:
        p = self.rep.get_profile(oid)
        return None if p is None else p.to_dict()

    def update_profile(self, oid: str, fields: dict[str, str]) -> dict[str, Any]:
        return self.rep.update_profile(oid, fields.get("name"), fields.get("static"), fields.get("dynamic")).to_dict()

    def close(self) -> None:
        self.rep.close()


def running_daemon(home: Path) -> dict[str, Any] | None:
    """daemon.json of this home if its process is alive (a file left by a crash does not count)."""
    info = homes.read_daemon_json(home)
    if info is None or not homes.pid_alive(info.get("pid")) or not isinstance(info.get("local_url"), str):
        return None
    return info


def _daemon(args: argparse.Namespace) -> DaemonBackend:
    info = running_daemon(_home(args))
    if info is None:
        raise CliError(f"no daemon is running for {_home(args)} (start one with: peerd run)", EXIT_NO_DAEMON)
    return DaemonBackend(str(info["local_url"]))


def _initialised(home: Path) -> bool:
    return homes.replica_path(home).exists() or homes.config_path(home).exists()


@contextlib.contextmanager
def backend(args: argparse.Namespace) -> Iterator[Backend]:
    """The daemon if one runs for this home, else the replica file (which must exist)."""
    home = _home(args)
    info = running_daemon(home)
    if info is not None:
        yield DaemonBackend(str(info["local_url"]))
        return
    if not _initialised(home):
        raise CliError(f"no peerd home at {home} (create one with: peerd init --home {home})", EXIT_NO_HOME)
    off = OfflineBackend(home)
    try:
        yield off
    finally:
        off.close()


# -- commands that work on the home directly ----------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    key = decode_fleet_key(args.fleet_key) if args.fleet_key else None
    cfg = init_home(_home(args), name=args.name, fleet_key=key)
    with open_home(_home(args)) as rep:
        node = rep.node_id
    data = {"home": str(_home(args)), "node_id": node, "name": cfg.name, "fleet_id": cfg.fleet_id}
    _emit(args, data, lambda d: f"initialised {d['home']}\n  node  {d['node_id']}\n  fleet {d['fleet_id']}")
    return 0


def _lan_address() -> str:
    import socket  # noqa: PLC0415 - only this command needs it

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET address: no packet is sent by connect()
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def cmd_invite(args: argparse.Namespace) -> int:
    cfg = init_home(_home(args))
    running = homes.read_daemon_json(_home(args))
    port = int(running["peer_port"]) if running and "peer_port" in running else cfg.port  # type: ignore[call-overload]
    seed = f"{args.host or _lan_address()}:{port}"
    token = make_invite(cfg.fleet_key, seed)
    _emit(args, {"invite": token, "seed": seed, "fleet_id": cfg.fleet_id},
          lambda d: f"{d['invite']}\n\nOn the other machine run:\n  peerd join {d['invite']}")
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    cfg = apply_invite(_home(args), args.token, force=args.force)
    _emit(args, {"fleet_id": cfg.fleet_id, "seeds": list(cfg.seeds)},
          lambda d: f"joined fleet {d['fleet_id']}; seeds: {', '.join(d['seeds'])}\nstart with: peerd run")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from peerd.daemon import run  # noqa: PLC0415 - keeps quick commands quick to start

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    home = _home(args)
    cfg = with_overrides(init_home(home), port=args.port, local_port=args.local_port,
                         seeds=args.seed or (), mdns=False if args.no_mdns else None)
    asyncio.run(run(home, cfg, bind=args.bind, advertise=args.advertise or _advertise(args.bind)))
    return 0


def _advertise(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from mcp_server.stdio import run_stdio  # noqa: PLC0415 - heavy import, only for this command
    except ImportError as exc:
        raise CliError(f"the MCP server is not available: {exc}") from None
    from peerd.feedlink import DaemonLink  # noqa: PLC0415

    cfg_file = homes.config_path(_home(args))
    fleet = load_config(cfg_file).fleet_id if cfg_file.exists() else None
    asyncio.run(run_stdio(_home(args), role=args.role, instance=args.instance, fleet_id=fleet,
                          source=DaemonLink(_home(args))))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from peerd import doctor  # noqa: PLC0415 - only this command needs it

    report = doctor.run_checks(_home(args), timeout=args.timeout)
    _emit(args, report.to_dict(), lambda _d: doctor.format_report(report))
    return EXIT_UNHEALTHY if report.failed else EXIT_OK


# -- commands that need the running daemon --------------------------------------------------------


def _clear_screen() -> None:
    if sys.stdout.isatty():
        sys.stdout.write("\x1b[H\x1b[2J")


def cmd_status(args: argparse.Namespace) -> int:
    daemon = _daemon(args)
    if not args.watch:
        _emit(args, daemon.call("GET", "/api/status"), format_status)
        return 0
    shown = 0
    try:
        while True:
            st = daemon.call("GET", "/api/status")
            if args.json:
                _emit_line(args, st, format_status)
            else:
                _clear_screen()
                stamp = time.strftime("%H:%M:%S")
                print(f"{format_status(st)}\n\n[{stamp}] refreshing every {args.interval:g}s; Ctrl-C to stop",
                      flush=True)
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def cmd_peers(args: argparse.Namespace) -> int:
    _emit(args, _daemon(args).call("GET", "/api/peers"), format_peers)
    return 0


# -- commands that work through the daemon or on the replica --------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == ["-"] else " ".join(args.text)
    body = {"from": args.sender, "channel": args.to, "content": text,
            "instanceId": args.instance, "fromInstanceId": args.from_instance}
    with backend(args) as b:
        sent = b.send(body)
    _emit(args, sent, lambda d: f"sent {d['id']} to {', '.join(d['recipients'])}")
    return 0


def cmd_inbox(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"recipient": args.role, "recipientInstanceId": args.instance, "limit": args.limit,
                            "wait": args.wait, "all": args.all}
    with backend(args) as b:
        if not b.live:
            body.pop("wait")
        inbox = b.inbox(body)
        if not args.follow:
            _emit(args, inbox, lambda d: format_inbox(d, all_=args.all))
            return 0
        return _follow_inbox(args, b, body, inbox)


def _follow_inbox(args: argparse.Namespace, b: Backend, body: dict[str, Any],
                  first: dict[str, Any]) -> int:
    """Print messages as they arrive (delivery is recorded; nothing is marked read)."""
    batch = first
    body = {**body, "all": False}
    try:
        while True:
            for m in batch["messages"]:
                _emit_line(args, m, format_inbox_message)
            body["since"] = batch["cursor"]
            if b.live:
                body["wait"] = FOLLOW_WAIT
            else:
                time.sleep(OFFLINE_POLL)
            batch = b.inbox(body)
    except KeyboardInterrupt:
        return 0


def cmd_read(args: argparse.Namespace) -> int:
    with backend(args) as b:
        result = b.read(args.receipts)
    _emit(args, result, lambda d: f"marked {d['marked']} read")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    with backend(args) as b:
        out = b.log(None, args.limit, 0)
        if not args.follow:
            _emit(args, out, lambda d: "\n".join(map(format_message, d["messages"])) or "no messages yet")
            return 0
        try:
            while True:
                for m in out["messages"]:
                    _emit_line(args, m, format_message)
                if not b.live:
                    time.sleep(OFFLINE_POLL)
                out = b.log(out["cursor"], 500, FOLLOW_WAIT if b.live else 0)
        except KeyboardInterrupt:
            return 0


def cmd_search(args: argparse.Namespace) -> int:
    with backend(args) as b:
        out = b.search(" ".join(args.query), args.sender, args.channel, args.since, args.limit)
    _emit(args, out, format_search)
    return 0


def cmd_threads(args: argparse.Namespace) -> int:
    with backend(args) as b:
        rows = b.threads()
    _emit(args, rows, format_threads)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    fields = parse_settings(args.set or [])
    if args.set is not None and args.id is None:
        raise CliError("--set needs the profile's ID: peerd profile ID --set name=...", EXIT_USAGE)
    with backend(args) as b:
        if args.id is None:
            _emit(args, b.profiles(), format_profiles)
            return 0
        if fields:
            _emit(args, b.update_profile(args.id, fields), format_profile)
            return 0
        found = b.profile(args.id)
    if found is None:
        raise CliError(f"no profile for {args.id!r} (set one with: peerd profile {args.id} --set name=...)")
    _emit(args, found, format_profile)
    return 0


# -- parser -----------------------------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _setup_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("init", parents=[common], help="create the home: replica, node key, config.toml")
    s.add_argument("--name", help="a name for this node (default: the host name)")
    s.add_argument("--fleet-key", help="join an existing fleet with this key instead of making a new one")
    s.set_defaults(fn=cmd_init)

    s = sub.add_parser("invite", parents=[common], help="print a token another machine uses to join this fleet")
    s.add_argument("--host", help="address other machines reach this one at (default: this machine's LAN address)")
    s.set_defaults(fn=cmd_invite)

    s = sub.add_parser("join", parents=[common], help="join the fleet of an invite token")
    s.add_argument("token")
    s.add_argument("--force", action="store_true", help="replace this home's fleet key with the invite's")
    s.set_defaults(fn=cmd_join)

    s = sub.add_parser("run", parents=[common], help="run the daemon (initialises the home if needed)")
    s.add_argument("--port", type=int, help="peer port (0 picks a free one)")
    s.add_argument("--local-port", type=int, help="local port for MCP, the API and the dashboard (0 picks a free one)")
    s.add_argument("--seed", action="append", metavar="HOST:PORT", help="a peer to contact (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not use mDNS discovery")
    s.add_argument("--bind", default="0.0.0.0", help="address the peer server listens on (default: all)")
    s.add_argument("--advertise",
                   help="this node's address as written in daemon.json (default: the bind address, or 127.0.0.1)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("mcp", parents=[common], help="serve MCP over stdio on this home's replica")
    s.add_argument("--role", help="bind this session to a role (used when a tool call omits it)")
    s.add_argument("--instance", help="bind this session to an instance id")
    s.set_defaults(fn=cmd_mcp)


def _operator_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("status", parents=[common], help="node, fleet, peers, per-peer lag, totals, catch-up")
    s.add_argument("--watch", action="store_true", help="refresh until Ctrl-C (a progress bar during a catch-up)")
    s.add_argument("--interval", type=_positive, default=1.0, help="seconds between refreshes (default 1)")
    s.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("peers", parents=[common], help="known peers: how found, live or not, lag, last error")
    s.set_defaults(fn=cmd_peers)

    s = sub.add_parser("log", parents=[common], help="recent traffic: the latest messages in arrival order")
    s.add_argument("--limit", type=int, default=20, help="how many of the latest messages (default 20)")
    s.add_argument("--follow", action="store_true", help="keep printing messages as they arrive")
    s.set_defaults(fn=cmd_log)

    s = sub.add_parser("search", parents=[common], help="full-text search over every message held here")
    s.add_argument("query", nargs="+", metavar="QUERY", help="words that must all match")
    s.add_argument("--from", dest="sender", metavar="ROLE", help="only messages from this role")
    s.add_argument("--channel", metavar="ROLE", help="only messages addressed to this role")
    s.add_argument("--since", type=int, metavar="N", help="only messages after arrival position N")
    s.add_argument("--limit", type=int, default=20, help="most hits (default 20)")
    s.set_defaults(fn=cmd_search)

    s = sub.add_parser("threads", parents=[common], help="threads: participants, message count, latest activity")
    s.set_defaults(fn=cmd_threads)

    s = sub.add_parser("profile", parents=[common], help="list profiles, show one, or set its fields")
    s.add_argument("id", nargs="?", metavar="ID", help="the role (orchestrator id) whose profile to show or set")
    s.add_argument("--set", nargs="+", action="extend", metavar="FIELD=VALUE",
                   help="set name=..., static=... and/or dynamic=...")
    s.set_defaults(fn=cmd_profile)

    s = sub.add_parser("doctor", parents=[common], help="check this node's setup and say what to fix")
    s.add_argument("--timeout", type=_positive, default=3.0, help="seconds to wait for each peer (default 3)")
    s.set_defaults(fn=cmd_doctor)


def _messaging_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("send", parents=[common], help="send a message ('-' as TEXT reads it from stdin)")
    s.add_argument("--from", dest="sender", required=True, metavar="ROLE", help="sender role")
    s.add_argument("--to", required=True, metavar="CHANNEL", help="a role, 'role1,role2' or 'broadcast'")
    s.add_argument("--instance", metavar="ID", help="only this instance of the target role")
    s.add_argument("--from-instance", metavar="ID", help="the sender's instance id")
    s.add_argument("text", nargs="+", metavar="TEXT")
    s.set_defaults(fn=cmd_send)

    s = sub.add_parser("inbox", parents=[common], help="unread messages for a role (records delivery)")
    s.add_argument("role", metavar="ROLE")
    s.add_argument("--instance", metavar="ID", help="this instance of the role")
    s.add_argument("--all", action="store_true", help="include messages already read")
    s.add_argument("--follow", action="store_true", help="keep printing new messages as they arrive")
    s.add_argument("--limit", type=int, default=50, help="most messages to show (default 50)")
    s.add_argument("--wait", type=float, default=0, help="block up to this many seconds for a message")
    s.set_defaults(fn=cmd_inbox)

    s = sub.add_parser("read", parents=[common], help="mark messages read by receipt id")
    s.add_argument("receipts", nargs="+", metavar="RECEIPT")
    s.set_defaults(fn=cmd_read)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", help="home folder (default: $PEERD_HOME or the user data folder)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p = argparse.ArgumentParser(prog="peerd", description="Peer-to-peer messaging for AI agents.",
                                epilog="exit codes: 0 ok, 1 request failed, 2 usage, 3 no daemon running, "
                                       "4 no home, 5 doctor found problems, 130 interrupted")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _setup_commands(sub, common)
    _messaging_commands(sub, common)
    _operator_commands(sub, common)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
    except CliError as exc:
        print(f"peerd: {exc}", file=sys.stderr)
        code = exc.code
    except (ConfigError, DaemonError, PeerdError) as exc:
        print(f"peerd: {exc}", file=sys.stderr)
        code = EXIT_FAIL
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `peerd log --follow | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's exit flush quiet
        code = EXIT_OK
    sys.exit(code)


__all__ = ["Config", "encode_fleet_key", "main"]
