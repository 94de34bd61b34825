"""The application service: each piece of work every door (MCP tools, the local API, the CLI
online and offline, the dashboard) does on a replica, written once, answering one result in the
one vocabulary (``replica.wire``).

Invariants:
* Each use case is one method here; the doors only parse their arguments, call it and print or
  return its result. A door never restates a rule this module or ``Replica`` enforces.
* A call that would change nothing because of its arguments is an error saying what to pass
  instead: a message id given as a receipt id, receipt ids none of which is known, receipts of
  another role than ``callerOrchestrator``. A partial batch marks the valid ids and names the
  others (``unknown``, with a ``warning``). Each such error changed nothing.
* A send to a role never seen, or seen only reading its inbox (unconfirmed), succeeds (the message
  waits for it) and says so in a sentence naming the closest known roles (``warning``); so does the
  first read of a role's inbox (the result gains ``warning``, VantagePeers' fields unchanged).
* A send's recipient check, its write and the read-back of what it stored are one transaction
  (``Replica.send_checked``).
* No asyncio: waiting is the caller's (``replica.feed``); the methods are synchronous and
  short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replica import firstseen, wire
from replica.api import Replica
from replica.errors import InvalidArgument, NotFound
from replica.models import MarkResult, MessageRecord, Profile, RecipientCheck, SentMessage
from replica.stamps import parse_since
from replica.wire import Wire

MAX_SHOWN = 5  # ids named in one error or warning sentence


def _quoted(names: Sequence[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:MAX_SHOWN])
    return shown + (f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else "")


def _standing(check: RecipientCheck) -> str:
    """What the roles of a check are: never seen, and seen only reading (``replica.firstseen``)."""
    never = [r for r in check.unknown_recipients if r not in check.unconfirmed]
    parts = []
    if never:
        subject = f"role {_quoted(never)} has" if len(never) == 1 else f"roles {_quoted(never)} have"
        parts.append(f"{subject} not been seen in this fleet yet (no profile, never sent a message, never "
                     "checked an inbox)")
    if check.unconfirmed:
        seen = check.unconfirmed
        subject = f"role {_quoted(seen)} has" if len(seen) == 1 else f"roles {_quoted(seen)} have"
        parts.append(f"{subject} only been seen reading an inbox (no profile, never sent a message): maybe a typo")
    return "; ".join(parts)


def _suggestions(check: RecipientCheck) -> str:
    """The closest spellings (``broadcast`` for a word meaning everyone) and the confirmed roles."""
    text = ""
    near = firstseen.close(check.unknown_recipients, check.known_roles)
    if near:
        text += f" Did you mean {_quoted(near)}?"
    if check.known_roles:
        return text + f" Known roles: {', '.join(check.known_roles)}."
    return text + " This node knows no role yet."


def unknown_role_warning(check: RecipientCheck) -> str | None:
    """The sentence a send to roles never seen, or seen only reading, answers with (the message is
    stored all the same)."""
    if not check.unknown_recipients:
        return None
    return f"{_standing(check)}; the message is stored and waits until one appears." + _suggestions(check)


def reader_warning(check: RecipientCheck) -> str | None:
    """The sentence a read of the inbox of a role never seen answers with (``Replica.reader_check``,
    asked before the read; the inbox is returned all the same)."""
    if not check.unknown_recipients:
        return None
    return (f"{_standing(check)}; this read makes it known, unconfirmed until it sends a message or sets a "
            "profile." + _suggestions(check))


@dataclass(frozen=True)
class Words:
    """How a door's users name a message id, a receipt id and the read that gives receipts, in the
    sentences the service says to them (MCP and the local API: the tools'; the command line: its own)."""

    message_id: str
    receipt_id: str
    inbox: str  # what returned the receipts: "<receiptId> that {inbox}"


TOOL_WORDS = Words("messageId", "receiptId", "check_messages returned")
CLI_WORDS = Words("message id", "receipt id", "peerd inbox shows")


def mark_problem(done: MarkResult, caller: str | None, asked: int, words: Words = TOOL_WORDS) -> str | None:
    """Why a mark call is refused (it marked nothing), or None: receipts of another role than
    ``caller``, or ``asked`` ids none of which is a receipt this node knows."""
    if done.not_yours:
        owners = sorted(set(done.owners.values()))
        return (f"receipt {_quoted(done.not_yours)} is addressed to {_quoted(owners)}, not to '{caller}' "
                f"(callerOrchestrator); pass only the receipts {words.inbox} to you. Nothing was marked.")
    if len(done.unknown) < asked:
        return None
    if done.message_ids:
        what = f"this is a {words.message_id}" if len(done.message_ids) == 1 else f"these are {words.message_id}s"
        return (f"{_quoted(done.message_ids)}: {what}; pass the {words.receipt_id} that {words.inbox} "
                "(one per message and recipient). Nothing was marked.")
    return (f"no receipt id this node knows among {_quoted(done.unknown)}: pass the {words.receipt_id} values that "
            f"{words.inbox}. Nothing was marked.")


def mark_warning(done: MarkResult, words: Words = TOOL_WORDS) -> str | None:
    """The sentence a partial batch answers with: which ids were not marked, and why."""
    parts = []
    if done.message_ids:
        parts.append(f"{_quoted(done.message_ids)} are {words.message_id}s, not receipt ids (pass the "
                     f"{words.receipt_id} that {words.inbox})")
    rest = [r for r in done.unknown if r not in done.message_ids]
    if rest:
        parts.append(f"{_quoted(rest)} are not receipt ids this node knows")
    return "; ".join(parts) + "; the other receipts were marked." if parts else None


@dataclass(frozen=True)
class Sent:
    """A send's result: the stored message, its recipients, the recipient check."""

    sent: SentMessage
    message: MessageRecord
    check: RecipientCheck

    @property
    def warning(self) -> str | None:
        return unknown_role_warning(self.check)

    def wire(self) -> Wire:
        return wire.sent_view(self.message, self.sent.recipients, self.check.unknown_recipients,
                              self.check.known_roles, self.warning)


@dataclass(frozen=True)
class Marked:
    """A mark call's result."""

    result: MarkResult
    words: Words = TOOL_WORDS

    @property
    def warning(self) -> str | None:
        return mark_warning(self.result, self.words)

    def wire(self) -> Wire:
        r = self.result
        return {"markedAsRead": r.marked, "marked": r.marked, "unknown": r.unknown, "notYours": r.not_yours,
                "warning": self.warning}


class Service:
    """The use cases over one ``Replica``."""

    def __init__(self, replica: Replica, words: Words = TOOL_WORDS) -> None:
        self.replica = replica
        self.words = words

    # -- messages ---------------------------------------------------------------------------

    def send(self, sender: str, channel: str, content: str, *, instance: str | None = None,
             from_instance: str | None = None, session_day: int | None = None,
             tenant: str | None = None, ack_required: bool = False) -> Sent:
        """A send with its recipient check; ``ack_required`` asks the recipients to acknowledge it (an
        op of its own after the message, ``replica.acks``)."""
        sent, check, record = self.replica.send_checked(sender, channel, content, instance, from_instance,
                                                        session_day=session_day, tenant_id=tenant)
        if ack_required:
            self.replica.require_ack(sent.id)
        return Sent(sent, record, check)

    def inbox(self, role: str, instance: str | None = None, since: int | str | None = None, limit: int = 20, *,
              include_read: bool = False, max_bytes: int | None = None, tenant: str | None = None,
              now_ms: int) -> Wire:
        """A page of ``role``'s inbox (unread only unless ``include_read``), oldest first; reading it
        records *delivered*. ``since``: a cursor, or a time (``replica.stamps.parse_since``)."""
        r = self.replica
        check = r.reader_check(role)  # before the read, which makes the role known
        if include_read:
            cursor = parse_since(since, now_ms=now_ms, newest=r.max_lseq()).cursor
            page = r.inbox_all(role, instance, cursor, limit)
        else:
            at = parse_since(since, now_ms=now_ms, newest=r.max_lseq())
            page = r.check_messages(role, instance, at.cursor, limit, arrived_after_ms=at.arrived_after_ms,
                                    max_bytes=max_bytes, tenant_id=tenant)
        return {"recipient": role, "recipientInstanceId": instance,
                "messages": [wire.inbox_item(m) for m in page.messages], "cursor": page.cursor,
                "truncated": page.truncated, "nextSince": page.cursor if page.truncated else None,
                "warning": reader_warning(check)}

    def mark(self, receipt_ids: Sequence[str], caller: str | None = None) -> Marked:
        """Mark receipts read; refused (nothing marked) when the ids cannot be what was meant."""
        done = self.replica.mark_receipts(receipt_ids, caller)
        asked = len(dict.fromkeys(x.strip() if isinstance(x, str) else x for x in receipt_ids))
        problem = mark_problem(done, caller, asked, self.words)
        if problem is None:
            return Marked(done, self.words)
        if done.not_yours or done.message_ids:
            raise InvalidArgument(problem)
        raise NotFound(problem)

    def status(self, message_id: str) -> Wire:
        """Who a message reached; a receipt id given instead is refused naming its message."""
        r = self.replica
        try:
            return wire.status_view(r.get_message(message_id), r.message_status(message_id))
        except NotFound:
            owner = r.receipt_owner(message_id) if isinstance(message_id, str) else None
            if owner is None:
                raise
            mid, role, inst = owner
            of = f"{role}/{inst}" if inst else role
            raise NotFound(f"unknown message id {message_id.strip()}: {message_id.strip()} is a "
                           f"{self.words.receipt_id} (of {of}) for message {mid}; pass the {self.words.message_id} "
                           f"{mid}") from None

    def message(self, message_id: str) -> Wire:
        return wire.message_view(self.replica.get_message(message_id))

    def retract(self, message_id: str, caller: str) -> Wire:
        """Retract a message its sender role sent: every replica drops its content."""
        m = self.replica.retract_message(message_id, caller)
        return {"deleted": True, "messageId": m.id, "receiptsDeleted": self.replica.receipt_count(m.id),
                "retractedAt": wire.ms(m.retracted)}

    def log(self, after: int | None = None, limit: int = 50, *, with_recipients: bool = False) -> Wire:
        """Messages in arrival order: the latest ``limit``, or the first ``limit`` after ``after``
        (a ``cursor`` of an earlier page); with each recipient's state if asked."""
        page = self.replica.message_log(after, limit)
        items = [wire.log_view(m) for m in page.messages]
        if with_recipients:
            items = [{**m, "recipients": self._recipients(m["messageId"])} for m in items]
        return {"messages": items, "cursor": page.cursor}

    def search(self, query: str, *, from_: str | None = None, channel: str | None = None, since: int | None = None,
               limit: int = 50, with_recipients: bool = False) -> Wire:
        """Every message held here matching all words of ``query``, best first; a thread message
        shows its agent's name as ``from``."""
        r = self.replica
        hits = r.search_messages(query, from_=from_, channel=channel, since=since, limit=limit)
        ids = [h.sender for h in hits if h.thread is not None]
        names = {a.id: a.name for a in (r.get_agent(i) for i in dict.fromkeys(ids)) if a is not None}
        items = [wire.hit_view(h, names.get(h.sender, h.sender) if h.thread is not None else h.sender) for h in hits]
        if with_recipients:
            items = [{**m, "recipients": self._recipients(m["messageId"])} for m in items]
        return {"query": query, "hits": items}

    def _recipients(self, message_id: str) -> list[Wire]:
        return [wire.recipient_view(x) for x in self.replica.message_status(message_id)]

    # -- profiles ---------------------------------------------------------------------------

    def profile(self, orchestrator_id: str, instance: str | None = None) -> Wire | None:
        """VantagePeers' shape: the profile itself, or None for a role with none."""
        p = self.replica.get_profile(orchestrator_id, instance)
        return None if p is None else wire.profile_view(p)

    def update_profile(self, orchestrator_id: str, name: str | None = None, static: object = None,
                       dynamic: object = None, *, instance: str | None = None) -> Wire:
        p: Profile = self.replica.update_profile(orchestrator_id, name, static, dynamic, instance_id=instance)
        return wire.profile_view(p)

    def profiles(self) -> list[Wire]:
        return [wire.profile_view(p) for p in self.replica.list_profiles()]
