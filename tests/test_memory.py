"""glibc's malloc arenas are limited in a daemon process (peerd.memory)."""

from __future__ import annotations

import platform
import subprocess
import sys

from peerd import memory


def test_limit_arenas_is_taken_by_glibc_on_linux() -> None:
    """On Linux with glibc, mallopt(M_ARENA_MAX) succeeds; elsewhere it is a no-op that says so."""
    code = "from peerd import memory; print(memory.limit_arenas(2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert out == str(glibc)
    assert (memory._glibc() is not None) == glibc
