"""The commands that bring machines into a fleet and take them out: ``invite``, ``join``,
``requests``, ``approve``, ``reject`` and ``remove``.

Invariants:
* ``join`` writes nothing to the home until a member's answer checked out: a fresh machine's node
  key is made in memory and saved only then, so a failed join leaves no half-made home behind.
* A running daemon of the joining home takes the new fleet at once (``/api/fleet/reload``); no
  restart by hand.
* ``requests``, ``approve``, ``reject``, ``remove`` and ``invite --code`` act through the running
  daemon (exit code 3 without one): the requests and codes live in its memory.
* Durations are ``N`` seconds or ``Ns``, ``Nm``, ``Nh``, ``Nd``; anything else is a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from discovery.seeds import format_seed
from peerd import home as homes
from peerd.cli.backends import daemon, running_daemon
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.format import table
from peerd.cli.setup import home_flag, open_fleet
from peerd.config import default_name, fleet_id, load_config, normalize_seed
from peerd.errors import ConfigError
from peerd.invite import DEFAULT_TTL, MAX_TTL, Invite, issue, parse_invite
from peerd.netaddr import lan_address
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError
from peerd.pairing.grant import Grant
from peerd.pairing.guest import Guest, HomeState, Joiner, enter_fleet, http, may_enter
from replica import identity, open_home

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


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
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
    _emit(args, {"invite": token, "seeds": list(inv.seeds), "fleet_id": fleet, "expires": inv.expires},
          f"{token}\n\nOn the other machine run:\n  peerd join {token}\n\nIt works once, until {until}, while "
          f"this machine's daemon runs; it holds no key.{note}")
    return 0


def _invite_code(args: argparse.Namespace, home: Path) -> int:
    ttl = min(args.expires if args.expires_given else 600.0, 24 * 3600.0)
    out = daemon(home).call("POST", "/api/pair/code", {"expires": ttl})
    elsewhere = (f"\n(or, from another network: peerd join --code {out['code']} --seed {out['addresses'][0]})"
                 if out.get("addresses") else "")
    _emit(args, out, f"one-time code: {out['code']}\n\nOn the other machine (same LAN) run:\n  peerd join --code "
                     f"{out['code']}{elsewhere}\n\nIt works once, for {ttl / 60:g} minutes, with {out['attempts']} "
                     "tries.")
    return 0


# -- join -----------------------------------------------------------------------------------------


def _prepare(home: Path, name: str | None) -> tuple[Joiner, HomeState, identity.Identity | None]:
    """This machine as a joiner, what its home holds, and the new identity to save if it has none."""
    cfg = load_config(homes.config_path(home)) if homes.config_path(home).exists() else None
    fresh = None
    if homes.node_key_path(home).exists():
        with open_home(home) as rep:
            ident_key, signing = rep.node_key, rep.signing_key
            others = len([k for k in rep.vector() if k != rep.node_key])
            rotations = len(rep.rekey_ops())
    else:
        fresh = identity.generate()
        ident_key, signing, others, rotations = fresh.public_key, fresh.signing_key, 0, 0
    me = Joiner(ident_key, signing, name or (cfg.name if cfg else default_name(ident_key.hex())))
    return me, HomeState(cfg, others, rotations), fresh


def _own_fleets(state: HomeState) -> set[str]:
    cfg = state.config
    return set() if cfg is None else {cfg.fleet_id, *(fleet_id(k) for k in cfg.previous_fleet_keys)}


def cmd_join(args: argparse.Namespace) -> int:
    ways = [bool(args.token), bool(args.code), bool(args.lan)]
    if sum(ways) > 1:
        raise CliError("give one of TOKEN, --code CODE or --lan", EXIT_USAGE)
    if not any(ways) and not args.seed:
        raise CliError("join how? `peerd join --lan` (approve on a member), `peerd join --code CODE`, "
                       "`peerd join TOKEN`, or `peerd join --seed HOST:PORT` (approve there)", EXIT_USAGE)
    home = homes.resolve_home(args.home)
    inv = parse_invite(args.token) if args.token else None
    code = None
    if args.code:
        code = codes.parse_code(args.code)
        if code is None:
            raise CliError(f"{args.code!r} is not a one-time code (8 letters and digits, like "
                           f"{codes.show_code('k7m3x9qp')})", EXIT_USAGE)
    seeds = _seeds(args.seed or ())
    me, state, fresh = _prepare(home, args.name)
    if inv is not None:
        may_enter(state, inv.fleet_id, force=args.force)
    grant, addr = asyncio.run(_join(args, me, state, inv=inv, code=code, seeds=seeds))
    if fresh is not None:
        open_home(home, new_identity=fresh).close()
    cfg = enter_fleet(home, grant, state, name=args.name, force=args.force, extra_seeds=(addr,))
    switched = _tell_daemon(home)
    data = {"fleet_id": cfg.fleet_id, "member": grant.member_name, "address": addr, "seeds": list(cfg.seeds),
            "node_id": me.key.hex(), "daemon": switched}
    after = ("the running daemon switched to it" if switched is not None
             else f"start with: peerd run{home_flag(args.home)}")
    _emit(args, data, f"joined fleet {cfg.fleet_id} (let in by {grant.member_name} at {addr}); "
                      f"seeds: {', '.join(cfg.seeds)}\n{after}")
    return 0


def _seeds(raw: Sequence[str]) -> list[str]:
    try:
        return [normalize_seed(s) for s in raw]
    except ConfigError as exc:
        raise CliError(f"--seed: {exc}", EXIT_USAGE) from None


async def _join(args: argparse.Namespace, me: Joiner, state: HomeState, *, inv: Invite | None, code: str | None,
                seeds: list[str]) -> tuple[Grant, str]:
    transport = http()
    guest = Guest(transport, me, lambda fid: may_enter(state, fid, force=args.force))
    try:
        if inv is not None:
            return await _first(guest, [*inv.seeds, *seeds], lambda a: guest.redeem(a, inv))
        if code is not None:
            targets = seeds or [s for _f, s in await _members(args, state, me, any_fleet=True)]
            return await _first(guest, targets, lambda a: guest.code(a, code), skip_unknown=True)
        asked = seeds or [s for _f, s in await _members(args, state, me)]
        deadline = time.monotonic() + args.timeout if args.timeout else None
        return await _first(guest, asked,
                            lambda a: guest.ask(a, lambda c, asked: _show_code(args, c, asked, a), deadline))
    finally:
        await transport.close()


async def _first(guest: Guest, targets: Sequence[str], attempt: Any, *,
                 skip_unknown: bool = False) -> tuple[Grant, str]:
    """Try ``attempt(addr)`` on each target until one answers; the last reason otherwise."""
    errors = []
    for addr in dict.fromkeys(targets):
        try:
            return await attempt(addr), addr
        except PairingError as exc:
            unreachable = str(exc).startswith(("cannot reach", f"{addr} is not a peerd"))
            unknown = skip_unknown and "no such code" in str(exc)
            if not (unreachable or unknown):
                raise
            errors.append(str(exc))
    if not errors:
        raise PairingError("no member to ask")
    raise PairingError(errors[-1] if len(errors) == 1 else f"no member took it ({len(errors)} tried): {errors[-1]}")


async def _members(args: argparse.Namespace, state: HomeState, me: Joiner, *,
                   any_fleet: bool = False) -> list[tuple[str, str]]:
    """(fleet id, address) of the members to ask, found by mDNS: the one other fleet on the LAN
    (or the one ``--fleet`` names); with ``any_fleet``, every node of every other fleet."""
    from discovery.scan import scan  # noqa: PLC0415 - only joining needs zeroconf here

    if not args.json:
        print("looking for peerd fleets on this LAN…", file=sys.stderr, flush=True)
    seen = [s for s in await scan(window=SCAN_WINDOW, settle=1.0)
            if s.candidate.node_id != me.key.hex() and s.fleet_id not in _own_fleets(state)]
    if args.fleet:
        seen = [s for s in seen if s.fleet_id.startswith(args.fleet.lower())]
    fleets: dict[str, list[str]] = {}
    for s in sorted(seen, key=lambda s: (s.name or "", s.candidate.node_id or "")):
        fleets.setdefault(s.fleet_id, []).append(f"{s.name or '?'} at {s.candidate.host}:{s.candidate.port}")
    if not fleets:
        which = f"fleet {args.fleet}" if args.fleet else "peerd fleet other than this machine's"
        raise PairingError(f"no {which} answered on this LAN within {SCAN_WINDOW:g} s (is mDNS blocked between "
                           "the machines?); give a member's address with --seed HOST:PORT")
    if len(fleets) > 1 and not any_fleet:
        listing = "; ".join(f"{fid}: {', '.join(nodes)}" for fid, nodes in fleets.items())
        raise PairingError(f"{len(fleets)} fleets are on this LAN ({listing}); pick one with --fleet ID")
    return [(s.fleet_id, f"{s.candidate.host}:{s.candidate.port}") for s in seen]


def _show_code(args: argparse.Namespace, code: str, asked: dict[str, Any], addr: str) -> None:
    member, fleet = asked.get("nm", "?"), asked.get("f", "?")
    if args.json:  # one line first, so a program driving `join` can show the code while it waits
        print(json.dumps({"verification_code": code, "fleet_id": fleet, "member": member, "address": addr}),
              flush=True)
        return
    print(f"verification code: {codes.show_verification(code)}\n\nOn {member} (or any machine of fleet {fleet}) "
          f"run:\n  peerd approve {code}\nafter checking that `peerd requests` there shows this code for this "
          f"machine. Waiting for the approval (Ctrl-C gives up)…", flush=True)


def _tell_daemon(home: Path) -> dict[str, Any] | None:
    """Ask the home's running daemon to take the new config; None when none runs."""
    if running_daemon(home) is None:
        return None
    return dict(daemon(home).call("POST", "/api/fleet/reload", {}))


# -- a member's side ------------------------------------------------------------------------------


def cmd_requests(args: argparse.Namespace) -> int:
    rows = daemon(homes.resolve_home(args.home)).call("GET", "/api/pair/requests")
    if not rows:
        text = "no join requests waiting (on the new machine run: peerd join --lan)"
    else:
        text = table([(codes.show_verification(r["code"]), r["name"], r["node_id"][:16], r["from"],
                       f"{int(r['expires_in'] // 60)} min") for r in rows],
                     ["CODE", "NAME", "NODE", "FROM", "EXPIRES IN"])
        text += "\n\napprove one with: peerd approve CODE   (or refuse it: peerd reject CODE)"
    _emit(args, rows, text)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    out = daemon(homes.resolve_home(args.home)).call("POST", "/api/pair/approve", {"code": args.code})
    _emit(args, out, f"approved {out['approved']} (node {out['node_id'][:16]}): it joins fleet {out['fleet_id']}")
    return 0


def cmd_reject(args: argparse.Namespace) -> int:
    out = daemon(homes.resolve_home(args.home)).call("POST", "/api/pair/reject", {"code": args.code})
    _emit(args, out, f"rejected {out['rejected']} (node {out['node_id'][:16]})")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    out = daemon(homes.resolve_home(args.home)).call("POST", "/api/fleet/remove", {"node": args.node})
    who = f"{out['name']} ({out['removed'][:16]})" if out.get("name") else out["removed"][:16]
    _emit(args, out, f"removed {who}: its ops after #{out['upto']} are refused everywhere. The fleet key was "
                     f"rotated to fleet {out['fleet_id']} (epoch {out['epoch']}), sealed to {out['members']} "
                     "member(s); members that are offline catch up when they come back.")
    return 0


# -- the parser -----------------------------------------------------------------------------------


class _Duration(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option: str | None = None) -> None:
        setattr(ns, self.dest, values)
        ns.expires_given = True


def add_pairing_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("invite", parents=[common], help="let another machine join: a single-use token, or --code")
    s.add_argument("--host", help="address other machines reach this one at (default: this machine's LAN address)")
    s.add_argument("--code", action="store_true", help="a short one-time code to type on the other machine instead")
    s.add_argument("--expires", type=parse_duration, default=DEFAULT_TTL, action=_Duration, metavar="DURATION",
                   help=f"how long it stays valid (default 24h for a token, max {int(MAX_TTL // 86400)}d; 10m "
                        "for a code)")
    s.set_defaults(fn=cmd_invite, expires_given=False)

    s = sub.add_parser("join", parents=[common], help="join a fleet: --lan, --code CODE or an invite TOKEN")
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

    s = sub.add_parser("requests", parents=[common], help="join requests waiting for approval on this member")
    s.set_defaults(fn=cmd_requests)
    s = sub.add_parser("approve", parents=[common], help="let in the machine whose request shows CODE")
    s.add_argument("code", metavar="CODE", help="the six-digit verification code both machines show")
    s.set_defaults(fn=cmd_approve)
    s = sub.add_parser("reject", parents=[common], help="refuse the join request that shows CODE")
    s.add_argument("code", metavar="CODE")
    s.set_defaults(fn=cmd_reject)
    s = sub.add_parser("remove", parents=[common],
                       help="remove a machine from the fleet: refuse its new ops and rotate the fleet key")
    s.add_argument("node", metavar="NODE", help="the node's name or the start of its id (see `peerd peers`)")
    s.set_defaults(fn=cmd_remove)
