"""Who may use the local port: a caller that proves it can read the home.

Invariants:
* A request is admitted by ``Authorization: Bearer <token>`` (exactly one Authorization header,
  the token compared in constant time), or, on the browser's paths only (``browser``, with GET
  or HEAD, and not from another site: ``Sec-Fetch-Site`` absent, ``same-origin`` or ``none``), by
  the session cookie a login link set. Nothing else admits: not the caller's address, not Host
  or Origin.
* A login code opens one session at most, and only within ``login_ttl`` seconds of being made;
  a session lasts ``session_ttl`` seconds. Both live in this process's memory only (a restart ends
  them), kept as SHA-256 digests, so a lookup takes the same time however close a guess is; at
  most ``MAX_OPEN`` of each are kept, the oldest dropped first.
* Time comes from an injected clock (monotonic seconds), so a test moves it instead of sleeping.
* Pure of I/O: the token is handed in (peerd reads it from the home's ``local.token``), and the
  rules are functions of header values that never raise.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

LOGIN_PATH = "/login"
LOGIN_TTL = 300.0  # seconds a login link works
SESSION_TTL = 24 * 3600.0  # seconds a browser session lasts
MAX_OPEN = 64  # login codes, and sessions, kept at once
SAFE_METHODS = frozenset({"GET", "HEAD"})
SAME_SITE_FETCHES = frozenset({"same-origin", "none"})
COOKIE_PREFIX = "peerd-session-"


def cookie_name(port: int | None) -> str:
    """The session cookie of the server on ``port``: browsers send a cookie to every port of a
    host, so each port's has a name of its own."""
    return f"{COOKIE_PREFIX}{port or 0}"


def bearer(values: list[str]) -> str | None:
    """The token of the one ``Authorization: Bearer <token>`` header, else None."""
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def cookie(values: list[str], name: str) -> str | None:
    """The value of cookie ``name`` in the request's Cookie headers (the first one), else None."""
    for header in values:
        for pair in header.split(";"):
            key, sep, value = pair.strip().partition("=")
            if sep and key == name:
                return value.strip().strip('"')
    return None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


class _Expiring:
    """Secrets (as digests) with a deadline each; the oldest are dropped past ``MAX_OPEN``."""

    def __init__(self) -> None:
        self._until: OrderedDict[bytes, float] = OrderedDict()

    def add(self, secret: str, until: float) -> None:
        self._until[_digest(secret)] = until
        while len(self._until) > MAX_OPEN:
            self._until.popitem(last=False)

    def live(self, secret: str, now: float) -> bool:
        until = self._until.get(_digest(secret))
        return until is not None and now < until

    def take(self, secret: str, now: float) -> bool:
        """Whether ``secret`` was live; it is gone afterwards either way."""
        until = self._until.pop(_digest(secret), None)
        return until is not None and now < until


@dataclass
class Session:
    """A browser session a login code opened: the cookie's value and how long it lasts."""

    value: str
    max_age: int


@dataclass
class LocalAuth:
    """The local port's credentials: the home's token, login codes and browser sessions.

    ``how`` tells a refused caller how to authenticate (where the token is); ``relogin`` how to
    get a new login link; ``browser(path)`` says which paths a browser session may read."""

    token: str
    how: str = "send Authorization: Bearer <the token of this server>"
    relogin: str = "ask for a new login link"
    browser: Callable[[str], bool] = lambda _path: False
    clock: Callable[[], float] = time.monotonic
    login_ttl: float = LOGIN_TTL
    session_ttl: float = SESSION_TTL
    _codes: _Expiring = field(default_factory=_Expiring, init=False, repr=False)
    _sessions: _Expiring = field(default_factory=_Expiring, init=False, repr=False)

    def __post_init__(self) -> None:
        self._token = self.token.encode("utf-8", "surrogatepass")

    def __repr__(self) -> str:  # never the token
        return "LocalAuth(...)"

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._token)

    def session_ok(self, value: str | None) -> bool:
        return value is not None and self._sessions.live(value, self.clock())

    def browser_ok(self, method: str, path: str, fetch_site: str | None) -> bool:
        """Whether a session cookie may admit this request at all."""
        return method in SAFE_METHODS and self.browser(path) and (fetch_site is None or
                                                                  fetch_site in SAME_SITE_FETCHES)

    def new_login(self) -> str:
        """A one-time login code, good for ``login_ttl`` seconds."""
        code = secrets.token_urlsafe(24)
        self._codes.add(code, self.clock() + self.login_ttl)
        return code

    def redeem(self, code: str | None) -> Session | None:
        """A new session for a live login code (which is then used up), else None."""
        now = self.clock()
        if code is None or not self._codes.take(code, now):
            return None
        value = secrets.token_urlsafe(32)
        self._sessions.add(value, now + self.session_ttl)
        return Session(value, int(self.session_ttl))


__all__ = ["LOGIN_PATH", "LOGIN_TTL", "SESSION_TTL", "LocalAuth", "Session", "bearer", "cookie", "cookie_name"]
