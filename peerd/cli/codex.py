"""``peerd codex-wake``: hand each role's new mail to the Codex session that speaks for the role, as
new input that Codex runs as a turn (``peerd.codexwake`` says how, and which session).

Invariants:
* It serves a home (``--home``, ``PEERD_HOME`` or the default); a folder that is no home exits 4,
  as ``peerd mcp`` does. It follows the home's change feed as ``peerd mcp`` does: the daemon's
  stream while one runs, a watch on the replica file otherwise.
* It runs until Ctrl-C or SIGTERM, and says on stdout, one line each, when it waits for Codex,
  connects, learns which thread speaks for which role, and wakes one.
* Usage mistakes (an empty role, a limit out of range) exit 2 before anything runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from peerd import home as homes
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.setup import home_flag, open_fleet

MAX_LIMIT = 50


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_LIMIT}")
    return value


def codex_wake_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", dest="roles", action="append", metavar="ROLE",
                   help="wake only sessions of this role (repeatable; default: every role a Codex session speaks for)")
    p.add_argument("--from", dest="senders", action="append", metavar="ROLE",
                   help="hand over only mail from this sender (repeatable); the rest waits for check_messages")
    p.add_argument("--limit", type=_limit, default=10, metavar="N",
                   help=f"messages shown in full in one input, 1-{MAX_LIMIT} (default 10); the rest are counted")
    p.add_argument("--socket", metavar="PATH",
                   help="the Codex app server's Unix socket (default: $CODEX_HOME/app-server-control/"
                        "app-server-control.sock, CODEX_HOME being ~/.codex unless set)")
    p.set_defaults(fn=cmd_codex_wake)


def cmd_codex_wake(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415 - keeps quick commands quick to start

    from peerd.codexapp import control_socket  # noqa: PLC0415

    roles = [r.strip() for r in args.roles or ()]
    if any(not r for r in roles):
        raise CliError("peerd codex-wake: --role must not be empty", EXIT_USAGE)
    home = homes.resolve_home(args.home)
    open_fleet(home, flag=home_flag(args.home), create=False)
    socket = Path(args.socket).expanduser().absolute() if args.socket else control_socket()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(home, socket, roles, list(args.senders or ()), args.limit))
    return 0


async def _serve(home: Path, socket: Path, roles: list[str], senders: list[str], limit: int) -> None:
    import asyncio  # noqa: PLC0415
    import signal  # noqa: PLC0415
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    from mcp_server.wiring import wired  # noqa: PLC0415 - the feed and its waiter (no MCP SDK)
    from peerd.codexwake import Options, Waker  # noqa: PLC0415
    from peerd.feedlink import DaemonLink  # noqa: PLC0415
    from replica import open_home  # noqa: PLC0415
    from replica.names import name_key  # noqa: PLC0415

    try:
        release = version("peerd")
    except PackageNotFoundError:
        release = ""
    homes.tighten(home)
    replica = await asyncio.to_thread(open_home, home)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    try:
        async with wired(replica, DaemonLink(home)) as wiring:
            options = Options(frozenset(name_key(r) for r in roles), tuple(senders), limit)
            waker = Waker(replica, wiring.waiter, socket, options, say=_say, version=release)
            for sig in signals:
                loop.add_signal_handler(sig, stop.set)
            try:
                task = asyncio.ensure_future(waker.run())
                await asyncio.wait([task, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            finally:
                for sig in signals:
                    loop.remove_signal_handler(sig)
    finally:
        replica.close()


def _say(line: str) -> None:
    print(f"peerd codex-wake: {line}", file=sys.stdout, flush=True)
