"""``peerd join``: the joining machine's side, from the command line (see ``peerd.cli.pairing``).

Invariants:
* Nothing is written to the home until a member's answer checked out: a fresh machine's node
  key is made in memory and saved only then, so a failed join leaves no half-made home behind.
* A running daemon of the joining home takes the new fleet at once (``/api/fleet/reload``).
* Its own module so that the other commands never load aiohttp and the PAKE: ``peerd.cli.pairing``
  imports it when ``join`` runs.
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

from peerd import home as homes
from peerd.cli.backends import daemon, running_daemon
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.pairing import SCAN_WINDOW, emit
from peerd.cli.setup import home_flag
from peerd.config import default_name, fleet_id, load_config, normalize_seed
from peerd.errors import ConfigError
from peerd.invite import Invite, parse_invite
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError
from peerd.pairing.grant import Grant
from peerd.pairing.guest import Guest, HomeState, Joiner, enter_fleet, http, may_enter
from replica import identity, open_home


def _prepare(home: Path, name: str | None) -> tuple[Joiner, HomeState, identity.Identity | None]:
    """This machine as a joiner, what its home holds, and the new identity to save if it has none."""
    cfg = load_config(homes.config_path(home)) if homes.config_path(home).exists() else None
    fresh = None
    if homes.node_key_path(home).exists():
        with open_home(home) as rep:
            ident_key, signing = rep.node_key, rep.signing_key
            others = len([k for k in rep.vector() if k != rep.node_key])
            rotations = len(rep.fleet_view().standing.valid)
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
    with open_home(home) as rep:  # trust whom the member trusts, so both decide alike who is a member
        rep.set_fleet_roots(grant.trusted())
    switched = _tell_daemon(home)
    data = {"fleet_id": cfg.fleet_id, "member": grant.member_name, "address": addr, "seeds": list(cfg.seeds),
            "node_id": me.key.hex(), "daemon": switched}
    after = ("the running daemon switched to it" if switched is not None
             else f"start with: peerd run{home_flag(args.home)}")
    emit(args, data, f"joined fleet {cfg.fleet_id} (let in by {grant.member_name} at {addr}); "
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
