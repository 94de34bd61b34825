"""The ``peerd`` command line.

Commands: ``init``, ``run``, ``stop``, ``mcp`` set up, serve and stop a node;
``invite``, ``join``, ``requests``, ``approve``, ``reject``, ``remove`` bring
machines into a fleet and take them out; ``status``, ``peers`` ask the running daemon; ``send``,
``inbox``, ``read``, ``log``, ``search``, ``threads``, ``profile`` and
``status MESSAGE_ID`` work through the running daemon, or straight on the
replica file when none runs; ``backup`` copies the home into one file (beside a running daemon
or with none) and ``restore`` makes a new home, a new node, from one; ``hook`` prints a role's unread mail for Claude
Code and Codex hooks (exit 0 even when it fails, 1 for a usage error: never 2,
which would block the prompt); ``doctor`` checks the home, config, key, ports,
mDNS, seeds, peers and clocks and says what to fix; ``retention`` sets, shows or
clears the fleet's retention horizon (on the replica file). Every command takes
``--home DIR`` (default: ``$PEERD_HOME``, else the user data folder) and
``--json`` (machine-readable output; with ``--watch`` / ``--follow``, one JSON
object per line), before or after the command name.

Exit codes:
  0    success (also when ``--watch`` / ``--follow`` is stopped with Ctrl-C)
  1    the request failed: bad argument, unknown id, the daemon refused it
  2    usage error: unknown command or flag, missing or malformed argument
  3    no daemon is running for this home (``status``, ``peers``, ``stop``), or it stopped answering
  4    no usable home: none there (run ``peerd init``) for a command that works on the replica or
       ``mcp``; or a node whose config.toml is gone (``run``, ``init``, ``invite``, ``mcp --init``)
  5    ``peerd doctor`` found at least one problem
  130  interrupted (Ctrl-C) anywhere else

The package's modules: ``errors`` (exit codes), ``format`` (pure text
formatting), ``backends`` (the daemon's local API or the replica file),
``setup`` (opening a home without silent mistakes), ``commands`` (one
function per command), ``pairing`` (the pairing and membership commands,
with their parser), ``backup`` (``backup`` and ``restore``, with their
parser), ``retention`` (the retention command, with its parser) and ``parser``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from peerd.cli.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError
from peerd.errors import ConfigError, DaemonError
from replica import PeerdError


def undecodable(argv: Sequence[str]) -> str | None:
    """The first argument that is not valid UTF-8 (it arrives holding lone surrogates), if any."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return arg
    return None


def _split_globals(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the global options before the command, the command and what follows it)."""
    globals_: list[str] = []
    rest = list(words)
    while rest and (rest[0] in ("--json", "--home") or rest[0].startswith("--home=")):
        take = 2 if rest[0] == "--home" else 1
        globals_ += rest[:take]
        rest = rest[take:]
    return globals_, rest


def hook_argv(words: Sequence[str]) -> list[str] | None:
    """The arguments of ``peerd hook`` if that is the command (global options before it are
    moved after it), else None: the hook runs on every prompt and skips loading the rest."""
    globals_, rest = _split_globals(words)
    return [*rest[1:], *globals_] if rest[:1] == ["hook"] else None


def is_mcp(words: Sequence[str]) -> bool:
    """Whether the command is ``peerd mcp``: it starts with each MCP session, so it parses with a
    parser of its own command only and loads none of the others."""
    return _split_globals(words)[1][:1] == ["mcp"]


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    hook_args = hook_argv(argv)
    if hook_args is not None:  # it checks its own arguments (and never exits 2, which blocks a prompt)
        from peerd.cli.hook import leave  # noqa: PLC0415 - the hook's fast path
        from peerd.cli.hook import main as hook_main  # noqa: PLC0415

        leave(hook_main(hook_args))
    if (bad := undecodable(argv)) is not None:  # checked once here, so no command meets one
        print(f"peerd: argument {bad!a} is not valid UTF-8 text", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if is_mcp(argv):
        from peerd.cli.argparsing import mcp_parser as build_parser  # noqa: PLC0415 - MCP's fast path
    else:
        from peerd.cli.parser import build_parser  # noqa: PLC0415 - every other command's modules
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
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `peerd log --follow | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's exit flush quiet
        code = EXIT_OK
    sys.exit(code)


__all__ = ["main"]
