"""The daemon's error hierarchy.

Invariants:
- Every error the daemon raises on purpose is a `DaemonError`; library exceptions
  (nacl, aiohttp, sqlite, tomllib, msgpack) are translated at the boundary where they
  occur and never leak through `peerd` functions.
- Errors are split by who is at fault: `ConfigError` is a `LocalError` (the user or the config
  file; a bad local API call is the replica's `InvalidArgument` / `NotFound`), `PeerError`
  and its subclasses `TransportError` and `SealError` are `RemoteError`s (another machine sent
  something bad or did not answer). How each is told is `replica.errors.FACES`.
- Messages are written for the person reading them: they name the file, key or peer
  involved and, where one exists, the way out.
"""

from __future__ import annotations

from replica.errors import LocalError, PeerdError, RemoteError


class DaemonError(PeerdError):
    """Base of every error the daemon raises on purpose."""


class ConfigError(DaemonError, LocalError):
    """The home folder or `config.toml` is missing, malformed or inconsistent.

    Also raised for a bad fleet key, seed address or invite token typed by the user.
    """


class PeerError(DaemonError, RemoteError):
    """A peer misbehaved or could not be reached (a remote error).

    `peer` names the peer (URL or host:port) when known.
    """

    def __init__(self, message: str, *, peer: str | None = None) -> None:
        super().__init__(message if peer is None else f"{peer}: {message}")
        self.peer = peer


class TransportError(PeerError):
    """A request got no answer: the peer could not be reached, was too slow, sent too much,
    or does not answer like a peer port.

    `kind` says which (`timeout`, `refused`, `unreachable`, `not-peerd`, `too-large`) and
    `detail` gives the underlying reason, for callers that word it themselves (`peerd doctor`).
    """

    def __init__(self, message: str, *, peer: str | None = None, kind: str, detail: str = "") -> None:
        super().__init__(message, peer=peer)
        self.kind = kind
        self.detail = detail or message


class SealError(PeerError):
    """A sealed body could not be opened: wrong fleet key, tampered or truncated.

    A `PeerError` because such a body always comes from the other end of a connection.
    """
