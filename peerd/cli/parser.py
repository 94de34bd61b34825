"""The ``peerd`` argument parser: every command, its flags and their help.

Invariants: each subcommand sets ``fn`` to its ``commands.cmd_*`` function;
the global options ``--home`` and ``--json`` are accepted before the command
and after it (given in both places, the one after wins); a malformed flag
value, an unknown command or flag is a usage error (exit code 2) reported by
argparse before any command runs, with the closest command or flag suggested.
"""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from peerd.cli import hook
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
from peerd.cli.mcpserve import DEFAULT_HTTP_PORT, cmd_mcp
from peerd.cli.pairing import add_pairing_commands

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


def suggest(word: str, choices: list[str]) -> str | None:
    """The choice closest to a mistyped ``word``, if one is close enough."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors name the closest command or flag."""

    def error(self, message: str) -> NoReturn:
        super().error(message + self._hint(message))

    def _hint(self, message: str) -> str:
        if m := _INVALID_CHOICE.search(message):
            close = suggest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
            return f"; did you mean {close!r}?" if close else ""
        if m := _UNRECOGNIZED.search(message):
            flags = [o for a in self._all_actions() for o in a.option_strings if o.startswith("--")]
            for word in m.group(1).split():
                close = suggest(word.split("=")[0], flags) if word.startswith("--") else None
                if close:
                    return f"; did you mean {close}?"
        return ""

    def _all_actions(self) -> list[argparse.Action]:
        """This parser's actions and those of every subcommand."""
        out = list(self._actions)
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                out += [x for sub in a.choices.values() for x in sub._actions]
        return out


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

    s = sub.add_parser("mcp", parents=[common],
                       help="serve the MCP tools (stdio or HTTP) on this home's replica, a replica file or memory; "
                            "with --role, a Claude Code channel")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (default), or streamable HTTP on 127.0.0.1 at /mcp")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--db-path", metavar="FILE",
                       help="serve this replica file (created if missing, its node key kept beside it)")
    where.add_argument("--in-memory", action="store_true",
                       help="serve a replica in this process's memory (shared with nobody, gone on exit)")
    s.add_argument("--host", help="with --transport http: 127.0.0.1 (default) or localhost")
    s.add_argument("--port", type=int,
                   help=f"with --transport http: the port (default {DEFAULT_HTTP_PORT}; 0 picks a free one)")
    s.add_argument("--role", help="stdio: bind this session to a role (used when a tool call omits it)")
    s.add_argument("--instance", help="stdio: bind this session to an instance id")
    s.add_argument("--init", action="store_true", help="create the home (a new fleet) if there is none")
    s.add_argument("--from", dest="push_from", action="append", metavar="ROLE",
                   help="stdio: push only mail from this role or agent (repeatable; the rest waits for check_messages)")
    s.add_argument("--no-push", action="store_true",
                   help="stdio: no Claude Code channel pushes (for clients without channels that use `peerd hook`)")
    s.set_defaults(fn=cmd_mcp)


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


def _global_options(p: argparse.ArgumentParser, default: Any) -> None:
    """``--home`` and ``--json``; after the command they default to SUPPRESS, so that a value
    given before the command is not overwritten by the subcommand's default."""
    p.add_argument("--home", default=default, help="home folder (default: $PEERD_HOME or the user data folder)")
    p.add_argument("--json", action="store_true", default=default if default is argparse.SUPPRESS else False,
                   help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    _global_options(common, argparse.SUPPRESS)
    p = Parser(prog="peerd", description="Peer-to-peer messaging for AI agents.",
               epilog="exit codes: 0 ok, 1 request failed, 2 usage, 3 no daemon running, "
                      "4 no usable home, 5 doctor found problems, 130 interrupted")
    _global_options(p, None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _setup_commands(sub, common)
    _messaging_commands(sub, common)
    _operator_commands(sub, common)
    return p


