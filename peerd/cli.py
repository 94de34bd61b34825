"""The ``peerd`` command line.

Exit codes: 0 success; 1 the request failed (bad argument, unknown id, peer
refused); 2 usage error; 3 no daemon is running for this home (for commands
that need one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from peerd import home as homes
from peerd.config import Config, decode_fleet_key, encode_fleet_key, init_home, load_config, with_overrides
from peerd.errors import ConfigError, DaemonError
from peerd.invite import apply_invite, make_invite
from replica import PeerdError, open_home

EXIT_FAIL = 1
EXIT_NO_DAEMON = 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


def _home(args: argparse.Namespace) -> Path:
    return homes.resolve_home(args.home)


def _emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text(data))


# -- commands that work on the home directly ----------------------------------------------

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
    cfg_file = homes.config_path(_home(args))
    fleet = load_config(cfg_file).fleet_id if cfg_file.exists() else None
    asyncio.run(run_stdio(_home(args), role=args.role, instance=args.instance, fleet_id=fleet))
    return 0


# -- commands that talk to the running daemon (or the replica when offline) ----------------

def _daemon(args: argparse.Namespace) -> dict[str, Any] | None:
    return homes.read_daemon_json(_home(args))


def _api(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    info = _daemon(args)
    if info is None:
        raise CliError(f"no daemon is running for {_home(args)} (start one with: peerd run)", EXIT_NO_DAEMON)
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{info['local_url']}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=330) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = json.loads(exc.read() or b"{}").get("error", exc.reason)
        raise CliError(str(detail)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"daemon at {info['local_url']} did not answer ({exc}); is it still running?",
                       EXIT_NO_DAEMON) from None


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [list(map(str, header))] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _peer_rows(peers: list[dict[str, Any]]) -> str:
    rows = [(p["address"], (p["node_id"] or "")[:12], p["found_by"], "yes" if p["reachable"] else "no",
             p["last_seen_ago"], p["lag"]) for p in peers]
    return _table(rows, ["ADDRESS", "NODE", "FOUND BY", "LIVE", "SEEN (s ago)", "LAG"]) if rows else "no peers yet"


def cmd_status(args: argparse.Namespace) -> int:
    st = _api(args, "GET", "/api/status")

    def text(d: dict[str, Any]) -> str:
        t = d["totals"]
        head = (f"node   {d['node_id'][:16]}  ({d['name']})\nfleet  {d['fleet_id']}\n"
                f"peer   {d['peer_url']}\nlocal  {d['local_url']}  (MCP {d['mcp_url']})\n"
                f"totals {t['messages']} messages, {t['ops']} ops from {t['origins']} nodes; "
                f"{d['live_peers']} live peers, lag {d['lag']} ops\n")
        return head + _peer_rows(d["peers"])

    _emit(args, st, text)
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    _emit(args, _api(args, "GET", "/api/peers"), _peer_rows)
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    body = {"from": args.sender, "channel": args.to, "content": " ".join(args.text),
            "instanceId": args.instance, "fromInstanceId": args.from_instance}
    if _daemon(args) is None:  # offline: write the replica directly; a daemon pushes it later
        with open_home(_home(args)) as rep:
            sent = rep.send_message(body["from"], body["channel"], body["content"], args.instance,
                                    args.from_instance).to_dict()
    else:
        sent = _api(args, "POST", "/api/send", body)
    _emit(args, sent, lambda d: f"sent {d['id']} to {', '.join(d['recipients'])}")
    return 0


def cmd_inbox(args: argparse.Namespace) -> int:
    body = {"recipient": args.role, "recipientInstanceId": args.instance, "limit": args.limit, "wait": args.wait}
    if _daemon(args) is None:
        with open_home(_home(args)) as rep:
            inbox = rep.check_messages(args.role, args.instance, None, args.limit).to_dict()
    else:
        inbox = _api(args, "POST", "/api/check", body)

    def text(d: dict[str, Any]) -> str:
        if not d["messages"]:
            return "no unread messages"
        return "\n".join(f"[{m['created']}] {m['sender']} -> {m['channel']}: {m['content']}\n"
                         f"    receipt {m['receipt_id']}" for m in d["messages"])

    _emit(args, inbox, text)
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    if _daemon(args) is None:
        with open_home(_home(args)) as rep:
            result = {"marked": rep.mark_as_read(args.receipts)}
    else:
        result = _api(args, "POST", "/api/read", {"receiptIds": args.receipts})
    _emit(args, result, lambda d: f"marked {d['marked']} read")
    return 0


# -- parser ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", help="home folder (default: $PEERD_HOME or the user data folder)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p = argparse.ArgumentParser(prog="peerd", description="Peer-to-peer messaging for AI agents.")
    sub = p.add_subparsers(dest="command", required=True)

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
    s.add_argument("--local-port", type=int, help="local port for MCP and the API (0 picks a free one)")
    s.add_argument("--seed", action="append", metavar="HOST:PORT", help="a peer to contact (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not use mDNS discovery")
    s.add_argument("--bind", default="0.0.0.0", help="address the peer server listens on (default: all)")
    s.add_argument("--advertise", help="address to tell peers and write in daemon.json")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("mcp", parents=[common], help="serve MCP over stdio on this home's replica")
    s.add_argument("--role", help="bind this session to a role (used when a tool call omits it)")
    s.add_argument("--instance", help="bind this session to an instance id")
    s.set_defaults(fn=cmd_mcp)

    s = sub.add_parser("status", parents=[common], help="node, fleet, peers, lag and totals")
    s.set_defaults(fn=cmd_status)
    s = sub.add_parser("peers", parents=[common], help="known peers: how found, live or not, lag")
    s.set_defaults(fn=cmd_peers)

    s = sub.add_parser("send", parents=[common], help="send a message")
    s.add_argument("--from", dest="sender", required=True, help="sender role")
    s.add_argument("--to", required=True, help="a role, 'role1,role2' or 'broadcast'")
    s.add_argument("--instance", help="only this instance of the target role")
    s.add_argument("--from-instance", help="the sender's instance id")
    s.add_argument("text", nargs="+")
    s.set_defaults(fn=cmd_send)

    s = sub.add_parser("inbox", parents=[common], help="unread messages for a role (records delivery)")
    s.add_argument("role")
    s.add_argument("--instance")
    s.add_argument("--limit", type=int, default=50)
    s.add_argument("--wait", type=float, default=0, help="block up to this many seconds for a message")
    s.set_defaults(fn=cmd_inbox)

    s = sub.add_parser("read", parents=[common], help="mark receipts read")
    s.add_argument("receipts", nargs="+")
    s.set_defaults(fn=cmd_read)
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
        code = 130
    sys.exit(code)


__all__ = ["Config", "encode_fleet_key", "main"]
