"""``python -m mcp_server --home DIR [--role R] [--instance I]``: the stdio MCP server.

``peerd mcp`` runs the same ``run_stdio``; this entry point exists so the
server can be started (and tested) without the daemon's CLI.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mcp_server.stdio import run_stdio
from replica import REPLICA_FILE


def _nonempty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value.strip()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mcp_server", description="peerd MCP server over stdio")
    parser.add_argument("--home", type=Path, default=os.environ.get("PEERD_HOME"),
                        help="peerd home folder holding the replica (default: $PEERD_HOME)")
    parser.add_argument("--role", type=_nonempty, help="role this session speaks for")
    parser.add_argument("--instance", type=_nonempty, help="instance id of this session's role")
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
