"""Argument parsing shared by the full ``peerd`` parser and the lean one of ``peerd mcp``.

``peerd mcp`` starts with every MCP client session, so it does not load the other commands'
modules: ``mcp_parser`` builds a parser that knows only it (the same flags, help and errors
as in the full parser, which adds the same sub-parser with ``add_mcp_command``).
"""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from peerd.cli.mcpserve import DEFAULT_HTTP_PORT, cmd_mcp

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


def global_options(p: argparse.ArgumentParser, default: Any) -> None:
    """``--home`` and ``--json``; after the command they default to SUPPRESS, so that a value
    given before the command is not overwritten by the subcommand's default."""
    p.add_argument("--home", default=default, help="home folder (default: $PEERD_HOME or the user data folder)")
    p.add_argument("--json", action="store_true", default=default if default is argparse.SUPPRESS else False,
                   help="print machine-readable JSON")



def add_mcp_command(sub: Any, common: argparse.ArgumentParser) -> None:
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


def mcp_parser() -> argparse.ArgumentParser:
    """``peerd`` with only its ``mcp`` command: what ``peerd mcp`` parses its arguments with."""
    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    p = Parser(prog="peerd", description="Peer-to-peer messaging for AI agents.")
    global_options(p, None)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_mcp_command(sub, common)
    return p
