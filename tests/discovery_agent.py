"""Run one MdnsSource and print what it sees as JSON lines (for namespace tests).

Each stdout line is one JSON object with ``event`` and ``t`` (seconds since
``MdnsSource.start`` was called):

- ``{"event": "started", "active": bool, "problem": str | null}``
- ``{"event": "announced"}`` once our own advert passed probing and is registered
- ``{"event": "found", "node_id", "host", "port", "addresses", "source"}``
- ``{"event": "gone", "node_id"}``
- ``{"event": "stopped"}`` after SIGTERM/SIGINT made the source say goodbye.

Log records go to stderr as ``<logger> <LEVEL> <message>``. ``--block-5353``
first binds UDP 5353 without sharing it, to play a conflicting program.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from discovery import MdnsSource, PeerCandidate


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--port", type=int, default=7400)
    parser.add_argument("--proto", type=int, default=1)
    parser.add_argument("--interfaces", default="all", help="all, default or a comma list")
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--block-5353", action="store_true")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    t0 = time.monotonic()

    def emit(event: str, **fields: Any) -> None:
        record = {"event": event, "t": round(time.monotonic() - t0, 4), **fields}
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    def found(candidate: PeerCandidate) -> None:
        emit(
            "found",
            node_id=candidate.node_id,
            host=candidate.host,
            port=candidate.port,
            addresses=list(candidate.addresses),
            source=candidate.source,
        )

    interfaces = args.interfaces if args.interfaces in ("all", "default") else (
        args.interfaces.split(",")
    )
    source = MdnsSource(
        args.node_id,
        args.fleet,
        args.port,
        (args.proto,),
        interfaces,
        poll_interval=args.poll_interval,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    t0 = time.monotonic()
    await source.start(found, lambda node_id: emit("gone", node_id=node_id))
    emit("started", active=source.active, problem=source.problem)
    announced = asyncio.create_task(_announced(source, emit))
    await stop.wait()
    announced.cancel()
    await source.stop()
    emit("stopped")


async def _announced(source: MdnsSource, emit: Callable[..., None]) -> None:
    await source.wait_announced()
    emit("announced")


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("discovery").setLevel(logging.INFO)
    blocker = None
    if args.block_5353:
        blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        blocker.bind(("", 5353))
    try:
        asyncio.run(_main(args))
    finally:
        if blocker is not None:
            blocker.close()


if __name__ == "__main__":
    main()
