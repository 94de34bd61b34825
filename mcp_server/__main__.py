"""``python -m mcp_server --home DIR [--role R] [--instance I]``: the stdio MCP server.

``peerd mcp`` runs the same ``serve_stdio`` (and accepts AgentMsgs' command line besides); this
entry point exists so the server can be started (and tested) without the daemon's CLI.

Invariants:
* It never imports peerd: its flags are ``mcp_server.arguments``' (the definitions ``peerd mcp``
  adds to its own), and the replica is opened by ``replica`` alone.
* It serves only a home that holds a replica: a missing ``--home`` (and no ``PEERD_HOME``), or a
  folder with no ``replica.db``, is a usage error (exit 2), never a new empty replica.
* Ctrl-C ends it with exit code 130; a client closing stdin ends it with 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mcp_server.arguments import add_session_arguments
from mcp_server.stdio import run_stdio
from replica import REPLICA_FILE


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcp_server", description="peerd MCP server over stdio")
    parser.add_argument("--home", type=Path, default=os.environ.get("PEERD_HOME"),
                        help="peerd home folder holding the replica (default: $PEERD_HOME)")
    add_session_arguments(parser)
    args = parser.parse_args(argv)
    if args.home is None:
        parser.error("--home is required (or set PEERD_HOME)")
    if not (Path(args.home) / REPLICA_FILE).exists():  # a wrong or lost home must not become an empty replica
        parser.error(f"no peerd replica in {args.home}; give the home of a node (create one with: peerd init)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        asyncio.run(run_stdio(Path(args.home), args.role, args.instance))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
