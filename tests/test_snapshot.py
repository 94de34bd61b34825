"""Snapshots, in memory: a member far behind takes what a peer holds, page by page, with each page
signed by that peer; the result is what rounds would have left, the bulk store path is the ordinary
one in fewer statements, a taker stopped half-way goes on from its cursor, bad pages and requests
are refused with nothing stored, and forged ops are found afterwards and dropped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerd import protocol
from peerd.protocol import Msg, snapshot
from peerd.protocol.snapshot import digest
from replica import InvalidOp, NotFound, Replica, bulk, project, store
from replica import identity as idmod
from replica import ops as opsmod
from replica.snapshot import Point, SnapPage
from replica.sync import _advance
from tests.conftest import pull
from tests.newer import NewerNode
from tests.snapshots import FLEET_ID, Server, busy_hub, open_snapshot, resume, take, take_page

TABLES = ("ops", "origins", "routes", "lww", "receipts", "profiles", "agents", "threads", "members", "retractions",
          "thread_seqs", "first_seen", "fleet_admits", "fleet_ops", "fleet_removed", "fleet_members")


def dump(rep: Replica, *, local: bool = True) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (``local``: with lseqs and row ids, else only replicated values)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with rep._store.read() as cur:
        for table in TABLES:
            rows = [tuple(r) for r in cur.execute(f"SELECT * FROM {table}")]
            if not local and table in ("ops", "origins", "routes", "thread_seqs", "fleet_ops"):
                continue
            out[table] = sorted(rows, key=repr)
        if not local:
            out["messages"] = sorted(tuple(r) for r in cur.execute(
                "SELECT id, sender, channel, thread, content, retracted, skey, ckey, sday FROM messages"))
    return out


def content(rep: Replica, mid: str) -> str | None:
    """A message's content, or None when the replica does not hold it."""
    try:
        return rep.get_message(mid).content
    except NotFound:
        return None


def fixed_wall() -> int:
    return 4_000_000_000_000  # past every stamp the tests make (a stamp past the allowed drift is refused)


# -- the point and its pages --------------------------------------------------------------------


def test_a_cursor_moves_past_origins_with_nothing_left_and_ends_with_none() -> None:
    """norm skips empty origins, clamps a seq below the start, and says None past the last top."""
    point = Point((b"a" * 32, b"b" * 32, b"c" * 32), (1, 5, 3), (4, 4, 9))
    assert point.first() == (0, 1)
    assert point.norm((0, 5)) == (2, 3)  # origin 1 holds nothing (5 > 4)
    assert point.norm((2, 1)) == (2, 3)
    assert point.norm((2, 10)) is None
    assert point.total == 4 + 0 + 7


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=4), st.integers(1, 3000), st.data())
def test_pages_cover_the_point_once_in_order(sizes: list[int], budget: int, data: st.DataObject) -> None:
    """However the budget cuts them, the pages of a point hold every op it covers exactly once, in
    origin and seq order, and their ranges tile the point with no gap."""
    hub = Replica.open()
    writers = [NewerNode() for _ in sizes]
    for w, n in zip(writers, sizes, strict=True):
        hub.apply([w.message("a", "tau", "x" * data.draw(st.integers(0, 400))) for _ in range(n)])
    base = {w.key: data.draw(st.integers(0, n)) for w, n in zip(writers, sizes, strict=True)}
    point = Point.between(hub.vector(), base)
    seen: list[tuple[bytes, int]] = []
    covered: list[tuple[int, int, int]] = []
    at = point.first()
    while at is not None:
        page: SnapPage = hub.snapshot_page(point, at, budget)
        assert page.ops and (len(page.ops) == 1 or sum(map(len, page.ops)) <= budget)
        seen += [ident for raw in page.ops if (ident := opsmod.peek(raw)) is not None]
        covered += [(point.origins.index(o), lo, hi) for o, (lo, hi) in page.ranges.items()]
        at = page.next
    want = [(o, s) for o, lo, hi in zip(point.origins, point.starts, point.tops, strict=True) for s in range(lo, hi + 1)]
    assert seen == want
    assert [s for _i, lo, hi in covered for s in range(lo, hi + 1)] == [s for _o, s in want]


# -- the result ---------------------------------------------------------------------------------


def test_a_snapshot_leaves_the_taker_as_rounds_would() -> None:
    """A fresh member that takes a snapshot of a busy hub holds what one that pulled op by op holds:
    the same state, vector, counts and replicated rows; nothing is left being taken."""
    hub = busy_hub()
    by_rounds, by_snapshot = Replica.open(), Replica.open()
    pull(by_rounds, hub)
    pages = take(by_snapshot, Server(hub, budget=2048))
    assert pages > 5
    assert by_snapshot.state_digest() == by_rounds.state_digest() == hub.state_digest()
    assert by_snapshot.vector() == by_rounds.vector() == hub.vector()
    assert by_snapshot.stats() == by_rounds.stats()
    assert dump(by_snapshot, local=False) == dump(by_rounds, local=False)
    assert by_snapshot.snapshot_taking() is None
    assert by_snapshot.newer_ops() == {"lease": 1}


def _ops_of(hub: Replica) -> list[bytes]:
    return [raw for _lseq, raw in hub.ops_after(0, limit=10_000)]


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_bulk_store_leaves_every_row_as_store_op_does(rnd: Any) -> None:
    """Whatever the order of the ops (a retraction before its message, thread messages, receipts,
    profiles, a newer release's op), storing them in one batch leaves every table, lseqs included,
    exactly as storing them one by one does."""
    raws = _HUB_OPS[:]
    rnd.shuffle(raws)
    me = idmod.generate()
    one_by_one, batched = Replica.open(identity=me, wall=fixed_wall), Replica.open(identity=me, wall=fixed_wall)
    for raw in raws:
        one_by_one.apply([raw])
    decoded = [opsmod.decode(raw) for raw in raws]
    with batched._store.write() as cur:
        batch = [(store.origin_id(cur, op.origin), op) for op in decoded]
        bulk.store_batch(cur, batch, store.arrival_time(cur, fixed_wall()))
        for oid in {oid for oid, _op in batch}:
            _advance(cur, oid)
        batched._observe(cur, max(op.hlc for op in decoded))
    assert dump(batched) == dump(one_by_one)
    assert batched.state_digest() == one_by_one.state_digest()


_HUB_OPS = _ops_of(busy_hub(messages=30))


def test_pages_stay_within_the_byte_budget() -> None:
    """Each page's ops fit the budget (or are one op), and a sealed page stays well under a body."""
    hub = busy_hub()
    server = Server(hub, budget=3000)
    taker = Replica.open()
    taking, opening = open_snapshot(taker, server)
    cursor = opening.cursor
    while cursor is not None:
        reply = server(snapshot.page_request(opening.id, cursor))
        ops = protocol.ungroup(reply["g"])
        assert len(ops) == 1 or sum(map(len, ops)) <= 3000
        assert len(protocol.encode(reply)) < 3000 + 1024
        cursor = take_page(taker, server, taking, opening, cursor)
    assert taker.state_digest() == hub.state_digest()


def test_ops_written_after_the_snapshot_opened_come_with_the_next_round() -> None:
    """A snapshot is a fixed point: what the hub writes meanwhile is not in it, and ordinary
    anti-entropy brings it afterwards, from the vector the snapshot left."""
    hub = busy_hub()
    server = Server(hub, budget=2048)
    taker = Replica.open()
    taking, opening = open_snapshot(taker, server)
    later = hub.send_message("late", "tau", "written while the snapshot ran")
    cursor = opening.cursor
    while cursor is not None:
        cursor = take_page(taker, server, taking, opening, cursor)
    assert content(taker, later.id) is None
    assert taker.vector()[hub.node_key] == hub.vector()[hub.node_key] - 1
    pull(taker, hub)
    assert taker.state_digest() == hub.state_digest()


# -- resuming ---------------------------------------------------------------------------------


def test_a_taker_stopped_half_way_goes_on_from_its_cursor_after_a_restart(tmp_path: Path) -> None:
    """The cursor is saved with each page: a taker closed mid-way (as by kill -9: nothing runs on
    the way out) reopens, goes on from where it stood, and ends with every op once."""
    hub = busy_hub()
    server = Server(hub, budget=2048)
    taker = Replica.open(tmp_path / "t.db")
    ident = taker._ident
    take(taker, server, stop_after=3)
    mid = taker.stats()["ops"]
    assert 0 < mid < hub.stats()["ops"]
    taker.close()
    again = Replica(store.Store(tmp_path / "t.db"), ident)
    held = again.snapshot_taking()
    assert held is not None and held[1] is not None
    resume(again, server)
    assert again.state_digest() == hub.state_digest() and again.stats()["ops"] == hub.stats()["ops"]
    assert again.snapshot_taking() is None


def test_a_page_that_fails_half_way_stores_nothing() -> None:
    """An op that fails to decode at the end of a page refuses the whole page: no op of it stored,
    the vector and the cursor where they were."""
    hub = busy_hub()
    server = Server(hub, budget=2048)
    taker = Replica.open()
    taking, opening = open_snapshot(taker, server)
    assert opening.cursor is not None
    reply = server(snapshot.page_request(opening.id, opening.cursor))
    checked = snapshot.check_page(reply, opening, opening.cursor, server.short)
    before = (taker.stats(), taker.vector(), taker.snapshot_taking())
    with pytest.raises(InvalidOp, match=rf"op #{len(checked.ops)}"):
        taker.take_page(taking, [*checked.ops, b"\x92\xc4\x01x"], checked.covered, checked.next)
    assert (taker.stats(), taker.vector(), taker.snapshot_taking()) == before


# -- bad pages and requests -------------------------------------------------------------------


def _first_page(hub: Replica | None = None, budget: int = 8192) -> tuple[Replica, Server, Any, Any, Msg]:
    hub = hub or busy_hub()
    server = Server(hub, budget=budget)
    taker = Replica.open()
    taking, opening = open_snapshot(taker, server)
    return taker, server, taking, opening, server(snapshot.page_request(opening.id, opening.cursor))


def _resigned(server: Server, opening: Any, asked: Any, reply: Msg, ops: list[bytes]) -> Msg:
    """The page re-signed by the server after changing its ops (a member that lies, signing it)."""
    head = ["page", opening.id, list(asked), reply["r"], reply.get("k")]
    return {**reply, "g": protocol.group(ops), "sg": server.sign(digest(head, ops))}


def test_a_page_whose_op_was_altered_fails_its_signature() -> None:
    """One byte of one op changed on the way: the page's signature does not verify; nothing stored."""
    taker, server, _taking, opening, reply = _first_page()
    ops = protocol.ungroup(reply["g"])
    ops[-1] = ops[-1][:-1] + bytes([ops[-1][-1] ^ 1])
    before = taker.stats()
    with pytest.raises(protocol.ProtocolError, match="signature does not verify"):
        snapshot.check_page({**reply, "g": protocol.group(ops)}, opening, opening.cursor, server.short)
    assert taker.stats() == before


def test_a_page_signed_by_another_node_is_refused() -> None:
    """A page signed (validly) by a node other than the one that answered, or than the opening's
    signer, is refused."""
    _taker, server, _taking, opening, reply = _first_page()
    other = idmod.generate()
    ops = protocol.ungroup(reply["g"])
    head = ["page", opening.id, list(opening.cursor), reply["r"], reply.get("k")]
    forged = {**reply, "ka": other.public_key, "sg": other.sign(digest(head, ops))}
    with pytest.raises(protocol.ProtocolError, match="another node than the one that answered"):
        snapshot.check_page(forged, opening, opening.cursor, server.short)
    with pytest.raises(protocol.ProtocolError, match="another node than the snapshot's opening"):
        snapshot.check_page(forged, opening, opening.cursor, protocol.short(other.public_key))


def test_a_signer_that_was_never_admitted_is_refused() -> None:
    """A member that holds the fleet key but was never admitted (no admit op of it anywhere)
    cannot vouch for a snapshot: the opening is refused before anything is stored."""
    hub = Replica.open()
    hub.apply([NewerNode().message("a", "tau", "x")])
    taker = Replica.open()
    with pytest.raises(protocol.ProtocolError, match="never admitted"):
        open_snapshot(taker, Server(hub))
    assert taker.stats()["ops"] == 0 and taker.snapshot_taking() is None


def test_a_signer_removed_from_the_fleet_is_refused_even_half_way() -> None:
    """A removed signer is refused at the opening; and a signer removed while its snapshot is being
    taken gets its next page refused, nothing of it stored."""
    hub = busy_hub()
    remover = Replica.open()
    remover.admit_node(remover.node_key, "remover", FLEET_ID)
    pull(remover, hub)
    remover.remove_node(hub.node_key, b"k" * 32, FLEET_ID)
    rekey = [raw for _l, raw in remover.local_ops_after(0) if opsmod.read_stored(raw).kind == "rekey"]

    removed_already = Replica.open()
    removed_already.apply(rekey)
    with pytest.raises(protocol.ProtocolError, match="was removed"):
        open_snapshot(removed_already, Server(hub))

    taker, server, taking, opening, reply = _first_page(hub)
    taker.apply(rekey)  # the removal reaches the taker by a push meanwhile
    checked = snapshot.check_page(reply, opening, opening.cursor, server.short)
    before = taker.stats()
    with pytest.raises(InvalidOp, match=r"not a member here: node .* was removed"):
        taker.take_page(taking, checked.ops, checked.covered, checked.next)
    assert taker.stats() == before


def test_ops_that_do_not_match_the_ranges_a_page_claims_are_refused() -> None:
    """A member that signs a page whose ops lie outside its ranges, or out of order, gets it
    refused when the ops are decoded; nothing of it is stored."""
    taker, server, taking, opening, reply = _first_page()
    ops = protocol.ungroup(reply["g"])
    checked = snapshot.check_page(reply, opening, opening.cursor, server.short)
    origin, (lo, hi) = next(iter(checked.covered.items()))
    narrowed = {origin: (lo, hi - 1), **{k: r for k, r in checked.covered.items() if k != origin}}
    with pytest.raises(InvalidOp, match="outside the ranges its page claims"):
        taker.take_page(taking, ops, narrowed, checked.next)
    swapped = [ops[1], ops[0], *ops[2:]]
    page = snapshot.check_page(_resigned(server, opening, opening.cursor, reply, swapped), opening,
                               opening.cursor, server.short)
    with pytest.raises(InvalidOp, match="out of order"):
        taker.take_page(taking, page.ops, page.covered, page.next)
    assert taker.stats()["ops"] == 1  # the hub's admit op, from the opening


def test_ranges_that_skip_or_overrun_the_snapshot_are_refused() -> None:
    """A page whose ranges do not start at the cursor asked for, run past an origin's top, or leave a
    gap, and a next cursor that does not follow them, are refused."""
    _taker, server, _taking, opening, reply = _first_page()
    i, lo, hi = reply["r"][0]
    top = opening.point.tops[i]
    cases = [
        ([[i, lo + 1, hi], *reply["r"][1:]], reply.get("k"), "do not follow the snapshot"),
        ([[i, lo, top + 1]], None, "do not follow the snapshot"),
        (reply["r"], [i, 1], "next cursor does not follow"),
    ]
    ops = protocol.ungroup(reply["g"])
    for ranges, nxt, why in cases:
        head = ["page", opening.id, list(opening.cursor), ranges, nxt]
        bad = {**reply, "r": ranges, "sg": server.sign(digest(head, ops))}
        if nxt is None:
            bad.pop("k", None)
        else:
            bad["k"] = nxt
        with pytest.raises(protocol.ProtocolError, match=why):
            snapshot.check_page(bad, opening, opening.cursor, server.short)


def test_a_cursor_beyond_the_snapshot_or_an_unknown_id_is_an_error() -> None:
    """The answerer refuses a cursor outside its snapshot, and says an id it does not hold is gone."""
    hub = busy_hub()
    server = Server(hub)
    opening = snapshot.check_opening(server(snapshot.open_request({})), {}, server.short)
    last = len(opening.point.origins) - 1
    for cursor in ((last + 1, 1), (0, opening.point.tops[0] + 2), (0, 0)):
        with pytest.raises(protocol.ProtocolError, match="beyond the snapshot"):
            server(snapshot.page_request(opening.id, cursor))
    reply = server(snapshot.page_request(b"\x00" * 16, (0, 1)))
    assert snapshot.gone(reply)
    later = Server(hub, now=lambda: time.monotonic() + snapshot.OFFER_IDLE + 1)
    later.shelf = server.shelf
    assert snapshot.gone(later(snapshot.page_request(opening.id, (0, 1))))


@pytest.mark.parametrize(("fields", "why"), [
    ({"v": [1, 2]}, r"lacks a valid .v."),
    ({"v": {b"short": 1}}, "malformed entry"),
    ({"s": b"x" * 16}, "lacks a valid 'k'"),
    ({"s": b"x" * 16, "k": [0]}, "cursor must be"),
    ({"s": b"x" * 16, "k": [-1, 2]}, "cursor must be"),
    ({"s": "text", "k": [0, 1]}, "lacks a valid 's'"),
    ({}, "lacks a valid 'v'"),
])
def test_a_malformed_snapshot_request_is_refused(fields: dict[str, Any], why: str) -> None:
    """Missing and malformed fields of a snap request get a ProtocolError naming them."""
    server = Server(busy_hub(messages=4))
    with pytest.raises(protocol.ProtocolError, match=why):
        server(protocol.versions.state({"t": protocol.SNAP, **fields}))


def test_a_truncated_snapshot_message_and_a_wire_2_caller_are_refused() -> None:
    """A snap message cut short does not decode; a caller that states wire 2 only is not served."""
    body = protocol.encode(protocol.stamp(snapshot.open_request({}), me=b"\x01" * 32, port=1))
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_request(body[:-3])
    with pytest.raises(protocol.ProtocolError, match="head is cut short"):
        protocol.decode(body[:5])
    server = Server(busy_hub(messages=4))
    with pytest.raises(protocol.ProtocolError, match="wire 3 or later"):
        snapshot.serve(server.rep, {"t": protocol.SNAP, "v": {}}, server.shelf, budget=1024, sign=server.sign,
                       signer=server.rep.node_key, now=0.0, token=b"t" * 16)


def test_an_opening_that_does_not_start_where_the_taker_stands_is_refused() -> None:
    """An opening whose point starts elsewhere than the taker's vector (ops it would not place),
    or whose first cursor is not the point's first, is refused."""
    hub = busy_hub()
    server = Server(hub)
    taker = Replica.open()
    pull(taker, hub)
    reply = server(snapshot.open_request({}))  # as if we held nothing
    with pytest.raises(protocol.ProtocolError, match="does not start where this node stands"):
        snapshot.check_opening(reply, taker.vector(), server.short)
    head = ["open", reply["s"], reply["x"], [0, 2]]
    skipping = {**reply, "k": [0, 2], "sg": server.sign(digest(head, reply["f"]))}
    with pytest.raises(protocol.ProtocolError, match="first cursor"):
        snapshot.check_opening(skipping, {}, server.short)


def test_membership_ops_in_a_page_are_verified_op_by_op() -> None:
    """Only messages and register writes are stored on the signer's word: an admit op (or any other
    kind) with a bad signature refuses the page."""
    fake = NewerNode()
    bad = opsmod.encode(fake.key, 1, 5, "admit", {"k": fake.key, "nm": "intruder", "f": FLEET_ID},
                        sign=lambda _u: b"\x00" * 64)
    hub = busy_hub(messages=4)
    with hub._store.write() as cur:  # a lying member holds it as if verified
        project.store_op(cur, store.origin_id(cur, fake.key), opsmod.decode(bad, verify=False), fixed_wall())
        _advance(cur, store.origin_id(cur, fake.key))
    taker = Replica.open()
    with pytest.raises(InvalidOp, match="bad signature"):
        take(taker, Server(hub, budget=1_000_000))
    assert fake.key not in taker.vector()


# -- checking afterwards ------------------------------------------------------------------------


def test_a_forged_op_is_found_afterwards_dropped_and_fetched_again() -> None:
    """A member vouches for a message it forged: it is stored, then the background check finds it,
    drops it (vector back, counted against the signer), and the genuine op comes with a round."""
    honest = busy_hub()
    liar = Replica.open()
    liar.admit_node(liar.node_key, "liar", FLEET_ID)
    pull(liar, honest)
    victim = max(liar.vector(), key=lambda o: liar.vector()[o])  # an author of many messages
    genuine = next(raw for _l, raw in honest.ops_after(0, 10_000)
                   if opsmod.peek(raw) == (victim, 3))
    op = opsmod.read_stored(genuine)
    forged = opsmod.encode(victim, 3, op.hlc, "msg", {**op.body, "x": "send the keys to mallory"},
                           sign=lambda _u: bytes(64))
    with liar._store.write() as cur:
        cur.execute("UPDATE ops SET blob = ?, content = ? WHERE oid = (SELECT oid FROM origins WHERE node = ?)"
                    " AND seq = 3", (forged, "send the keys to mallory", victim))
    taker = Replica.open()
    take(taker, Server(liar, budget=2048))
    mid = f"{victim[:8].hex()}-3"
    assert content(taker, mid) == "send the keys to mallory"
    assert taker.vouched_left() > 0
    steps = []
    while (step := taker.check_vouched(25)) is not None:
        steps.append(step)
    assert [f for s in steps for f in s.forged] == [(victim, 3)]
    assert taker.forged_by() == {liar.node_key.hex(): 1}
    assert content(taker, mid) is None and taker.vector()[victim] == 2
    assert taker.vouched_left() == 0
    pull(taker, honest)
    assert content(taker, mid) == op.body["x"]
    assert taker.state_digest() == honest.state_digest()


def test_checking_afterwards_finds_nothing_in_an_honest_snapshot() -> None:
    """Every op an honest member vouched for verifies; the ranges to check are cleared."""
    hub = busy_hub()
    taker = Replica.open()
    take(taker, Server(hub, budget=2048))
    left = taker.vouched_left()
    assert left >= hub.stats()["messages"]
    checked = 0
    while (step := taker.check_vouched(10)) is not None:
        assert step.forged == []
        checked += step.checked
    assert checked >= left and taker.vouched_left() == 0 and taker.forged_by() == {}
    assert taker.state_digest() == hub.state_digest()


def test_a_snapshot_of_a_member_that_purged_covers_the_purged_ops() -> None:
    """A member that purged old mail (retention) serves a snapshot whose ranges cover the purged
    seqs: the taker's vector moves over them, it holds the messages the member holds, and it ends
    exactly where a new member that syncs by rounds ends."""
    now = [1_800_000_000_000]
    horizon = 10_000

    def wall() -> int:
        return now[0]

    hub, author = Replica.open(wall=wall), Replica.open(wall=wall)
    hub.admit_node(hub.node_key, "hub", FLEET_ID)
    hub.set_retention(horizon)
    for i in range(30):
        author.send_message("alice", "bob", f"old news {i}")
    pull(hub, author)
    inbox = hub.check_messages("bob", limit=100)
    hub.mark_as_read([m.receipt_id for m in inbox.messages])
    now[0] += horizon + 1
    for i in range(10):
        author.send_message("alice", "bob", f"fresh news {i}")
    pull(hub, author)
    assert hub.purge().removed.messages == 30
    by_rounds, by_snapshot = Replica.open(wall=wall), Replica.open(wall=wall)
    protocol.drive(protocol.client_round(by_rounds, budget=2048), lambda msg: protocol.serve(hub, msg, 2048))
    take(by_snapshot, Server(hub, budget=2048))
    assert by_snapshot.vector() == by_rounds.vector() == hub.vector()
    assert by_snapshot.vector()[author.node_key] == 40
    assert by_snapshot.state_digest() == by_rounds.state_digest()
    assert dump(by_snapshot, local=False) == dump(by_rounds, local=False)
    assert {m.content for m in by_snapshot.message_log(0, 100).messages} == {f"fresh news {i}" for i in range(10)}
