"""Where ``peerd run`` writes its log, so that the first screen holds only the ready block: the file
``peerd.log`` in the home, or standard error with ``-v``.

Invariants:
* The log file and its rotated copies are created owner-only (0600), as everything in a home; the
  file never grows past ``MAX_BYTES``, and ``BACKUPS`` older files are kept (``peerd.log.1``, ...).
* ``setup`` gives the root logger exactly one handler (the file's or stderr's) at the level asked;
  nothing else in peerd adds handlers. ``close`` lets the file go (before a failed start takes back
  the home it made).
"""

from __future__ import annotations

import logging
import os
import sys
from io import TextIOWrapper
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_FILE = "peerd.log"
MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class OwnerOnlyFile(RotatingFileHandler):
    """A rotating log file whose every file is made owner-only as it is created."""

    def _open(self) -> TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)


def log_path(home: Path) -> Path:
    return home / LOG_FILE


def setup(home: Path, level: str, *, verbose: bool) -> logging.Handler:
    """Send the process's log to the home's file, or (``verbose``) to stderr; the handler."""
    handler: logging.Handler
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = OwnerOnlyFile(log_path(home), maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def close(handler: logging.Handler) -> None:
    logging.getLogger().removeHandler(handler)
    handler.close()
