"""The local port's credentials as peerd keeps them: the secret beside the replica it guards, and
the words that tell a refused caller where that secret is.

Invariants:
* A home's local port is guarded by the home's ``local.token``; ``peerd mcp --transport http`` on
  a replica file outside a home by ``FILE.token`` beside it (as its node key is ``FILE.key``);
  in memory by a secret that lives as long as the process. A server makes its token when it is
  missing (``peerd.home.ensure_token``: owner-only from the first byte), never replaces one.
* The rules of who is admitted are ``mcp_server.localauth``'s; this module only feeds them the
  token and the sentences (``how``, ``relogin``), which name the token's file, never the token.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from mcp_server.localauth import LocalAuth
from peerd import home as homes
from replica import REPLICA_FILE

TOKEN_SUFFIX = ".token"


def token_path(db: Path) -> Path:
    """Where the secret of a server on the replica file ``db`` is kept: ``local.token`` beside a
    home's ``replica.db``, else ``<file>.token`` beside the file."""
    return db.with_name(homes.LOCAL_TOKEN) if db.name == REPLICA_FILE else db.with_name(db.name + TOKEN_SUFFIX)


def how_to_send(where: str) -> str:
    return (f"send the header Authorization: Bearer <token>, the token being {where}; peerd's own commands "
            "read it themselves")


def home_auth(home: Path, *, browser: Callable[[str], bool]) -> LocalAuth:
    """The daemon's credentials: the home's token (made if missing), and its dashboard's login links."""
    path = homes.local_token_path(home)
    login = f"peerd dashboard --home {shlex.quote(str(home))}"
    return LocalAuth(
        homes.ensure_token(path),
        how=(f"{how_to_send(f'the content of {path} (readable by the home owner only)')}; in a browser, open "
             f"the login link that `{login}` prints"),
        relogin=f"get a new login link with: {login}",
        browser=browser,
    )


def file_auth(path: Path) -> LocalAuth:
    """The credentials of ``peerd mcp --transport http`` on a replica file: the token in ``path``."""
    return LocalAuth(homes.ensure_token(path),
                     how=how_to_send(f"the content of {path} (readable by its owner only)"))


def memory_auth() -> LocalAuth:
    """The credentials of ``peerd mcp --transport http --in-memory``: a secret it prints once."""
    return LocalAuth(homes.new_token(), how=how_to_send("the one `peerd mcp` printed when it started"))


__all__ = ["file_auth", "home_auth", "memory_auth", "token_path"]
