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


def test_trim_gives_freed_pages_back_on_glibc() -> None:
    """After freeing most of many heap blocks, trim returns their pages: the process's RSS falls.
    Elsewhere than glibc it does nothing and says so."""
    code = """
from peerd import memory
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])
blocks = [bytearray(60_000) for _ in range(1500)]   # under the mmap threshold: on malloc's heap
for b in blocks:
    b[::4096] = b'x' * len(b[::4096])                # touch every page
kept = blocks[::50]                                  # a few stay: the heap cannot just shrink from its top
del blocks
before = rss()
took = memory.trim()
print(took, before - rss())
"""
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == str(glibc)
    if glibc:
        assert int(out[1]) > 40_000, f"RSS fell by only {out[1]} kB"  # most of the ~88 MB freed went back
