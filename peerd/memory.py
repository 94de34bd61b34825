"""The daemon's resident memory: glibc's malloc told to keep few arenas, and to give back what a
catch-up freed.

Invariants:
* Linux with glibc only: elsewhere (another libc, another OS) every function does nothing and
  returns False; nothing here can fail a daemon.
* ``limit_arenas`` runs before the process starts threads: glibc gives each thread that meets
  a busy arena one of its own (up to 8 per CPU), and each keeps the pages it once used. A
  daemon's worker threads (``asyncio.to_thread``, the change feed, uvicorn) would otherwise
  each hold megabytes that nothing returns.
* ``trim`` returns to the system the free pages malloc keeps, in every arena: a long catch-up
  frees pages of ops and pages of SQLite's cache that malloc would otherwise keep for reuse.
  It walks the arenas under their locks: call it off the event loop, after work, not per op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
ARENAS = 2  # the event loop's thread and one for every other thread


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - present only in glibc
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most ``arenas`` malloc arenas for this process; True if glibc took it."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(arenas)))


def trim() -> bool:
    """Give malloc's free pages back to the system (``malloc_trim(0)``); True if any went back."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(ctypes.c_size_t(0)))
