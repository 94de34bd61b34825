"""The ``peerd`` argument parser: every command, its flags and their help.

Invariants: each subcommand sets ``fn`` to its ``commands.cmd_*`` function;
the global options ``--home`` and ``--json`` are accepted before the command
and after it (given in both places, the one after wins); a malformed flag
value, an unknown command or flag is a usage error (exit code 2) reported by
argparse before any command runs, with the closest command or flag suggested.
"""

from __future__ import annotations

import argparse
from typing import Any

from peerd.cli import hook
from peerd.cli.argparsing import Parser, add_mcp_command, global_options
from peerd.cli.backup import add_backup_commands
from peerd.cli.commands import (
    cmd_doctor,
    cmd_hook,
    cmd_inbox,
    cmd_init,
    cmd_log,
    cmd_peers,
    cmd_profile,
    cmd_read,
    cmd_run,
    cmd_search,
    cmd_send,
    cmd_status,
    cmd_stop,
    cmd_threads,
)
from peerd.cli.pairing import add_pairing_commands
from peerd.cli.retention import add_retention_commands


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
    s.add_argument("--new-fleet", action="store_true",
                   help="make a new fleet even though this home holds a node whose config.toml is gone")
    s.set_defaults(fn=cmd_init)

    add_pairing_commands(sub, common)

    s = sub.add_parser("run", parents=[common], help="run the daemon (initialises the home if needed)")
    s.add_argument("--port", type=int, help="peer port (0 picks a free one)")
    s.add_argument("--local-port", type=int, help="local port for MCP, the API and the dashboard (0 picks a free one)")
    s.add_argument("--seed", action="append", metavar="HOST:PORT", help="a peer to contact (repeatable)")
    s.add_argument("--no-mdns", action="store_true", help="do not use mDNS discovery")
    s.add_argument("--bind", default="0.0.0.0", help="address the peer server listens on (default: all)")
    s.add_argument("--advertise", help="this node's address as written in daemon.json (default: the bind "
                                       "address, or this machine's LAN address when bound to all interfaces)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--new-fleet", action="store_true",
                   help="make a new fleet even though this home holds a node whose config.toml is gone")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("stop", parents=[common], help="stop the daemon of this home and wait until it has exited")
    s.add_argument("--timeout", type=_positive, default=30.0, help="seconds to wait for it to exit (default 30)")
    s.set_defaults(fn=cmd_stop)

    add_mcp_command(sub, common)
    add_backup_commands(sub, common)


def _operator_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("status", parents=[common], help="node, fleet, peers, per-peer lag, totals, catch-up; "
                                                         "or, given a MESSAGE_ID, who got that message and read it")
    s.add_argument("message_id", nargs="?", metavar="MESSAGE_ID",
                   help="a message's id: per recipient, delivered and read (works with no daemon too)")
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

    add_retention_commands(sub, common)


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

    s = sub.add_parser("hook", parents=[common], help="print a role's unread mail for a Claude Code or Codex hook")
    hook.add_arguments(s)
    s.set_defaults(fn=cmd_hook)

    s = sub.add_parser("read", parents=[common], help="mark messages read by receipt id")
    s.add_argument("receipts", nargs="+", metavar="RECEIPT")
    s.set_defaults(fn=cmd_read)


class _Version(argparse.Action):
    """``--version``: the text is built only when asked for (it loads the op and wire modules)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and the wire, op and replica "
                                                             "versions this peerd speaks, and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        from peerd import version_text  # noqa: PLC0415

        parser.exit(message=version_text() + "\n")


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    p = Parser(prog="peerd", description="Peer-to-peer messaging for AI agents.",
               epilog="exit codes: 0 ok, 1 request failed, 2 usage, 3 no daemon running, "
                      "4 no usable home, 5 doctor found problems, 130 interrupted")
    global_options(p, None)
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _setup_commands(sub, common)
    _messaging_commands(sub, common)
    _operator_commands(sub, common)
    return p


