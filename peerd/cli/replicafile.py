"""What the commands that work on the replica file itself share (``peerd roles``, ``role``,
``retention``, ``guard``, ``acks``, ``leases``): opening it, and printing a result.

Invariants:
* A home that does not exist is exit 4 with the one sentence every such command says; nothing is
  created there (a typo must not become a new fleet).
* The replica is loaded only when a command opens it, so importing this module stays cheap.
* ``--json`` prints the data itself; the text form is the caller's rendering of the same data.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from peerd import home as homes
from peerd.cli.errors import EXIT_NO_HOME, CliError


@contextmanager
def open_replica(args: argparse.Namespace) -> Iterator[Any]:
    """The replica of ``args.home``, open for this command; exit 4 if there is none."""
    from replica import open_home  # noqa: PLC0415 - loads the store only for the commands that need it

    home = homes.resolve_home(args.home)
    if not homes.replica_path(home).exists():
        raise CliError(f"no peerd home at {home} (create one with: peerd init, or give your node's --home)",
                       EXIT_NO_HOME)
    with open_home(home) as rep:
        yield rep


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """``data`` as JSON with ``--json``, else ``text``."""
    print(json.dumps(data, indent=2, default=str) if args.json else text, flush=True)
