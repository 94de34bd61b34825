"""Exit codes of ``peerd`` and the error a command raises to end with one.

Invariants: every exit code the docs name is defined here once; a command
reports a failure by raising ``CliError`` (message for stderr, exit code),
never by printing and exiting itself.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
EXIT_NO_HOME = 4
EXIT_UNHEALTHY = 5
EXIT_INTERRUPTED = 130


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code
