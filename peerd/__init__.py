"""peerd daemon and CLI.

Invariants: importing the package loads nothing (every command and the daemon import what
they use, so the quick commands start fast); ``version_text`` names every version a peer or a
replica file is judged by (the release, the wire, the op format and kinds, the replica schema).
"""

from __future__ import annotations


def version_text() -> str:
    """What ``peerd --version`` prints: the release, and the wire, op and replica versions it speaks."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - only when asked

    from peerd.protocol import versions  # noqa: PLC0415
    from replica import ops, schema  # noqa: PLC0415

    try:
        release = version("peerd")
    except PackageNotFoundError:  # run from a folder that was never installed
        release = "unknown"
    kinds = " ".join(sorted(ops.KNOWN_KINDS))
    return (f"peerd {release}\n"
            f"wire: {versions.describe(versions.SPOKEN)} (uses the highest a peer also speaks)\n"
            f"ops: format {ops.VERSION}, level {ops.OP_LEVEL}, kinds {kinds}; ops of newer kinds are kept "
            f"and relayed\n"
            f"replica schema: v{schema.LATEST}")
