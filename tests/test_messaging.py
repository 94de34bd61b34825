"""Messaging: receipt lifecycle, cursors, ordering, status, argument errors."""

from __future__ import annotations

import pytest

from replica import InvalidArgument, NotFound, Replica
from replica.ops import MAX_CONTENT_BYTES
from tests.conftest import pull


def test_receipt_lifecycle_unread_delivered_read(mem: Replica) -> None:
    """Unread -> delivered on first return -> read; read ones are excluded but kept for audit."""
    sent = mem.send_message("alpha", "beta", "hello")
    assert mem.message_status(sent.id)[0].delivered_at is None
    first = mem.check_messages("beta").messages
    assert len(first) == 1 and first[0].delivered_at is not None and first[0].read_at is None
    status = mem.message_status(sent.id)
    assert status[0].role == "beta" and status[0].delivered_at is not None and status[0].read_at is None
    again = mem.check_messages("beta").messages
    assert [m.id for m in again] == [sent.id] and again[0].delivered_at == first[0].delivered_at
    assert mem.mark_as_read([first[0].receipt_id]) == 1
    assert mem.check_messages("beta").messages == []
    status = mem.message_status(sent.id)
    assert status[0].read_at is not None
    assert mem.stats()["messages"] == 1


def test_mark_as_read_twice_counts_once(mem: Replica) -> None:
    """Marking an already-read receipt again changes nothing and counts zero."""
    mem.send_message("alpha", "beta", "x")
    rid = mem.check_messages("beta").messages[0].receipt_id
    assert mem.mark_as_read([rid, rid]) == 1
    ops_before = mem.stats()["ops"]
    assert mem.mark_as_read([rid]) == 0
    assert mem.stats()["ops"] == ops_before


def test_mark_as_read_unknown_id_changes_nothing(mem: Replica) -> None:
    """An unknown receipt id raises NotFound and no receipt is marked, not even the known ones."""
    mem.send_message("alpha", "beta", "x")
    rid = mem.check_messages("beta").messages[0].receipt_id
    before = mem.state_digest()
    with pytest.raises(NotFound, match="unknown receipt id"):
        mem.mark_as_read([rid, "nope"])
    assert mem.state_digest() == before
    assert len(mem.check_messages("beta").messages) == 1


def test_oldest_first_and_limit_with_cursor(mem: Replica) -> None:
    """Messages come oldest first; limit pages them and the cursor continues after the page."""
    for i in range(5):
        mem.send_message("alpha", "beta", f"m{i}")
    page = mem.check_messages("beta", limit=2)
    assert [m.content for m in page.messages] == ["m0", "m1"]
    page2 = mem.check_messages("beta", since=page.cursor, limit=10)
    assert [m.content for m in page2.messages] == ["m2", "m3", "m4"]


def test_cursor_never_skips_late_message_with_old_timestamp() -> None:
    """A message written offline earlier but arriving later is returned after the cursor."""
    now = [1_000_000]
    offline = Replica.open(wall=lambda: now[0])
    online = Replica.open(wall=lambda: now[0] + 50_000)
    offline.send_message("alpha", "beta", "written long ago")  # old HLC
    online.send_message("gamma", "beta", "written now")
    first = online.check_messages("beta")
    assert [m.content for m in first.messages] == ["written now"]
    pull(online, offline)  # the old message arrives late
    late = online.check_messages("beta", since=first.cursor)
    assert [m.content for m in late.messages] == ["written long ago"]
    assert late.messages[0].created < first.messages[0].created


def test_chronological_order_on_reconnect() -> None:
    """Messages that arrive together from a reconnecting peer come back in creation order."""
    clock = [5_000_000]
    a = Replica.open(wall=lambda: clock[0])
    b = Replica.open(wall=lambda: clock[0])
    c = Replica.open(wall=lambda: clock[0])
    for i, src in enumerate([a, b, a, b, a]):
        clock[0] += 10
        src.send_message(f"s{i}", "inbox", f"m{i}")
    pull(c, b)
    pull(c, a)  # a's ops land after b's, interleaved in time
    got = c.check_messages("inbox").messages
    assert [m.content for m in got] == ["m0", "m1", "m2", "m3", "m4"]


def test_message_status_lists_pending_recipients(mem: Replica) -> None:
    """Status shows each targeted role, pending until it checks its inbox."""
    sent = mem.send_message("alpha", "beta,gamma", "x")
    mem.check_messages("beta")
    status = {s.role: s for s in mem.message_status(sent.id)}
    assert set(status) == {"beta", "gamma"}
    assert status["beta"].delivered_at is not None and status["gamma"].delivered_at is None


def test_message_status_unknown_id(mem: Replica) -> None:
    """Status of an unknown message is a NotFound error."""
    with pytest.raises(NotFound, match="unknown message id"):
        mem.message_status("does-not-exist")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"from_": "", "channel": "b", "content": "x"}, "from must be a non-empty string"),
        ({"from_": "a", "channel": " , ", "content": "x"}, "channel names no role"),
        ({"from_": "a", "channel": "b", "content": 5}, "content must be a string"),
        ({"from_": "a", "channel": "b", "content": "x" * (MAX_CONTENT_BYTES + 1)}, "limit is 900000 bytes"),
        ({"from_": "a", "channel": "b", "content": "x", "instance_id": ""}, "instanceId"),
        ({"from_": "a" * 300, "channel": "b", "content": "x"}, "longer than 256"),
        ({"from_": "a\n", "channel": "b\x00", "content": "x"}, "control characters"),
        ({"from_": "a", "channel": "b", "content": "x\ud800"}, "content is not valid Unicode"),
        ({"from_": "\udfff", "channel": "b", "content": "x"}, "from is not valid Unicode"),
        ({"from_": "a", "channel": "b", "content": "x", "instance_id": "i\ud800"}, "instanceId is not valid Unicode"),
    ],
)
def test_bad_send_arguments_change_nothing(mem: Replica, kwargs: dict[str, object], match: str) -> None:
    """Malformed or oversized arguments raise InvalidArgument and write nothing."""
    before = mem.state_digest()
    with pytest.raises(InvalidArgument, match=match):
        mem.send_message(**kwargs)  # type: ignore[arg-type]
    assert mem.state_digest() == before and mem.stats()["ops"] == 0


def test_bad_check_arguments(mem: Replica) -> None:
    """Bad limit or cursor values are clear errors."""
    with pytest.raises(InvalidArgument, match="limit must be between 1 and 1000"):
        mem.check_messages("beta", limit=0)
    with pytest.raises(InvalidArgument, match="since must be"):
        mem.check_messages("beta", since=-1)
    with pytest.raises(InvalidArgument, match="receiptIds must be a list"):
        mem.mark_as_read("abc")


def test_integers_beyond_2_53_are_bad_arguments_not_store_errors(mem: Replica) -> None:
    """Cursors beyond 2^53 - 1 (the largest integer JSON clients carry exactly; SQLite's end at 2^63 - 1)
    and message ids with seqs of 2^63 or more are clear errors."""
    sent = mem.send_message("alpha", "beta", "hi")
    for since in (2**53, 2**63, 2**64):
        with pytest.raises(InvalidArgument, match="since must be between 0 and 9007199254740991"):
            mem.check_messages("beta", since=since)
        with pytest.raises(InvalidArgument, match="since must be between"):
            mem.search_messages("hi", since=since)
    assert mem.check_messages("beta", since=2**53 - 1).messages == []
    prefix = sent.id.split("-")[0]
    for seq in (2**63, 10**19 - 1):
        with pytest.raises(NotFound, match="unknown message id"):
            mem.message_status(f"{prefix}-{seq}")


def test_search_with_nul_or_surrogate_is_a_bad_argument(mem: Replica) -> None:
    """A NUL (which would end FTS5's string) or a lone surrogate in a query is InvalidArgument."""
    with pytest.raises(InvalidArgument, match="NUL"):
        mem.search_messages("a\x00b")
    with pytest.raises(InvalidArgument, match="not valid Unicode"):
        mem.search_messages("a\ud800")


def test_content_at_limit_is_accepted(mem: Replica) -> None:
    """Content of exactly the limit is stored and read back intact."""
    big = "é" * (MAX_CONTENT_BYTES // 2)
    mem.send_message("a", "b", big)
    assert mem.check_messages("b").messages[0].content == big


def test_profiles_field_wise_update(mem: Replica) -> None:
    """Updating one profile field keeps the others; a text is static.role or dynamic.currentTask."""
    mem.update_profile("orch-1", name="Builder", static="builds things")
    p = mem.update_profile("orch-1", dynamic="busy")
    assert (p.name, p.static, p.dynamic) == ("Builder", {"role": "builds things"}, {"currentTask": "busy"})
    assert mem.get_profile("nobody") is None
    assert [x.orchestrator_id for x in mem.list_profiles()] == ["orch-1"]
    assert mem.update_profile("orch-1") == mem.get_profile("orch-1")  # nothing to set: left as it is


def test_receipts_sync_between_replicas() -> None:
    """A read marked on one replica shows in the sender's status on another."""
    a, b = Replica.open(), Replica.open()
    sent = a.send_message("alpha", "beta", "x")
    pull(b, a)
    rid = b.check_messages("beta").messages[0].receipt_id
    b.mark_as_read([rid])
    pull(a, b)
    (status,) = a.message_status(sent.id)
    assert status.read_at is not None and status.receipt_id == rid


def test_search_finds_words_with_filters(mem: Replica) -> None:
    """Full-text search matches all words, honours from/channel/since filters, and sees new messages."""
    mem.send_message("alpha", "beta", "the deploy failed on staging")
    mem.send_message("gamma", "beta, delta", "deploy succeeded on prod")
    first = mem.search_messages("deploy")
    assert {h.content for h in first} == {"the deploy failed on staging", "deploy succeeded on prod"}
    assert [h.sender for h in mem.search_messages("deploy", from_="gamma")] == ["gamma"]
    assert [h.sender for h in mem.search_messages("deploy", channel="delta")] == ["gamma"]
    assert [h.content for h in mem.search_messages("failed staging")] == ["the deploy failed on staging"]
    late = mem.send_message("alpha", "broadcast", "deploy rolled back")
    hits = mem.search_messages("deploy", since=late.seq - 1)
    assert [h.content for h in hits] == ["deploy rolled back"]
    assert mem.search_messages('"OR deploy') == []  # operators are words, not syntax
    with pytest.raises(InvalidArgument, match="query must be a non-empty string"):
        mem.search_messages("  ")


def test_recent_senders_tracks_each_instance(mem: Replica) -> None:
    """Every (role, instance) that sent appears once, most recent first."""
    mem.send_message("alpha", "beta", "1", from_instance_id="a1")
    mem.send_message("gamma", "beta", "2")
    mem.send_message("alpha", "beta", "3", from_instance_id="a1")
    seen = mem.recent_senders()
    assert [(s.role, s.instance) for s in seen] == [("alpha", "a1"), ("gamma", None)]


def test_inbox_after_many_read_messages_still_sees_new_and_late_ones() -> None:
    """After a long read history, new messages, late arrivals from a peer and unread older
    ones are all still returned (the read-history floor never hides anything)."""
    r, peer = Replica.open(), Replica.open()
    for i in range(30):
        r.send_message("a", "b", f"old{i}")
    keep = r.check_messages("b", limit=5).messages  # delivered, left unread
    rest = r.check_messages("b", since=keep[-1].seq, limit=100).messages
    r.mark_as_read([m.receipt_id for m in rest])
    assert [m.content for m in r.check_messages("b", limit=100).messages] == [f"old{i}" for i in range(5)]
    r.mark_as_read([m.receipt_id for m in keep])
    assert r.check_messages("b").messages == []
    peer.send_message("c", "b", "late from peer")
    r.send_message("a", "b, x", "new multi")
    r.send_message("a", "broadcast", "new broadcast")
    pull(r, peer)
    got = [m.content for m in r.check_messages("b").messages]
    assert sorted(got) == ["late from peer", "new broadcast", "new multi"]


def test_search_index_catches_up_in_steps(mem: Replica) -> None:
    """The search index is built in bounded steps and a search always sees every message."""
    for i in range(25):
        mem.send_message("a", "b", f"needle {i}")
    assert mem.catch_up_step(10) is True
    assert len(mem.search_messages("needle", limit=100)) == 25
    assert mem.catch_up_step(10) is False


def test_message_log_latest_page_then_pages_after_a_cursor(mem: Replica) -> None:
    """The log gives the latest messages in arrival order, then the first ones after a cursor;
    a thread message shows its sender by agent name."""
    sent = [mem.send_message("alpha", "beta", f"m{i}") for i in range(3)]
    a, b = mem.create_agent("ann"), mem.create_agent("bob")
    mem.append(mem.create_thread(a, b), a, "in a thread")
    latest = mem.message_log(limit=2)
    assert [m.content for m in latest.messages] == ["m2", "in a thread"]
    assert (latest.messages[1].sender, latest.messages[1].sender_id) == ("ann", a)
    assert latest.cursor == latest.messages[-1].seq
    after = mem.message_log(after=sent[0].seq, limit=1)
    assert [m.content for m in after.messages] == ["m1"] and after.cursor == sent[1].seq
    assert mem.message_log(after=latest.cursor).messages == [] and mem.message_log(after=latest.cursor).cursor == latest.cursor
    with pytest.raises(InvalidArgument, match="after must be"):
        mem.message_log(after=-1)


def test_inbox_all_keeps_read_messages_and_records_delivery(mem: Replica) -> None:
    """The whole inbox lists read messages with their read time and records delivery of unread ones."""
    first = mem.send_message("alpha", "beta", "old")
    mem.mark_as_read([mem.check_messages("beta").messages[0].receipt_id])
    mem.send_message("alpha", "beta", "new")
    whole = mem.inbox_all("beta")
    assert [(m.content, m.read_at is not None) for m in whole.messages] == [("old", True), ("new", False)]
    assert whole.messages[1].delivered_at is not None
    assert {s.role: s.state for s in mem.message_status(first.id)} == {"beta": "read"}
    assert whole.cursor == whole.messages[-1].seq
    with pytest.raises(InvalidArgument, match="limit"):
        mem.inbox_all("beta", limit=0)


def test_mark_receipts_marks_the_known_reports_unknown_and_keeps_to_the_caller(mem: Replica) -> None:
    """Known receipts are marked, unknown ids reported (not failing the batch, message ids among them
    named), and with a caller a receipt of another role (by name key) is reported and nothing is marked."""
    sent = mem.send_message("alpha", "beta, gamma", "x")
    beta = mem.check_messages("beta").messages[0].receipt_id
    gamma = mem.check_messages("gamma").messages[0].receipt_id
    done = mem.mark_receipts([beta, "no-such-receipt", gamma, beta], caller="BETA")
    assert (done.marked, done.unknown, done.not_yours, done.owners) == (0, ["no-such-receipt"], [gamma],
                                                                         {gamma: "gamma"})
    assert len(mem.check_messages("beta").messages) == 1 and len(mem.check_messages("gamma").messages) == 1
    done = mem.mark_receipts([beta, sent.id, "no-such-receipt"], caller="BETA")
    assert (done.marked, done.unknown, done.message_ids) == (1, [sent.id, "no-such-receipt"], [sent.id])
    assert mem.mark_receipts([gamma]).marked == 1
    with pytest.raises(InvalidArgument, match="receipt id must be a non-empty string"):
        mem.mark_receipts([gamma, " "])
    with pytest.raises(NotFound, match="unknown receipt id"):
        mem.mark_as_read([gamma, "no-such-receipt"])


def test_check_messages_pages_by_limit_and_byte_budget(mem: Replica) -> None:
    """A page stops at the limit or the byte budget (but holds one message at least) and says it was truncated."""
    for i in range(3):
        mem.send_message("alpha", "sigma", str(i) * 20_000)
    page = mem.check_messages("sigma", limit=5, max_bytes=40_000)
    assert [len(m.content) for m in page.messages] == [20_000, 20_000] and page.truncated
    rest = mem.check_messages("sigma", since=page.cursor, limit=5, max_bytes=40_000)
    assert [m.content[0] for m in rest.messages] == ["2"] and not rest.truncated
    assert len(mem.check_messages("sigma", limit=1, max_bytes=10).messages) == 1  # at least one
    assert mem.check_messages("sigma", limit=3).truncated is False
    assert mem.check_messages("sigma", limit=2).truncated is True


def test_tenant_and_session_day_are_stored_and_filter(mem: Replica) -> None:
    """sessionDay (given, or the day of sending) and tenantId are stored; lists and search filter on them."""
    mem.send_message("alpha", "beta", "acme note", tenant_id="Acme-HR", session_day=89)
    plain = mem.send_message("eta", "beta", "plain note")
    assert mem.get_message(plain.id).session_day >= 1 and mem.get_message(plain.id).tenant is None
    assert [m.content for m in mem.list_messages(session_day=89).messages] == ["acme note"]
    assert [m.content for m in mem.list_messages(tenant_id="acme-hr").messages] == ["acme note"]
    assert [m.content for m in mem.list_messages(from_="ETA").messages] == ["plain note"]
    assert [h.content for h in mem.search_messages("note", tenant_id="ACME-HR")] == ["acme note"]
    assert [m.content for m in mem.check_messages("beta", tenant_id="acme-hr").messages] == ["acme note"]
    assert len(mem.check_messages("beta").messages) == 2  # a tenant filter hides nothing from later calls
    for bad in ({"session_day": 0}, {"session_day": 2**31}, {"tenant_id": " "}):
        with pytest.raises(InvalidArgument):
            mem.send_message("a", "b", "x", **bad)  # type: ignore[arg-type]


def test_list_messages_pages_newest_first(mem: Replica) -> None:
    """Pages go from newest to oldest; 'before' continues exactly where the last page stopped."""
    ids = [mem.send_message("alpha", "beta", str(i)).id for i in range(5)]
    first = mem.list_messages(limit=2)
    assert [m.id for m in first.messages] == [ids[4], ids[3]]
    second = mem.list_messages(limit=2, before=first.before)
    third = mem.list_messages(limit=2, before=second.before)
    assert [m.id for m in second.messages + third.messages] == [ids[2], ids[1], ids[0]] and third.before is None


def test_message_by_id_is_an_index_lookup_not_a_scan(mem: Replica) -> None:
    """Finding a message by id (after every send, in get_message, in retractions) walks the few
    origins and looks each up in ops by (origin, seq): never a scan of every op."""
    from replica import project  # noqa: PLC0415

    for i in range(30):
        mem.send_message("alpha", "beta", f"filler {i}")
    sent = mem.send_message("alpha", "beta", "wanted")
    asked: list[tuple[str, tuple[object, ...]]] = []

    class Recorder:
        def execute(self, sql: str, params: tuple[object, ...]) -> Recorder:
            asked.append((sql, params))
            return self

        def fetchone(self) -> None:
            return None

    project.find_message(Recorder(), sent.id, "m.content")  # type: ignore[arg-type]
    assert len(asked) == 1
    with mem._store.read() as cur:
        plan = [row[3] for row in cur.execute("EXPLAIN QUERY PLAN " + asked[0][0], asked[0][1])]
        assert project.find_message(cur, sent.id, "m.content")[0] == "wanted"
    assert not any(step.startswith("SCAN m") for step in plan), plan
    assert any("ops_by_origin" in step for step in plan), plan
    assert mem.get_message(sent.id).content == "wanted"
