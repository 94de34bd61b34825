"""A member's pairing desk: pending approval requests, one-time codes and PAKE sessions (pure).

Everything here is a value changed by methods that take the time as an argument; the host
(``peerd.pairing.host``) adds the I/O (waking a waiting joiner, writing the admit op).

Invariants:
- Bounded: at most ``max_pending`` requests (``per_source`` from one address), ``max_codes``
  codes, ``max_sessions`` PAKE sessions; an address making requests faster than the limiter allows
  is refused (429). Nothing a stranger sends can grow the desk past these bounds.
- Everything expires: a request after ``ask_ttl`` s, a code after its own time, a session after
  ``session_ttl`` s; ``sweep`` drops them, remembering why (``gone``, bounded) so a late joiner is
  told "expired" rather than "unknown".
- A request shows its verification code only once the joiner revealed the nonce it committed to;
  ``approve`` and ``reject`` find it by that code, and refuse when two pending requests show the
  same one (someone is trying to pass for another machine).
- A one-time code is used at most once and tried at most ``max_attempts`` times (each PAKE
  session is one try, right or wrong); then it is gone for good.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from peerd.pairing import codes
from replica.errors import Refused

ID_BYTES = 16
ASK_TTL = 600.0
SESSION_TTL = 60.0
CODE_TTL = 600.0
MAX_ATTEMPTS = 3
GONE_KEPT = 256


class DeskError(Refused):
    """A request the desk refuses: ``status`` is the HTTP status the joiner gets."""


@dataclass
class Ask:
    """A joiner asking to be let in, waiting for a person's approval on this member."""

    id: bytes
    joiner: bytes
    name: str
    source: str
    commitment: bytes
    nonce_a: bytes
    created: float
    expires: float
    code: str | None = None  # six digits, once the joiner revealed its nonce
    state: str = "new"  # new -> waiting -> approved | rejected
    answer: bytes | None = None  # the boxed payload, once approved

    def view(self, now: float) -> dict[str, object]:
        return {"code": self.code, "name": self.name, "node_id": self.joiner.hex(), "from": self.source,
                "age": round(now - self.created, 1), "expires_in": round(self.expires - now, 1)}


@dataclass
class OneTimeCode:
    code: str
    created: float
    expires: float
    attempts: int = 0

    @property
    def id(self) -> str:
        return codes.split_code(self.code)[0]


@dataclass
class Session:
    """A PAKE exchange under way for one code."""

    id: bytes
    code_id: str
    joiner: bytes
    name: str
    confirm_b: bytes
    confirm_a: bytes
    box_key: bytes
    expires: float


@dataclass
class Limiter:
    """Token buckets per source address: ``burst`` requests at once, then ``rate`` per second."""

    burst: float = 10.0
    rate: float = 0.2
    max_sources: int = 1024
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)

    def allow(self, source: str, now: float) -> bool:
        tokens, last = self._buckets.pop(source, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return ok


@dataclass
class Desk:
    max_pending: int = 16
    per_source: int = 3
    max_codes: int = 16
    max_sessions: int = 16
    ask_ttl: float = ASK_TTL
    session_ttl: float = SESSION_TTL
    max_attempts: int = MAX_ATTEMPTS
    limiter: Limiter = field(default_factory=Limiter)
    asks: dict[bytes, Ask] = field(default_factory=dict)
    codes: dict[str, OneTimeCode] = field(default_factory=dict)  # by code id
    sessions: dict[bytes, Session] = field(default_factory=dict)
    gone: OrderedDict[bytes | str, str] = field(default_factory=OrderedDict)  # id -> why it is gone

    # -- housekeeping -----------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        for ask in [a for a in self.asks.values() if a.expires <= now]:
            self._forget(ask.id, "the request expired before anyone approved it")
            del self.asks[ask.id]
        for code in [c for c in self.codes.values() if c.expires <= now]:
            self._forget(code.id, "the code expired; make a new one with `peerd invite --code`")
            del self.codes[code.id]
        for sid in [s.id for s in self.sessions.values() if s.expires <= now]:
            del self.sessions[sid]

    def _forget(self, key: bytes | str, why: str) -> None:
        self.gone[key] = why
        self.gone.move_to_end(key)
        while len(self.gone) > GONE_KEPT:
            self.gone.popitem(last=False)

    def check_rate(self, source: str, now: float) -> None:
        if not self.limiter.allow(source, now):
            raise DeskError(429, "too many join requests from this address; wait a minute and try again")

    def _missing(self, key: bytes | str, what: str) -> DeskError:
        why = self.gone.get(key)
        return DeskError(410, why) if why else DeskError(404, f"no such {what} on this member")

    # -- approval requests ------------------------------------------------------------------

    def open_ask(self, joiner: bytes, name: str, source: str, commitment: bytes, now: float) -> Ask:
        self.sweep(now)
        if len(self.asks) >= self.max_pending:
            raise DeskError(429, "this member has too many join requests waiting; try again later")
        if sum(1 for a in self.asks.values() if a.source == source) >= self.per_source:
            raise DeskError(429, "too many join requests from this address are waiting already")
        ask = Ask(secrets.token_bytes(ID_BYTES), joiner, name, source, commitment, codes.nonce(), now,
                  now + self.ask_ttl)
        self.asks[ask.id] = ask
        return ask

    def ask(self, ask_id: bytes, now: float) -> Ask:
        self.sweep(now)
        found = self.asks.get(ask_id)
        if found is None:
            raise self._missing(ask_id, "join request")
        return found

    def reveal(self, ask_id: bytes, nonce_b: bytes, fleet: str, member: bytes, now: float) -> Ask:
        """The joiner's nonce: checked against its commitment, it fixes the verification code."""
        ask = self.ask(ask_id, now)
        if ask.state != "new":
            raise DeskError(409, "this request already has its verification code")
        if not codes.same(codes.commit(ask.joiner, nonce_b), ask.commitment):
            del self.asks[ask.id]
            self._forget(ask.id, "the request was dropped: its nonce did not match its commitment")
            raise DeskError(403, "the nonce does not match the commitment of this request")
        ask.code = codes.verification_code(fleet, member, ask.joiner, ask.nonce_a, nonce_b)
        ask.state = "waiting"
        return ask

    def pending(self, now: float) -> list[Ask]:
        """Requests waiting for a decision (with their code), oldest first."""
        self.sweep(now)
        return sorted((a for a in self.asks.values() if a.state == "waiting"), key=lambda a: a.created)

    def find(self, code: str, now: float) -> Ask:
        """The waiting request showing ``code``; DeskError when none or more than one shows it."""
        digits = codes.parse_verification(code)
        if digits is None:
            raise DeskError(400, f"{code!r} is not a verification code (six digits, as `peerd requests` shows)")
        hits = [a for a in self.pending(now) if a.code == digits]
        if not hits:
            raise DeskError(404, f"no join request waits with code {codes.show_verification(digits)} here "
                                 "(see `peerd requests`; it may have expired)")
        if len(hits) > 1:
            raise DeskError(409, f"{len(hits)} requests show code {codes.show_verification(digits)}: someone may "
                                 "be passing for the other machine; reject them and ask again")
        return hits[0]

    def approve(self, code: str, answer: bytes, now: float) -> Ask:
        ask = self.find(code, now)
        ask.state, ask.answer = "approved", answer
        return ask

    def reject(self, code: str, now: float) -> Ask:
        ask = self.find(code, now)
        ask.state = "rejected"
        return ask

    def close(self, ask: Ask, why: str) -> None:
        """The joiner has its answer (or gave up): drop the request."""
        self.asks.pop(ask.id, None)
        self._forget(ask.id, why)

    # -- one-time codes ---------------------------------------------------------------------

    def add_code(self, ttl: float, now: float) -> OneTimeCode:
        self.sweep(now)
        if len(self.codes) >= self.max_codes:
            raise DeskError(429, f"{len(self.codes)} codes are still valid here; use them or let them expire")
        taken = set(self.codes) | {k for k in self.gone if isinstance(k, str)}
        code = OneTimeCode(codes.new_code(taken), now, now + ttl)
        self.codes[code.id] = code
        return code

    def try_code(self, code_id: str, now: float) -> OneTimeCode:
        """Count one try of a code (a PAKE session); DeskError if it cannot be tried any more."""
        self.sweep(now)
        code = self.codes.get(code_id)
        if code is None:
            raise self._missing(code_id, "code")
        if len(self.sessions) >= self.max_sessions:
            raise DeskError(429, "too many code exchanges under way here; try again in a minute")
        code.attempts += 1
        if code.attempts >= self.max_attempts:  # this try is the last one
            del self.codes[code_id]
            self._forget(code_id, f"the code was tried {self.max_attempts} times and is void; make a new one")
        return code

    def open_session(self, sess: Session) -> None:
        self.sessions[sess.id] = sess

    def session(self, sid: bytes, now: float) -> Session:
        self.sweep(now)
        sess = self.sessions.pop(sid, None)  # one confirmation per session, right or wrong
        if sess is None:
            raise DeskError(404, "no such code exchange here (it took too long, or was used); start again")
        return sess

    def use_code(self, code_id: str) -> None:
        """The code did its job: it can never be used again."""
        self.codes.pop(code_id, None)
        self._forget(code_id, "the code was used already; make a new one with `peerd invite --code`")

    def wrong_code(self, code_id: str) -> str:
        """What to tell a joiner whose code did not match."""
        left = self.codes.get(code_id)
        if left is None:
            return f"wrong code; it was tried {self.max_attempts} times and is now void: make a new one"
        n = self.max_attempts - left.attempts
        return f"wrong code ({n} {'try' if n == 1 else 'tries'} left)"
