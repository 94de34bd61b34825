"""The ``peerd`` command line.

Commands: ``init``, ``run``, ``stop``, ``mcp`` set up, serve and stop a node;
``invite``, ``join``, ``requests``, ``approve``, ``reject``, ``remove`` bring
machines into a fleet and take them out; ``status``, ``peers`` ask the running daemon, ``dashboard``
gives a one-time link that opens its dashboard in a browser; ``send``,
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
  3    no daemon is running for this home (``status``, ``peers``, ``dashboard``, ``stop``), or it stopped
       answering
  4    no usable home: none there (run ``peerd init``) for a command that works on the replica or
       ``mcp``; or a node whose config.toml is gone (``run``, ``init``, ``invite``, ``mcp --init``)
  5    ``peerd doctor`` found at least one problem
  130  interrupted (Ctrl-C) anywhere else

Invariants:
* One parser (``parser``): a table of commands, each naming the function that adds its flags, so
  a call loads the module of the command it names and no other (``hook`` runs on every prompt,
  ``mcp`` with every MCP session). Usage errors are told before anything runs.
* Every argument is UTF-8 text, checked once here, so no command meets one that is not.
* Errors reach the user as one line on stderr and the exit code above, never a traceback:
  each ``PeerdError``'s code is the one table's (``replica.errors.FACES``; ``CliError`` carries its own).

The package's modules: ``parser`` (the command table and the parser), ``arguments`` (the flags of
the commands in ``commands``), ``errors`` (exit codes), ``format`` (pure text formatting),
``backends`` (the daemon's local API or the replica file), ``setup`` (opening a home without
silent mistakes), ``commands`` (one function per command), ``pairing`` and ``joining`` (the
pairing and membership commands), ``backup`` (``backup`` and ``restore``), ``retention``, ``mcpserve``
(``mcp``) and ``hook``; each command module holds its commands' flags.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from peerd.cli.errors import EXIT_INTERRUPTED, EXIT_OK
from peerd.cli.parser import parser_for
from replica.errors import PeerdError, face


def undecodable(argv: Sequence[str]) -> str | None:
    """The first argument that is not valid UTF-8 (it arrives holding lone surrogates), if any."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = parser_for(argv)
    if (bad := undecodable(argv)) is not None:  # checked once here, so no command meets one
        parser.exit(parser.usage_exit, f"{parser.label}: argument {bad!a} is not valid UTF-8 text\n")
    args = parser.parse_args(argv)
    try:
        code = args.fn(args)
    except PeerdError as exc:  # CliError among them, with the code it carries
        print(f"peerd: {exc}", file=sys.stderr)
        code = face(exc).exit
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. `peerd log --follow | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's exit flush quiet
        code = EXIT_OK
    sys.exit(code)


__all__ = ["main"]
