"""The commands that bring machines into a fleet and take them out: ``invite``, ``join``,
``requests``, ``approve``, ``reject``, ``admit``, ``remove`` and ``rotate``.

Invariants:
* ``join`` writes nothing to the home until a member's answer checked out: a fresh machine's node
  key is made in memory and saved only then, so a failed join leaves no half-made home behind.
* A running daemon of the joining home takes the new fleet at once (``/api/fleet/reload``); no
  restart by hand.
* ``requests``, ``approve``, ``reject``, ``remove``, ``rotate`` and ``invite --code`` act through the
  running daemon (exit code 3 without one): the requests and codes live in its memory, and a new
  fleet key must reach the daemon that seals with it.
* ``admit`` writes on the replica file itself (one signed ``admit`` op), with or without a daemon,
  as ``peerd retention`` does: it lets in a machine that was given the fleet key by other means.
* Durations are ``N`` seconds or ``Ns``, ``Nm``, ``Nh``, ``Nd``; anything else is a usage error.
* ``join``'s flow (aiohttp, the PAKE) lives in ``peerd.cli.joining``, imported when it runs, so no
  other command pays for loading it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from discovery.seeds import format_seed
from peerd import home as homes
from peerd.cli.backends import DaemonBackend, daemon, running_daemon
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.format import table
from peerd.cli.replicafile import open_replica
from peerd.cli.setup import home_flag, open_fleet
from peerd.config import load_config
from peerd.invite import DEFAULT_TTL, MAX_TTL, issue
from peerd.netaddr import lan_address
from peerd.pairing import codes

SCAN_WINDOW = 5.0  # seconds to look for fleets on the LAN
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``1h``, ``2d``; ArgumentTypeError otherwise."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:])
    number = raw[:-1] if unit else raw
    try:
        value = float(number) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 90s, 10m, 1h or 2d)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("a duration must be more than 0")
    return value


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text, flush=True)


# -- invite ---------------------------------------------------------------------------------------


def cmd_invite(args: argparse.Namespace) -> int:
    home = homes.resolve_home(args.home)
    if args.code:
        return _invite_code(args, home)
    cfg, _new = open_fleet(home, flag=home_flag(args.home), create=True)
    running = running_daemon(home) or {}
    port = int(running.get("peer_port", cfg.port))
    fleet = str(running.get("fleet_id", cfg.fleet_id))
    host = args.host.removeprefix("[").removesuffix("]") if args.host else lan_address()  # [v6] or v6
    token, inv = issue(home, [format_seed(host, port)], fleet, args.expires)
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(inv.expires))
    note = "" if running else f"\n(start this machine's daemon before then: peerd run{home_flag(args.home)})"
    emit(args, {"invite": token, "seeds": list(inv.seeds), "fleet_id": fleet, "expires": inv.expires},
          f"{token}\n\nOn the other machine run:\n  peerd join {token}\n\nIt works once, until {until}, while "
          f"this machine's daemon runs; it holds no key.{note}")
    return 0


def _invite_code(args: argparse.Namespace, home: Path) -> int:
    ttl = min(args.expires if args.expires_given else 600.0, 24 * 3600.0)
    out = daemon(home, home_flag(args.home)).call("POST", "/api/pair/code", {"expires": ttl})
    elsewhere = (f"\n(or, from another network: peerd join --code {out['code']} --seed {out['addresses'][0]})"
                 if out.get("addresses") else "")
    emit(args, out, f"one-time code: {out['code']}\n\nOn the other machine (same LAN) run:\n  peerd join --code "
                     f"{out['code']}{elsewhere}\n\nIt works once, for {ttl / 60:g} minutes, with {out['attempts']} "
                     "tries.")
    return 0


# -- join ---------------------------------------------------------------------------------------


def cmd_join(args: argparse.Namespace) -> int:
    from peerd.cli.joining import cmd_join as join  # noqa: PLC0415 - aiohttp and the PAKE, for this command only

    return join(args)


# -- a member's side ------------------------------------------------------------------------------


def _daemon(args: argparse.Namespace) -> DaemonBackend:
    """The home's running daemon; with none, the error repeats the --home given."""
    return daemon(homes.resolve_home(args.home), home_flag(args.home))


def cmd_requests(args: argparse.Namespace) -> int:
    rows = _daemon(args).call("GET", "/api/pair/requests")
    if not rows:
        text = "no join requests waiting (on the new machine run: peerd join --lan)"
    else:
        text = table([(codes.show_verification(r["code"]), r["name"], r["node_id"][:16], r["from"],
                       f"{int(r['expires_in'] // 60)} min") for r in rows],
                     ["CODE", "NAME", "NODE", "FROM", "EXPIRES IN"])
        text += "\n\napprove one with: peerd approve CODE   (or refuse it: peerd reject CODE)"
    emit(args, rows, text)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    out = _daemon(args).call("POST", "/api/pair/approve", {"code": args.code})
    emit(args, out, f"approved {out['approved']} (node {out['node_id'][:16]}): it joins fleet {out['fleet_id']}")
    return 0


def cmd_reject(args: argparse.Namespace) -> int:
    out = _daemon(args).call("POST", "/api/pair/reject", {"code": args.code})
    emit(args, out, f"rejected {out['rejected']} (node {out['node_id'][:16]})")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    out = _daemon(args).call("POST", "/api/fleet/remove", {"node": args.node})
    who = f"{out['name']} ({out['removed'][:16]})" if out.get("name") else out["removed"][:16]
    emit(args, out, f"removed {who}: its ops after #{out['upto']} are refused everywhere. The fleet key was "
                     f"rotated to fleet {out['fleet_id']} (epoch {out['epoch']}), sealed to {out['members']} "
                     "member(s); members that are offline catch up when they come back.")
    return 0


def cmd_admit(args: argparse.Namespace) -> int:
    try:
        node = bytes.fromhex(args.node)
    except ValueError:
        node = b""
    if len(node) != 32:
        raise CliError(f"{args.node!r} is not a node id: give all 64 hex digits (`peerd status` on that machine "
                       "prints them)", EXIT_USAGE)
    with open_replica(args) as rep:
        cfg = load_config(homes.config_path(homes.resolve_home(args.home)))
        name = args.name or f"node-{args.node[:8]}"
        rep.admit_node(node, name, cfg.fleet_id)
    emit(args, {"admitted": node.hex(), "name": name, "fleet_id": cfg.fleet_id},
         f"admitted {name} ({node.hex()[:16]}) to fleet {cfg.fleet_id}: members count its ops once this reaches "
         "them (a running daemon sends it on at once)")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    out = _daemon(args).call("POST", "/api/fleet/rotate", {})
    emit(args, out, f"rotated the fleet key to fleet {out['fleet_id']} (epoch {out['epoch']}), sealed to "
                     f"{out['members']} member(s): a holder of an earlier key gets nothing more from the fleet; "
                     "members that are offline catch up when they come back.")
    return 0


# -- the flags ------------------------------------------------------------------------------------


class _Duration(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option: str | None = None) -> None:
        setattr(ns, self.dest, values)
        ns.expires_given = True


def invite_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--host", help="address other machines reach this one at (default: this machine's LAN address)")
    s.add_argument("--code", action="store_true", help="a short one-time code to type on the other machine instead")
    s.add_argument("--expires", type=parse_duration, default=DEFAULT_TTL, action=_Duration, metavar="DURATION",
                   help=f"how long it stays valid (default 24h for a token, max {int(MAX_TTL // 86400)}d; 10m "
                        "for a code)")
    s.set_defaults(fn=cmd_invite, expires_given=False)


def join_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("token", nargs="?", metavar="TOKEN", help="an invite made by `peerd invite` on a member")
    s.add_argument("--lan", action="store_true", help="ask a member found on this LAN; approve there")
    s.add_argument("--code", metavar="CODE", help="a one-time code made by `peerd invite --code` on a member")
    s.add_argument("--seed", action="append", metavar="HOST:PORT",
                   help="a member's address (instead of looking on the LAN; repeatable)")
    s.add_argument("--fleet", metavar="ID", help="with --lan: the fleet to join when several are on the LAN")
    s.add_argument("--name", help="a name for this node (default: its configured name, or the host name)")
    s.add_argument("--timeout", type=parse_duration, default=None, metavar="DURATION",
                   help="give up waiting for the approval after this long (default: when the request expires)")
    s.add_argument("--force", action="store_true", help="leave this home's current fleet even though it holds "
                                                        "other nodes' messages")
    s.set_defaults(fn=cmd_join)


def requests_arguments(s: argparse.ArgumentParser) -> None:
    s.set_defaults(fn=cmd_requests)


def approve_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("code", metavar="CODE", help="the six-digit verification code both machines show")
    s.set_defaults(fn=cmd_approve)


def reject_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("code", metavar="CODE", help="the six-digit verification code of the request to refuse")
    s.set_defaults(fn=cmd_reject)


def admit_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("node", metavar="NODE_ID", help="the whole id of the machine to let in (64 hex digits)")
    s.add_argument("--name", help="a name for it in the fleet (default: node- and the start of its id)")
    s.set_defaults(fn=cmd_admit)


def rotate_arguments(s: argparse.ArgumentParser) -> None:
    s.set_defaults(fn=cmd_rotate)


def remove_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("node", metavar="NODE", help="the node's name or the start of its id (see `peerd peers`)")
    s.set_defaults(fn=cmd_remove)
