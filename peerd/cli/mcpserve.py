"""``peerd mcp``: the MCP tools over stdio or streamable HTTP, on a home's replica, a
replica file or a replica in memory. It accepts AgentMsgs' command line
(``agentmsgs-mcp --transport stdio|http --db-path FILE | --in-memory``).

Invariants:
* One replica per process: the home's (default), the file given by
  ``--db-path`` (created if missing, its node key beside it; a home's
  ``replica.db`` is that home's node), or a process-local one in memory
  (``--in-memory``: shared with no other process, gone on exit).
* Flags that contradict each other are usage errors (exit 2), found before
  anything is opened (``plan``, a pure function of the arguments).
* A home is served only if it is one (``config.toml``): a missing or wrong
  home is exit 4, never a new empty replica in no fleet, unless ``--init``
  asks for a new home (``peerd.cli.setup.open_fleet``).
* HTTP listens on 127.0.0.1 only, through peerd's one local server and its
  guard; sessions bind a role per request (header or query). It answers only
  callers that send its token (``peerd.localauth``: a home's ``local.token``,
  ``FILE.token`` beside a replica file, or, in memory, a secret printed once); it
  says where the token is, on the line before the one naming its URL.
* The home (or the replica file and what goes with it) is made owner-only as it is opened.
* Over stdio with ``--role``, the session is a Claude Code channel (new mail
  pushed as it lands; ``--from``, ``--no-push``); over HTTP each session sets
  that by its headers.
* What waits (``wait`` on check_messages and poll, pushes) learns of other processes'
  writes through one change-feed source: the home's daemon stream when one
  runs (``DaemonLink``), else a watch on the file; none in memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mcp_server.arguments import (
    DEFAULT_HTTP_PORT,
    add_push_arguments,
    add_replica_arguments,
    add_session_arguments,
    add_tools_argument,
)
from peerd import home as homes
from peerd.cli.errors import EXIT_USAGE, CliError
from peerd.cli.setup import home_flag, open_fleet
from peerd.config import Config, load_config
from replica import REPLICA_FILE, Replica, key_path, open_file, open_home
from replica.feed import FileWatch, Source
from replica.routing import DEFAULT_BROADCAST_HISTORY_MS

Transport = Literal["stdio", "http"]
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Plan:
    """What ``peerd mcp`` will serve: a transport, and a home, a file or memory."""

    transport: Transport
    home: Path | None = None  # serve this home's replica
    db_path: Path | None = None  # serve this replica file
    port: int = DEFAULT_HTTP_PORT
    host: str = "127.0.0.1"
    role: str | None = None
    instance: str | None = None
    push: bool = True  # stdio: a bound session is a Claude Code channel
    push_from: tuple[str, ...] = ()
    tools: str = "all"  # the tool set offered (mcp_server.toolsets)


def _usage(message: str) -> CliError:
    return CliError(message, EXIT_USAGE)


def plan(args: argparse.Namespace, resolve_home: Path) -> Plan:
    """Check the flags together; ``resolve_home`` is the home the flags would default to."""
    if args.home and (args.db_path or args.in_memory):
        raise _usage("give --home, --db-path or --in-memory, not more than one")
    if args.init and (args.db_path or args.in_memory):
        raise _usage("--init makes a home; a --db-path file or --in-memory replica is created anyway")
    if args.transport == "stdio" and (args.host is not None or args.port is not None):
        raise _usage("--host and --port apply to --transport http")
    if args.transport == "http":
        if args.host is not None and args.host.strip().lower() not in LOOPBACK_NAMES:
            raise _usage(f"--host must be 127.0.0.1 or localhost (the MCP endpoint is local only), not {args.host!r}")
        if args.role is not None or args.instance is not None:
            raise _usage("over HTTP each session binds its role itself (X-Peerd-Role header or /mcp?role=); "
                         "--role and --instance apply to --transport stdio")
        if args.push_from or args.no_push:
            raise _usage("over HTTP each session sets its pushes itself (X-Peerd-Push-From, X-Peerd-Push: off); "
                         "--from and --no-push apply to --transport stdio")
    port = DEFAULT_HTTP_PORT if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise _usage(f"--port must be between 0 and 65535, got {port}")
    db = Path(args.db_path).expanduser().absolute() if args.db_path else None
    home = None if args.in_memory or db is not None else resolve_home
    host = args.host.strip().lower() if args.host else "127.0.0.1"
    return Plan(args.transport, home, db, port, host, args.role, args.instance, not args.no_push,
                tuple(args.push_from or ()), args.tools)


def home_of(p: Plan) -> Path | None:
    """The peerd home whose node this plan serves: the home, or the folder of a home's replica.db."""
    if p.home is not None:
        return p.home
    if p.db_path is not None and p.db_path.name == REPLICA_FILE:
        return p.db_path.parent
    return None


def open_replica(p: Plan, history_ms: int = DEFAULT_BROADCAST_HISTORY_MS) -> tuple[Replica, Source | None]:
    """The replica to serve and how its change feed hears of other processes' writes."""
    from peerd.feedlink import DaemonLink  # noqa: PLC0415 - only this command needs it

    home = home_of(p)
    if home is not None:
        homes.tighten(home)
    elif p.db_path is not None:
        homes.tighten_paths(replica_files(p.db_path))
    if p.home is not None:
        replica = open_home(p.home, broadcast_history_ms=history_ms)
    elif p.db_path is not None:
        replica = open_file(p.db_path, broadcast_history_ms=history_ms)
    else:
        return Replica.open(":memory:"), None
    return replica, DaemonLink(home) if home is not None else FileWatch(replica.path)


def replica_files(db: Path) -> list[Path]:
    """A replica file and what goes with it: its -wal and -shm, its node key, its token."""
    from peerd.localauth import token_path  # noqa: PLC0415

    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), key_path(db), token_path(db)]


def config_of(p: Plan, args: argparse.Namespace) -> Config | None:
    """The config of the home served: a home must be one (or ``--init`` makes it); a replica
    file takes its home's config if it is a home's ``replica.db``."""
    if p.home is not None:
        return open_fleet(p.home, flag=home_flag(args.home), create=args.init)[0]
    home = home_of(p)
    cfg = homes.config_path(home) if home is not None else None
    return load_config(cfg) if cfg is not None and cfg.exists() else None


def mcp_arguments(s: argparse.ArgumentParser) -> None:
    """``peerd mcp``'s flags: the MCP server's own (``mcp_server.arguments``), and ``--init``."""
    add_replica_arguments(s)
    add_session_arguments(s)
    s.add_argument("--init", action="store_true", help="create the home (a new fleet) if there is none")
    add_push_arguments(s)
    add_tools_argument(s)
    s.set_defaults(fn=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415 - keeps quick commands quick to start

    p = plan(args, homes.resolve_home(args.home))
    cfg = config_of(p, args)
    fleet = None if cfg is None else cfg.fleet_id
    replica, source = open_replica(p, DEFAULT_BROADCAST_HISTORY_MS if cfg is None else cfg.broadcast_history_ms)
    try:
        if p.transport == "stdio":
            from mcp_server.stdio import serve_stdio  # noqa: PLC0415 - heavy import, only for this command

            asyncio.run(serve_stdio(replica, source, p.role, p.instance, fleet_id=fleet, push=p.push,
                                    push_from=p.push_from, tools=p.tools))
        else:
            asyncio.run(serve_http(replica, source, p.port, fleet, host=p.host, json_out=args.json, tools=p.tools,
                                   token_file=token_file(p)))
    finally:
        replica.close()
    return 0


def token_file(p: Plan) -> Path | None:
    """Where the token of an HTTP server of this plan is kept (None: in memory only)."""
    from peerd.localauth import token_path  # noqa: PLC0415

    home = home_of(p)
    if home is not None:
        return homes.local_token_path(home)
    return None if p.db_path is None else token_path(p.db_path)


async def serve_http(replica: Replica, source: Source | None, port: int, fleet_id: str | None, *,
                     host: str = "127.0.0.1", json_out: bool = False, tools: str = "all",
                     token_file: Path | None = None) -> None:
    """Serve MCP streamable HTTP at ``http://127.0.0.1:<port>/mcp`` until SIGINT or SIGTERM, to
    callers that send the token kept in ``token_file`` (made if missing; None: a token of this
    process alone, printed once)."""
    import asyncio  # noqa: PLC0415 - keeps quick commands quick to start
    import signal  # noqa: PLC0415

    from mcp_server.wiring import wired  # noqa: PLC0415
    from peerd.errors import DaemonError  # noqa: PLC0415
    from peerd.local import LocalServer, build_app  # noqa: PLC0415
    from peerd.localauth import file_auth, memory_auth  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    async with wired(replica, source) as wiring:
        try:
            for sig in signals:
                loop.add_signal_handler(sig, stop.set)
            auth = memory_auth() if token_file is None else file_auth(token_file)
            app = build_app([], wiring.mcp_http(fleet_id=lambda: fleet_id, tools=tools), auth=auth)
            try:
                server = LocalServer(app, port)
                await server.start()
            except DaemonError:
                raise CliError(f"cannot serve MCP on 127.0.0.1:{port}: the port is taken or not allowed; "
                               "pick another with --port (0 picks a free one)") from None
            try:
                announce(f"http://{host}:{server.port}/mcp", replica.node_id, json_out=json_out,
                         token_file=token_file, token=auth.token)
                await stop.wait()
            finally:
                wiring.waiter.close()  # calls waiting for messages return now, so the server stops at once
                await server.stop()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)


def announce(url: str, node_id: str, *, json_out: bool, token_file: Path | None, token: str) -> None:
    """Say where the endpoint listens and how a client authenticates, on stdout: text (the token's
    file, or the token itself when it lives in memory only, then the URL), or one JSON object."""
    if json_out:
        where = {"token_file": str(token_file)} if token_file is not None else {"token": token}
        print(json.dumps({"mcp_url": url, "node_id": node_id, **where}), file=sys.stdout, flush=True)
        return
    secret = f"<the content of {token_file}>" if token_file is not None else token
    print(f"peerd mcp: clients send the header Authorization: Bearer {secret}", file=sys.stdout)
    print(f"peerd mcp: serving MCP at {url}", file=sys.stdout, flush=True)
