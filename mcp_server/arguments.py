"""The MCP server's command-line flags, defined once: ``python -m mcp_server`` parses with them, and
``peerd mcp`` adds the same definitions to its subcommand (it may import us; we may not import it).

Invariants:
* One definition of each flag's name, values and help, so the two command lines cannot drift
  apart; AgentMsgs' own (``--transport stdio|http``, ``--db-path FILE`` or ``--in-memory``) is
  among them as ``agentmsgs-mcp`` spells it, and ``--db-path`` and ``--in-memory`` exclude each other.
* A name given to ``--role`` or ``--instance`` is stripped and never empty (an empty one is a usage
  error), so a session is either bound to a real name or not bound.
* Imports only argparse: reading a command line loads neither the MCP SDK nor a replica.
"""

from __future__ import annotations

import argparse

DEFAULT_HTTP_PORT = 8000


def nonempty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value.strip()


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    """Which replica to serve, and how: AgentMsgs' ``--transport``, ``--db-path``, ``--in-memory``,
    and the HTTP endpoint's ``--host`` and ``--port``."""
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio (default), or streamable HTTP on 127.0.0.1 at /mcp")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db-path", metavar="FILE",
                       help="serve this replica file (created if missing, its node key kept beside it)")
    where.add_argument("--in-memory", action="store_true",
                       help="serve a replica in this process's memory (shared with nobody, gone on exit)")
    p.add_argument("--host", help="with --transport http: 127.0.0.1 (default) or localhost")
    p.add_argument("--port", type=int,
                   help=f"with --transport http: the port (default {DEFAULT_HTTP_PORT}; 0 picks a free one)")


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    """The role and instance a stdio session is bound to (HTTP sessions bind themselves)."""
    p.add_argument("--role", type=nonempty,
                   help="stdio: bind this session to a role (used when a tool call omits it)")
    p.add_argument("--instance", type=nonempty, help="stdio: bind this session to an instance id")


TOOL_SET_NAMES = ("all", "vantage", "agentmsgs")  # mcp_server.toolsets.TOOL_SETS (a test holds them equal)


def add_tools_argument(p: argparse.ArgumentParser) -> None:
    """Which tools the server offers (an HTTP session may ask for another set by header or query)."""
    p.add_argument("--tools", choices=TOOL_SET_NAMES, default="all",
                   help="offer only VantagePeers' tools (vantage), AgentMsgs' (agentmsgs), or every tool (all, "
                        "the default); HTTP sessions may ask with the X-Peerd-Tools header or ?tools=")


def add_push_arguments(p: argparse.ArgumentParser) -> None:
    """What a bound stdio session gets pushed (HTTP sessions say it by headers)."""
    p.add_argument("--from", dest="push_from", action="append", metavar="ROLE",
                   help="stdio: push only mail from this role or agent (repeatable; the rest waits for check_messages)")
    p.add_argument("--no-push", action="store_true",
                   help="stdio: no Claude Code channel pushes (for clients without channels that use `peerd hook`)")
