"""One request to a peer across a key rotation, as a table of states: pure.

A request may meet a peer on another key than ours. Two ways out, each tried once:

* the peer refuses our key (``WrongKey``): if we hold keys the fleet used before, we hand it the
  rotation sealed with those (``TellRotation``), and send again when it took it;
* the peer answers with a rotation (``Rekey``): we apply it (``CatchUp``), and send again when
  it gave us a new key.

A second refusal, or anything but a reply, ends the request. The table (``TABLE``) is the whole
rule, h11-style: ``step(state, event)`` looks up the transition, and an event a state does not
expect is a bug (``CallBug``), never a silent retry. The shell (``peerd.node``) carries out the
actions (sending, telling, catching up) and feeds back what came of them.

Invariants: a request is sent at most twice; it ends in ``Deliver`` or ``Fail`` from every state;
nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peerd.protocol.answers import Meaning, Refused, Rekey, Replied, Unreadable, WrongKey
from replica.errors import Bug

WRONG_FLEET = "refused our request: not in the same fleet (different fleet key)"
REMOVED = ("this node was removed from the fleet (its key was rotated without it); it can no longer sync. "
           "To take part again, join with a fresh home: `peerd join --lan` (or an invite) with another --home")
NO_KEY = "answered with a key rotation that gives this node no key"


class State(enum.Enum):
    SENT = "sent"  # the first try is out
    TELLING = "telling"  # handing the peer the rotation under an old key
    CATCHING_UP = "catching up"  # applying the rotation the peer answered with
    RESENT = "resent"  # the last try is out
    DONE = "done"


@dataclass(frozen=True)
class Told:
    """The peer took the rotation we handed it (``took``), or no old key opened there."""

    took: bool


@dataclass(frozen=True)
class CaughtUp:
    """We applied the peer's rotation; ``new_key``: it gave us a key to send again with."""

    new_key: bool


Event = Meaning | Told | CaughtUp


@dataclass(frozen=True)
class Send:
    pass


@dataclass(frozen=True)
class TellRotation:
    pass


@dataclass(frozen=True)
class CatchUp:
    ops: list[bytes]


@dataclass(frozen=True)
class Deliver:
    reply: dict[str, object]


@dataclass(frozen=True)
class Fail:
    reason: str


Action = Send | TellRotation | CatchUp | Deliver | Fail


class CallBug(Bug):
    """An event the table has no transition for: a bug in the shell, not a peer's doing."""


@dataclass(frozen=True)
class Context:
    """What the rules need to know of this node: whether it holds keys from before a rotation
    (so it can tell a peer of it), and whether it was removed from the fleet."""

    can_tell: bool
    removed: bool

    def refusal(self) -> str:
        return REMOVED if self.removed else WRONG_FLEET

    def no_key(self) -> str:
        return REMOVED if self.removed else NO_KEY


def _deliver(event: Replied, ctx: Context) -> tuple[State, Action]:
    return State.DONE, Deliver(event.msg)


def _refused(event: Refused, ctx: Context) -> tuple[State, Action]:
    return State.DONE, Fail(f"refused our request: {event.reason}")


def _unreadable(event: Unreadable, ctx: Context) -> tuple[State, Action]:
    return State.DONE, Fail(event.detail)


def _tell(event: WrongKey, ctx: Context) -> tuple[State, Action]:
    return (State.TELLING, TellRotation()) if ctx.can_tell else (State.DONE, Fail(ctx.refusal()))


def _catch_up(event: Rekey, ctx: Context) -> tuple[State, Action]:
    return State.CATCHING_UP, CatchUp(event.ops)


def _told(event: Told, ctx: Context) -> tuple[State, Action]:
    return (State.RESENT, Send()) if event.took else (State.DONE, Fail(ctx.refusal()))


def _caught_up(event: CaughtUp, ctx: Context) -> tuple[State, Action]:
    return (State.RESENT, Send()) if event.new_key else (State.DONE, Fail(ctx.no_key()))


def _wrong_key_again(event: WrongKey, ctx: Context) -> tuple[State, Action]:
    return State.DONE, Fail(ctx.refusal())


def _rekey_again(event: Rekey, ctx: Context) -> tuple[State, Action]:
    return State.DONE, Fail(ctx.no_key())


Rule = Callable[[Any, Context], tuple[State, Action]]

# (state, event type) -> the rule giving the next state and the action; nothing else happens.
TABLE: dict[tuple[State, type], Rule] = {
    (State.SENT, Replied): _deliver,
    (State.SENT, Refused): _refused,
    (State.SENT, Unreadable): _unreadable,
    (State.SENT, WrongKey): _tell,
    (State.SENT, Rekey): _catch_up,
    (State.TELLING, Told): _told,
    (State.CATCHING_UP, CaughtUp): _caught_up,
    (State.RESENT, Replied): _deliver,
    (State.RESENT, Refused): _refused,
    (State.RESENT, Unreadable): _unreadable,
    (State.RESENT, WrongKey): _wrong_key_again,
    (State.RESENT, Rekey): _rekey_again,
}


def step(state: State, event: Event, ctx: Context) -> tuple[State, Action]:
    """The next state, and what to do, after ``event`` in ``state``."""
    rule = TABLE.get((state, type(event)))
    if rule is None:
        raise CallBug(f"no transition from {state.value} on {type(event).__name__}")
    return rule(event, ctx)
