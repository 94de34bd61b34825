"""Resources for generic MCP clients: a reader's unread mail and a thread, as JSON.

Invariants:
* URIs: ``peerd://inbox/{role}``, ``peerd://inbox/{role}/{instance}`` and
  ``peerd://thread/{thread_id}``; each part is percent-encoded (a role may hold ``/``).
* Reading is a peek: it records nothing (no *delivered* receipt), unlike ``check_messages``.
* A resource's text is a function of the replica's state only (no clock, no reader), so a
  subscription's "changed" is exactly "its text changed" (``channel`` compares digests).
* Replica reads run on worker threads; a bad URI or an unknown thread is a clear MCP error
  (``invalid_argument: ...`` / ``not_found: ...``), never a traceback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from replica import NotFound, PeerdError, Replica
from replica.mailbox import Mail

SCHEME = "peerd://"
INBOX = SCHEME + "inbox/"
THREAD = SCHEME + "thread/"
INBOX_MESSAGES = 50  # messages shown in an inbox resource (the count covers up to COUNT_CAP)
THREAD_MESSAGES = 50
COUNT_CAP = 1000
MIME = "application/json"


@dataclass(frozen=True)
class InboxRef:
    role: str
    instance: str | None = None


@dataclass(frozen=True)
class ThreadRef:
    thread_id: str


Ref = InboxRef | ThreadRef


def _part(raw: str) -> str | None:
    value = unquote(raw, errors="strict") if "%" in raw else raw
    return value.strip() or None


def parse_uri(uri: object) -> Ref | None:
    """What a peerd resource URI names, or None if it names nothing of ours."""
    if not isinstance(uri, str):
        return None
    try:
        if uri.startswith(INBOX):
            parts = uri[len(INBOX):].split("/")
            names = [_part(p) for p in parts]
            if len(names) in (1, 2) and all(names):
                return InboxRef(names[0] or "", names[1] if len(names) == 2 else None)
        elif uri.startswith(THREAD):
            tid = _part(uri[len(THREAD):])
            if tid and "/" not in uri[len(THREAD):]:
                return ThreadRef(tid)
    except UnicodeDecodeError:
        return None
    return None


def uri_of(ref: Ref) -> str:
    if isinstance(ref, ThreadRef):
        return THREAD + quote(ref.thread_id, safe="")
    tail = "" if ref.instance is None else "/" + quote(ref.instance, safe="")
    return INBOX + quote(ref.role, safe="") + tail


def _mail_item(m: Mail) -> dict[str, Any]:
    """A message as check_messages shows it (VantagePeers' names), with the thread's id and number."""
    return {"messageId": m.id, "receiptId": m.receipt_id, "from": m.sender, "fromInstanceId": m.sender_instance,
            "channel": m.channel, "instanceId": m.target_instance, "threadId": m.thread, "threadSeq": m.thread_seq,
            "content": m.content, "createdAt": m.created_ms, "seq": m.seq,
            "fromNode": None if m.from_node is None else {"id": m.from_node, "name": m.from_node_name}}


def inbox_doc(r: Replica, ref: InboxRef) -> dict[str, Any]:
    mail = r.mail(ref.role, ref.instance, limit=COUNT_CAP, pending_only=False)
    return {"role": ref.role, "instanceId": ref.instance, "unread": len(mail), "more": len(mail) >= COUNT_CAP,
            "messages": [_mail_item(m) for m in mail[:INBOX_MESSAGES]]}


def thread_doc(r: Replica, ref: ThreadRef) -> dict[str, Any]:
    info = r.get_thread_info(ref.thread_id)
    if info is None:
        raise NotFound(f"unknown thread {ref.thread_id!r}")
    tail = r.poll(ref.thread_id, max(0, info.message_count - THREAD_MESSAGES), THREAD_MESSAGES)  # seqs 1..count
    names: dict[str, str] = {}
    for aid in {*info.participants, *(m.sender for m in tail)}:
        agent = r.get_agent(aid)
        names[aid] = agent.name if agent is not None else aid
    return {"thread_id": info.thread_id, "participants": [names[a] for a in info.participants],
            "message_count": info.message_count, "latest_activity": info.latest_activity,
            "messages": [{"seq": m.seq, "id": m.id, "sender": names[m.sender], "sender_id": m.sender,
                          "content": m.content, "created": m.created} for m in tail]}


def render(r: Replica, ref: Ref) -> str:
    """A resource's text (JSON). Raises the replica's errors for bad names or unknown threads."""
    doc = thread_doc(r, ref) if isinstance(ref, ThreadRef) else inbox_doc(r, ref)
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def digest(r: Replica, ref: Ref) -> str:
    """A fingerprint of the resource's text ("missing" while a thread is unknown here)."""
    try:
        text = render(r, ref)
    except NotFound:
        return "missing"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _mcp_error(exc: PeerdError) -> MCPError:
    code = "not_found" if isinstance(exc, NotFound) else "invalid_argument"
    return MCPError(code=INVALID_PARAMS, message=f"{code}: {exc}")


def register(server: MCPServer[Any], replica: Callable[[], Replica]) -> None:
    """Add the inbox and thread resource templates to ``server``."""

    def read(ref: Ref) -> str:
        try:
            return render(replica(), ref)
        except PeerdError as exc:
            raise _mcp_error(exc) from None

    def inbox(role: str) -> str:
        return read(InboxRef(role.strip(), None))

    def inbox_instance(role: str, instance: str) -> str:
        return read(InboxRef(role.strip(), instance.strip()))

    def thread(thread_id: str) -> str:
        return read(ThreadRef(thread_id.strip()))

    server.resource(INBOX + "{role}", name="inbox", mime_type=MIME,
                    description="Unread mail of a role (its inbox and its agent's threads), oldest first; "
                                "reading records nothing.")(inbox)
    server.resource(INBOX + "{role}/{instance}", name="inbox_instance", mime_type=MIME,
                    description="Unread mail of one instance of a role, oldest first; reading records nothing.")(
        inbox_instance)
    server.resource(THREAD + "{thread_id}", name="thread", mime_type=MIME,
                    description="A thread: participants, message count and its newest messages.")(thread)
