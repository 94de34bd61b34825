"""What a command imported: run it under ``python -X importtime`` and read the module names.

Used by the tests that keep the quick commands (``send``, ``inbox``, ``status``, ``hook``)
free of the MCP stack, which only ``peerd mcp`` and the daemon's ``/mcp`` need.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.daemons import PEERD

# The MCP SDK and what only it brings in (the SDK's types, validation models, its HTTP server).
MCP_STACK = ("mcp", "mcp_types", "mcp_server.server", "mcp_server.channel", "mcp_server.schemas", "pydantic",
             "pydantic_core", "starlette", "uvicorn", "sse_starlette")


def run_traced(argv: list[str], home: Path, *, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``peerd ARGV --home HOME`` under ``python -X importtime`` (its import lines go to stderr)."""
    cmd = [str(PEERD.parent / "python"), "-X", "importtime", str(PEERD), *argv, "--home", str(home)]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)


def imported(stderr: str) -> set[str]:
    """The modules named in ``-X importtime`` output."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def among(modules: set[str], banned: tuple[str, ...]) -> set[str]:
    """The ``modules`` that are, or lie inside, one of the ``banned`` packages."""
    return {m for m in modules if any(m == b or m.startswith(b + ".") for b in banned)}
