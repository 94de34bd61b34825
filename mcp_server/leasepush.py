"""Telling a session that one of its role's leases was lost, or won, when a clash between leases
taken apart (another process, a partition) is settled on this replica.

Invariants:
* A session is told of each loss found here after its follower started (``Replica.lease_mark``),
  once: its lease cursor only moves forward. Both sides are told: the loser's role ("stop editing")
  and the winner's ("someone else edited it meanwhile"), each on every machine where a session
  bound to it follows the feed (every replica settles the clash alike when the ops meet).
* Every text a peer wrote (role names, patterns, reasons) is neutralised by ``framing`` and meta
  values are plain one-line strings, as for mail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp_server import framing
from mcp_server.channelwire import ChannelNotification, ChannelParams
from replica import Replica
from replica.leasing import LeaseLoss
from replica.names import name_key

Run = Callable[..., Awaitable[Any]]
Send = Callable[[ChannelNotification], Awaitable[bool]]


def loss_content(loss: LeaseLoss, role: str) -> str:
    """What a session of ``role`` is told of ``loss`` (pure)."""
    lost, win = loss.lost, loss.winner
    other = win.agent if win is not None else "an earlier lease"
    where = f"{lost.path_pattern!r} in project {lost.project}"
    if name_key(lost.agent) == name_key(role):
        text = (f"Your file reservation {lost.id} on {where} is LOST: {other} reserved it first "
                f"({win.path_pattern!r}, until {win.expires_ts}, reason: {win.reason or 'none'})"
                if win is not None else f"Your file reservation {lost.id} on {where} is LOST.")
        text += ". The two were taken while the machines could not reach each other; stop editing those paths " \
                "and coordinate with the holder (list_file_reservations shows both)."
    else:
        text = (f"Your file reservation {win.id if win else ''} on {win.path_pattern if win else where!r} holds: "
                f"{lost.agent} reserved {where} while the machines could not reach each other and has been told "
                "it lost; its edits there may need merging (list_file_reservations shows both).")
    return framing.cut(framing.neutralise(text), framing.BODY_CHARS, "")


def loss_meta(loss: LeaseLoss, role: str) -> dict[str, str]:
    lost = name_key(loss.lost.agent) == name_key(role)
    fields = {"kind": "lease_conflict", "outcome": "lost" if lost else "won", "lease_id": loss.lost.id,
              "project": loss.lost.project, "path": loss.lost.path_pattern,
              "winner_id": loss.winner.id if loss.winner else "", "winner": loss.winner.agent if loss.winner else ""}
    return {k: framing.meta_value(v) for k, v in fields.items()}


def concerns(loss: LeaseLoss, role: str) -> bool:
    key = name_key(role)
    return name_key(loss.lost.agent) == key or (loss.winner is not None and name_key(loss.winner.agent) == key)


async def tell(run: Run, send: Send, role: str, cursor: int | None) -> tuple[bool, int]:
    """Push every loss after ``cursor`` that concerns ``role`` (None: start from now); (alive, cursor)."""
    if cursor is None:
        return True, await run(Replica.lease_mark)
    while True:
        found: list[LeaseLoss] = await run(Replica.lease_losses, cursor)
        if not found:
            return True, cursor
        for loss in found:
            cursor = loss.lseq
            if concerns(loss, role) and not await send(ChannelNotification(params=ChannelParams(
                    content=loss_content(loss, role), meta=loss_meta(loss, role)))):
                return False, cursor
