"""The ``peerd`` command line's one parser: the table of commands, the global options, and how a
call is parsed.

Invariants:
* One definition: each command is one row of ``COMMANDS`` (its name, the module of ``peerd.cli``
  whose ``<name>_arguments(parser)`` adds its flags and sets ``fn``, and its help), so registering
  a command is one line, and nothing of a command loads until a call needs it.
* A call that names a command builds the root and that command's flags only, so each command
  loads its own module and no other's (``peerd hook`` runs on every prompt, ``peerd mcp`` with
  every MCP session); help with no command, or a word that is no command, builds them all.
* ``--home`` and ``--json`` are accepted before the command and after it (given in both places,
  the one after wins). Which command a call names is read with the same definition of them
  (``command_of``), never by scanning the words by hand.
* A usage error (an unknown command or flag, a malformed or missing value) is reported before any
  command runs, names the closest command or flag, and exits 2, or the command's own
  ``usage_exit`` (``peerd hook``: 1, since a hook that exits 2 blocks the user's prompt).
* ``peerd --help`` lists the commands by group (``GROUPS``), as ``git help`` does; every command
  is in exactly one group, and every command and argument has a line of help (a test walks them).
* Light: the standard library's argparse and nothing else, so that a quick command's start-up
  stays its own (help is laid out without ``shutil``, which argparse would import).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn

from peerd.cli.errors import EXIT_USAGE
from replica.errors import LocalError

GROUPS = (  # (name, what its commands do), in the order ``peerd --help`` lists them
    ("messaging", "send and read messages"),
    ("fleet", "bring machines into the fleet, see them, take them out"),
    ("agents", "connect agents: MCP, prompt hooks, their roles and profiles"),
    ("coordination", "file reservations and acknowledgements between agents"),
    ("operations", "run a node, watch it, check it, keep it"),
)


class Command(NamedTuple):
    name: str
    module: str  # in peerd.cli; its ``<name>_arguments(parser)`` adds the command's flags and sets ``fn``
    help: str
    group: str  # one of GROUPS, where ``peerd --help`` lists it
    usage_exit: int | None = None  # a code of its own for usage errors, told as "peerd NAME: ..."

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        # __import__ rather than importlib.import_module: only an import through it shows in
        # ``python -X importtime``, which the tests read to keep each command's start-up its own.
        module = __import__(f"peerd.cli.{self.module}", fromlist=["_"])
        getattr(module, f"{self.name.replace('-', '_')}_arguments")(p)


COMMANDS = (
    Command("send", "arguments", "send a message ('-' as TEXT reads it from stdin)", "messaging"),
    Command("inbox", "arguments", "unread messages for a role (records delivery)", "messaging"),
    Command("read", "arguments", "mark messages read by receipt id", "messaging"),
    Command("retract", "arguments", "retract a message you sent: every node drops its content (signed)", "messaging"),
    Command("log", "arguments", "recent traffic: the latest messages in arrival order", "messaging"),
    Command("search", "arguments", "full-text search over every message held here", "messaging"),
    Command("threads", "arguments", "threads: participants, message count, latest activity", "messaging"),
    Command("init", "arguments", "create the home: replica, node key, config.toml", "fleet"),
    Command("join", "pairing", "join a fleet: --lan, --code CODE or an invite TOKEN", "fleet"),
    Command("invite", "pairing", "let another machine join: a single-use token, or --code", "fleet"),
    Command("requests", "pairing", "join requests waiting for approval on this member", "fleet"),
    Command("approve", "pairing", "let in the machine whose request shows CODE", "fleet"),
    Command("reject", "pairing", "refuse the join request that shows CODE", "fleet"),
    Command("admit", "pairing", "let in a machine given the fleet key by other means (by its node id)", "fleet"),
    Command("remove", "pairing", "remove a machine from the fleet: refuse its new ops and rotate the fleet key",
            "fleet"),
    Command("rotate", "pairing", "a new fleet key for the members, removing nobody (after a key leaked)", "fleet"),
    Command("peers", "arguments", "known peers: how found, live or not, lag, last error", "fleet"),
    Command("mcp", "mcpserve", "serve the MCP tools (stdio or HTTP) on this home's replica, a replica file or "
                               "memory; with --role, a Claude Code channel", "agents"),
    Command("hook", "hook", "print a role's unread mail for a Claude Code or Codex hook", "agents", usage_exit=1),
    Command("codex-wake", "codex", "hand each role's new mail to the Codex session that speaks for it, as input "
                                   "Codex runs at once", "agents"),
    Command("profile", "arguments", "list profiles, show one, or set its fields", "agents"),
    Command("roles", "roles", "roles known here (confirmed, or seen only reading), who sent in their name; forget "
                              "a typo", "agents"),
    Command("role", "roles", "pin a role to nodes (only they may send in its name), or unpin it", "agents"),
    Command("leases", "leasecmds", "file reservations (leases on paths) held and lost", "coordination"),
    Command("guard", "leasecmds", "a git pre-commit guard that refuses commits touching paths another role holds",
            "coordination"),
    Command("acks", "leasecmds", "messages whose acknowledgement is overdue", "coordination"),
    Command("run", "arguments", "run the daemon (initialises the home if needed)", "operations"),
    Command("stop", "arguments", "stop the daemon of this home and wait until it has exited", "operations"),
    Command("status", "arguments", "node, fleet, peers, per-peer lag, totals, catch-up; or, given a MESSAGE_ID, "
                                   "who got that message and read it", "operations"),
    Command("dashboard", "arguments", "a one-time link that opens the running daemon's dashboard in a browser",
            "operations"),
    Command("doctor", "arguments", "check this node's setup and say what to fix", "operations"),
    Command("backup", "backup", "copy this home (replica and config) into one file, also while the daemon runs; "
                                "the file holds the fleet key", "operations"),
    Command("restore", "backup", "make a new home (--home) from a backup, as a new node", "operations"),
    Command("retention", "retention", "the fleet's retention horizon: set, show or clear it", "operations"),
)
BY_NAME = {c.name: c for c in COMMANDS}

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


def terminal_width() -> int:
    """The help's width as argparse would choose it, without argparse's ``import shutil``
    (with its compression modules: a few ms of every hook run otherwise)."""
    try:
        return int(os.environ["COLUMNS"]) - 2
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns - 2 if sys.__stdout__ else 78
    except (OSError, ValueError):
        return 78


class Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=terminal_width())


def suggest(word: str, choices: list[str]) -> str | None:
    """The choice closest to a mistyped ``word``, if one is close enough."""
    import difflib  # noqa: PLC0415 - only once a usage error is told

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors name the closest command or flag, and exit with
    ``usage_exit`` (told as ``label: message`` when that is not the usual 2)."""

    def __init__(self, *args: Any, usage_exit: int = EXIT_USAGE, label: str | None = None, **kw: Any) -> None:
        kw.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kw)
        self.usage_exit = usage_exit
        self.label = label or self.prog

    def error(self, message: str) -> NoReturn:
        message += self._hint(message)
        if self.usage_exit == EXIT_USAGE:
            super().error(message)
        self.exit(self.usage_exit, f"{self.label}: {message}\n")

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
        """This parser's actions and those of every subcommand built."""
        out = list(self._actions)
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                out += [x for sub in a.choices.values() for x in sub._actions]
        return out


class Root(Parser):
    """``peerd`` itself: its help lists the commands by group, as ``git help`` does."""

    def format_help(self) -> str:
        import textwrap  # noqa: PLC0415 - only when the help is asked for

        head = self._get_formatter()
        head.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        head.add_text(self.description)
        width = max(len(c.name) for c in COMMANDS)
        lines: list[str] = []
        for group, what in GROUPS:
            lines.append(f"{group}: {what}")
            for c in (c for c in COMMANDS if c.group == group):
                lines += textwrap.wrap(f"   {c.name.ljust(width)}  {c.help}", terminal_width(),
                                       subsequent_indent=" " * (width + 5))
            lines.append("")
        tail = self._get_formatter()
        tail.start_section("options")
        tail.add_arguments([a for a in self._actions if a.option_strings])
        tail.end_section()
        tail.add_text("'peerd COMMAND --help' tells a command's own flags and arguments.")
        tail.add_text(self.epilog)
        return head.format_help() + "\n" + "\n".join(lines) + "\n" + tail.format_help()


def global_options(p: argparse.ArgumentParser, default: Any) -> None:
    """``--home`` and ``--json``; after the command they default to SUPPRESS, so that a value
    given before the command is not overwritten by the subcommand's default."""
    p.add_argument("--home", default=default, help="home folder (default: $PEERD_HOME or the user data folder)")
    p.add_argument("--json", action="store_true", default=default if default is argparse.SUPPRESS else False,
                   help="print machine-readable JSON")


class _Version(argparse.Action):
    """``--version``: the text is built only when asked for (it loads the op and wire modules)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and the wire, op and replica "
                                                             "versions this peerd speaks, and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        from peerd import version_text  # noqa: PLC0415

        parser.exit(message=version_text() + "\n")


class _Unparsed(LocalError):
    """What the picker could not read (the full parser then tells it)."""


class _Picker(argparse.ArgumentParser):
    """Reads which command a call names; it never reports an error (the full parser does)."""

    def error(self, message: str) -> NoReturn:
        raise _Unparsed(message)


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, read with the global options' own definition; None when it
    names none, or something before it is not a global option (help, ``--version``, a typo):
    then the whole tree is built, to help or to tell the error."""
    picker = _Picker(add_help=False, formatter_class=Formatter)
    global_options(picker, None)
    picker.add_argument("command", nargs="?")
    picker.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        ns, unknown = picker.parse_known_args(argv)
    except _Unparsed:
        return None
    return ns.command if ns.command in BY_NAME and not unknown else None


def _usage(cmd: Command | None) -> tuple[int, str | None]:
    """The exit code of a usage error and the name it is told under, for a call of ``cmd``."""
    if cmd is None or cmd.usage_exit is None:
        return EXIT_USAGE, None
    return cmd.usage_exit, f"peerd {cmd.name}"


def build_parser(only: str | None = None) -> Parser:
    """``peerd``'s parser: with ``only`` (a command's name), the root and that command alone; else
    every command."""
    chosen = BY_NAME.get(only) if only is not None else None
    code, label = _usage(chosen)
    common = Parser(add_help=False)
    global_options(common, argparse.SUPPRESS)
    p = Root(prog="peerd", description="Peer-to-peer messaging for AI agents.",
               epilog="exit codes: 0 ok, 1 request failed, 2 usage, 3 no daemon running, "
                      "4 no usable home, 5 doctor found problems, 130 interrupted", usage_exit=code, label=label)
    global_options(p, None)
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for cmd in COMMANDS if chosen is None else (chosen,):
        code, label = _usage(cmd)
        cmd.add_arguments(sub.add_parser(cmd.name, parents=[common], help=cmd.help, usage_exit=code, label=label))
    return p


def parser_for(argv: Sequence[str]) -> Parser:
    """The parser a call needs: its command's alone, or every command's."""
    return build_parser(command_of(argv))
