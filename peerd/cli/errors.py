"""Exit codes of ``peerd`` and the error a command raises to end with one.

Invariants: every exit code the docs name is defined here once; a command
reports a failure by raising ``CliError`` (message for stderr, exit code),
never by printing and exiting itself.
"""

from __future__ import annotations

from replica.errors import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_NO_DAEMON,
    EXIT_NO_HOME,
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    LocalError,
)

__all__ = ["EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_NO_DAEMON", "EXIT_NO_HOME", "EXIT_OK", "EXIT_UNHEALTHY",
           "EXIT_USAGE", "CliError"]


class CliError(LocalError):
    """A command's failure: its message for stderr and the exit code it ends with."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = code
