"""The ``peerd`` commands: one ``cmd_*`` function per command, taking the parsed
arguments and returning the exit code.

Invariants:
* A command prints its result once, as text or (``--json``) as the JSON the
  local API returns; ``--watch`` / ``--follow`` print one record per line
  and end with exit code 0 on Ctrl-C.
* Failures are raised (``CliError``, or the project's own errors, which
  ``main`` turns into exit codes); nothing here calls ``sys.exit``.
* What only one command needs (the daemon, the MCP server, doctor, asyncio)
  is imported inside it, so quick commands start quickly.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from peerd import home as homes
from peerd.cli import format as fmt
from peerd.cli.backends import Backend, backend, daemon
from peerd.cli.errors import EXIT_NO_DAEMON, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, CliError
from peerd.cli.setup import Footprint, home_flag, open_fleet
from peerd.config import decode_fleet_key, with_overrides
from peerd.netaddr import advertised_host
from replica import open_home

FOLLOW_WAIT = 25.0  # seconds one long-poll of --follow waits for news
OFFLINE_POLL = 0.5  # seconds between looks at the replica when following with no daemon


def _home(args: argparse.Namespace) -> Path:
    return homes.resolve_home(args.home)


def _flag(args: argparse.Namespace) -> str:
    """The ``--home`` a hint repeats (only if the user gave one)."""
    return home_flag(args.home)


def _emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else text(data), flush=True)


def _emit_line(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    """One record of a stream (--follow): a JSON line, or its text form."""
    print(json.dumps(data, default=str) if args.json else text(data), flush=True)


def parse_settings(items: Sequence[str]) -> dict[str, str]:
    """``name=... static=... dynamic=...`` into a dict; a bad item is a usage error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in ("name", "static", "dynamic"):
            raise CliError(f"--set takes name=..., static=... or dynamic=..., not {item!r}", EXIT_USAGE)
        out[key] = value
    return out


# -- commands that work on the home directly ----------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    key = decode_fleet_key(args.fleet_key) if args.fleet_key else None
    cfg, _ = open_fleet(_home(args), flag=_flag(args), create=True, new_fleet=args.new_fleet, name=args.name,
                        fleet_key=key)
    with open_home(_home(args)) as rep:
        node = rep.node_id
        member = rep.fleet_view().standing.counts(rep.node_key)
    data = {"home": str(_home(args)), "node_id": node, "name": cfg.name, "fleet_id": cfg.fleet_id, "member": member}
    admit = ("" if member else f"\n  not a member yet: the fleet key alone gives no voice; on a member run "
             f"peerd admit {node} --name {cfg.name} (or join with peerd join, which asks a member)")
    _emit(args, data, lambda d: f"initialised {d['home']}\n  node  {d['node_id']}\n  fleet {d['fleet_id']}{admit}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Serve the home (made if missing). Once ready: the ready block on stdout, alone (with --json:
    the ready line there, the block on stderr); the log in the home's peerd.log (-v: on stderr). A
    start that fails takes back the home it made."""
    import asyncio  # noqa: PLC0415 - keeps quick commands quick to start

    from peerd import daemonlog  # noqa: PLC0415
    from peerd.daemon import announce_ready, run  # noqa: PLC0415

    home = _home(args)
    before = Footprint.of(home)
    cfg, created = open_fleet(home, flag=_flag(args), create=True, new_fleet=args.new_fleet)
    cfg = with_overrides(cfg, port=args.port, local_port=args.local_port, seeds=args.seed or (),
                         mdns=False if args.no_mdns else None)
    handler = daemonlog.setup(home, args.log_level, verbose=args.verbose)
    ready = False

    def orient(info: dict[str, Any]) -> None:
        nonlocal ready
        ready = True
        if args.json:  # stdout stays machine-readable: the ready line alone
            announce_ready({k: v for k, v in info.items() if k != "login_url"})
        block = fmt.format_orientation(info, flag=_flag(args), new_fleet=created)
        print(block, file=sys.stderr if args.json else sys.stdout, flush=True)

    try:
        asyncio.run(run(home, cfg, bind=args.bind, advertise=args.advertise or advertised_host(args.bind),
                        on_ready=orient))
    except BaseException:
        daemonlog.close(handler)
        if created and not ready:
            before.undo()
        raise
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from peerd.daemon import stop_daemon  # noqa: PLC0415 - only this command needs it

    home = _home(args)
    pid = stop_daemon(home, args.timeout)
    if pid is None:
        raise CliError(f"no daemon is running for {home}", EXIT_NO_DAEMON)
    _emit(args, {"stopped": True, "pid": pid, "home": str(home)},
          lambda d: f"stopped the daemon of {d['home']} (pid {d['pid']})")
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
    if args.message_id is not None:
        return _message_status(args)
    api = daemon(_home(args), _flag(args))
    if not args.watch:
        _emit(args, api.call("GET", "/api/status"), fmt.format_status)
        return 0
    shown = 0
    try:
        while True:
            st = api.call("GET", "/api/status")
            if args.json:
                _emit_line(args, st, fmt.format_status)
            else:
                _clear_screen()
                stamp = time.strftime("%H:%M:%S")
                print(f"{fmt.format_status(st)}\n\n[{stamp}] refreshing every {args.interval:g}s; Ctrl-C to stop",
                      flush=True)
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """A fresh one-time link that opens the running daemon's dashboard in a browser."""
    _emit(args, daemon(_home(args), _flag(args)).call("POST", "/api/login", {}), fmt.format_login)
    return 0


def _message_status(args: argparse.Namespace) -> int:
    """``status MESSAGE_ID``: per recipient, delivered and read (through the daemon or the replica)."""
    if args.watch:
        raise CliError("--watch shows the node's status; leave it out with a MESSAGE_ID", EXIT_USAGE)
    with backend(_home(args), _flag(args)) as b:
        out = b.message_status(args.message_id)
    _emit(args, out, fmt.format_message_status)
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    api = daemon(_home(args), _flag(args))
    if args.json:
        _emit(args, api.call("GET", "/api/peers"), fmt.format_peers)
        return 0
    st = api.call("GET", "/api/status")  # the peers, and whether mDNS is on (what an empty table suggests)
    conf = st.get("settings")
    print(fmt.format_peers(st["peers"], conf.get("mdns") if isinstance(conf, dict) else None), flush=True)
    return 0


# -- commands that work through the daemon or on the replica --------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == ["-"] else " ".join(args.text)
    body = {"from": args.sender, "channel": args.to, "content": text,
            "instanceId": args.instance, "fromInstanceId": args.from_instance}
    with backend(_home(args), _flag(args)) as b:
        sent = b.send(body)
    _warn(sent)
    _emit(args, sent, lambda d: f"sent {d['messageId']} to {', '.join(d['recipients'])}")
    return 0


def _warn(out: dict[str, Any]) -> None:
    """A result's warning sentence, on stderr (--json output stays one object)."""
    if out.get("warning"):
        print(f"warning: {out['warning']}", file=sys.stderr, flush=True)


def cmd_inbox(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"recipient": args.role, "recipientInstanceId": args.instance, "limit": args.limit,
                            "wait": args.wait, "all": args.all}
    with backend(_home(args), _flag(args)) as b:
        inbox = b.inbox(body)
        if inbox.get("warning"):  # a role never seen, or seen only reading: most often a typo
            _warn(inbox)
            print(f"  if {args.role!r} is a typo, forget it: peerd roles forget {shlex.quote(args.role)}{_flag(args)}",
                  file=sys.stderr, flush=True)
        if not args.follow:
            _emit(args, inbox, lambda d: fmt.format_inbox(d, all_=args.all))
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
                _emit_line(args, m, fmt.format_inbox_message)
            body["since"] = batch["cursor"]
            body["wait"] = FOLLOW_WAIT  # the daemon's wait, or offline the replica's change feed
            batch = b.inbox(body)
    except KeyboardInterrupt:
        return 0


def cmd_read(args: argparse.Namespace) -> int:
    with backend(_home(args), _flag(args)) as b:
        result = b.read(args.receipts)
    _warn(result)
    _emit(args, result, lambda d: f"marked {d['markedAsRead']} read")
    return 0


def cmd_retract(args: argparse.Namespace) -> int:
    with backend(_home(args), _flag(args)) as b:
        out = b.retract(args.message_id, args.sender)
    _emit(args, out, lambda d: f"retracted {d['messageId']}: every node drops its content "
                               f"({fmt.plural(d['receiptsDeleted'], 'receipt')} no longer served)")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    with backend(_home(args), _flag(args)) as b:
        out = b.log(None, args.limit, 0)
        if not args.follow:
            _emit(args, out, fmt.format_log)
            return 0
        try:
            while True:
                for m in out["messages"]:
                    _emit_line(args, m, fmt.format_message)
                if not b.live:
                    time.sleep(OFFLINE_POLL)
                out = b.log(out["cursor"], 500, FOLLOW_WAIT if b.live else 0)
        except KeyboardInterrupt:
            return 0


def cmd_search(args: argparse.Namespace) -> int:
    with backend(_home(args), _flag(args)) as b:
        out = b.search(" ".join(args.query), args.sender, args.channel, args.since, args.limit)
    _emit(args, out, fmt.format_search)
    return 0


def cmd_threads(args: argparse.Namespace) -> int:
    with backend(_home(args), _flag(args)) as b:
        rows = b.threads()
    _emit(args, rows, fmt.format_threads)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    fields = parse_settings(args.set or [])
    if args.set is not None and args.id is None:
        raise CliError("--set needs the profile's ID: peerd profile ID --set name=...", EXIT_USAGE)
    with backend(_home(args), _flag(args)) as b:
        if args.id is None:
            _emit(args, b.profiles(), fmt.format_profiles)
            return 0
        if fields:
            _emit(args, b.update_profile(args.id, fields), fmt.format_profile)
            return 0
        found = b.profile(args.id)
    if found is None:
        raise CliError(f"no profile for {args.id!r} (set one with: "
                       f"peerd profile {args.id}{_flag(args)} --set name=...)")
    _emit(args, found, fmt.format_profile)
    return 0
