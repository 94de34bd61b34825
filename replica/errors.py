"""One error hierarchy for all of peerd, and the one table of how each error is told.

Invariants:
* Every error peerd raises on purpose is a ``PeerdError``, in one of two families: a
  ``LocalError`` (this machine's caller, file or state: a bad call changed nothing) or a
  ``RemoteError`` (another machine sent something bad, refused, or did not answer; none of
  its data was stored). Anything else is a bug.
* ``FACES`` is the one table from an error to what each door tells: the MCP error code (the
  text is ``"<code>: <message>"``), the HTTP status and the CLI exit code. ``face`` reads it
  (the most specific class listed wins); an error that carries its own ``status`` (a refusal
  that names the HTTP status its asker gets) or ``exit_code`` keeps it. Every door translates
  through ``face``, nowhere else.
* sqlite3 exceptions are translated at the boundary and never escape the public API; bytes
  that are not msgpack are ``Undecodable``, which each caller turns into its own error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
EXIT_NO_HOME = 4
EXIT_UNHEALTHY = 5
EXIT_INTERRUPTED = 130


class PeerdError(Exception):
    """Base of every error peerd raises on purpose."""


class LocalError(PeerdError):
    """The local caller asked for something invalid; nothing was changed."""


class InvalidArgument(LocalError, ValueError):
    """An argument is malformed, out of bounds or contradicts the state."""


class RolePinned(InvalidArgument):
    """A role is pinned to other nodes (``replica.pins``): this node may not send in its name."""

    def __init__(self, role: str, nodes: tuple[bytes, ...], sentence: str) -> None:
        self.role = role
        self.nodes = nodes
        super().__init__(sentence)


class NotFound(LocalError, LookupError):
    """An id (message, receipt, thread, agent) is unknown to this replica."""


class NoHome(LocalError):
    """The peerd home named does not exist (a typo in ``--home`` is never made into a new fleet)."""


class NoDaemon(LocalError):
    """No daemon runs for the home, or the one named did not answer."""


class TooLarge(InvalidArgument):
    """A request body or value is larger than the limit."""


class Closing(LocalError):
    """The server is shutting down: nothing more gets built or served."""


class Bug(LocalError):
    """A state this code has no rule for: a bug of ours, not the caller's or a peer's doing."""


class RemoteError(PeerdError):
    """A peer sent data that fails verification, refused, or did not answer; none of it was stored."""


class Refused(RemoteError):
    """A request from another machine that this one refuses; ``status`` is what the asker gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class InvalidOp(RemoteError):
    """An op failed verification (encoding, signature, origin, size, kind, body)."""

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        self.reason = reason
        self.index = index
        where = f"op #{index}: " if index is not None else ""
        super().__init__(f"invalid op: {where}{reason}")


class StoreError(LocalError):
    """The SQLite store failed (corrupt file, disk full, locked for too long)."""


class WouldWait(StoreError):
    """In a ``Store.no_wait`` block, a lock another thread or process holds would have made the
    call wait; nothing was written. The caller runs the call again where waiting is allowed (a
    worker thread): it never reaches a user."""


class Undecodable(RemoteError, ValueError):
    """Bytes are not the msgpack they should be (``codec.unpack``); callers translate
    it into their own error (an invalid op, a bad invite, a peer protocol error)."""

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(f"undecodable msgpack ({cause})")


@dataclass(frozen=True)
class Face:
    """How the doors tell one error: MCP code, HTTP status, CLI exit code."""

    code: str
    status: int
    exit: int


# Most specific first; a class not listed takes its nearest listed base's face.
FACES: tuple[tuple[type[PeerdError], Face], ...] = (
    (NotFound, Face("not_found", 404, EXIT_FAIL)),
    (TooLarge, Face("invalid_argument", 413, EXIT_FAIL)),
    (InvalidArgument, Face("invalid_argument", 400, EXIT_FAIL)),
    (NoHome, Face("no_home", 404, EXIT_NO_HOME)),
    (NoDaemon, Face("no_daemon", 503, EXIT_NO_DAEMON)),
    (Closing, Face("unavailable", 503, EXIT_FAIL)),
    (StoreError, Face("store_error", 500, EXIT_FAIL)),
    (Bug, Face("internal_error", 500, EXIT_FAIL)),
    (LocalError, Face("invalid_argument", 400, EXIT_FAIL)),
    (Refused, Face("refused", 403, EXIT_FAIL)),
    (InvalidOp, Face("invalid_op", 400, EXIT_FAIL)),
    (RemoteError, Face("remote_error", 502, EXIT_FAIL)),
    (PeerdError, Face("error", 500, EXIT_FAIL)),
)


def face(exc: PeerdError) -> Face:
    """The table's face for ``exc``, with the status or exit code it carries itself, if any."""
    found = next(f for cls, f in FACES if isinstance(exc, cls))
    status, code = getattr(exc, "status", None), getattr(exc, "exit_code", None)
    if isinstance(status, int):
        found = replace(found, status=status)
    if isinstance(code, int):
        found = replace(found, exit=code)
    return found


def told(exc: PeerdError) -> str:
    """An error as the MCP tools tell it: ``"<code>: <message>"``."""
    return f"{face(exc).code}: {exc}"
