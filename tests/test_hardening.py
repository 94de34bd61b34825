"""Issue 12, item by item: bounded integers, strict peer records, loops that survive a peer's data,
refusals logged once, stale peers forgotten (pure rules and whole nodes in memory)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from discovery.seeds import parse_address
from discovery.source import SeedError
from mcp_server import FeedWaiter, Wiring, build_server
from peerd import protocol
from peerd.config import Config, new_fleet_key
from peerd.errors import TransportError
from peerd.limits import Gate, connection_cap, peer_caps
from peerd.node import Node
from peerd.peers import FAIL_THRESHOLD, MAX_PEERS, STALE_AFTER, PeerTable
from peerd.protocol import ProtocolError
from peerd.ratelog import RateLog
from peerd.seal import open_sealed, seal
from peerd.transport import Answer, HttpTransport, MemoryNetwork
from replica import InvalidOp, Replica, StoreError, hlc, identity, open_home
from replica.ops import KIND_MSG, KIND_SET, MAX_SEQ, encode, peek
from tests.daemons import PEERD
from tests.waiting import eventually

ME = b"me------"
MSG_BODY = {"f": "a", "fi": None, "c": "b", "ti": None, "t": None, "x": "hi"}


def _op(ident: identity.Identity, seq: int, kind: str = KIND_MSG, body: dict[str, Any] | None = None,
        stamp: int = 1 << 16, origin: bytes | None = None) -> bytes:
    return encode(origin or ident.public_key, seq, stamp, kind, body or MSG_BODY, sign=ident.sign)


# -- item 2: integers of 2^63 or more ---------------------------------------------------------------


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1, 0])
def test_a_signed_op_with_a_seq_outside_sqlite_is_refused(mem: Replica, seq: int) -> None:
    """A correctly signed op whose seq is 0 or >= 2^63 is an InvalidOp naming the seq; nothing is stored."""
    before = mem.state_digest(), mem.stats()
    with pytest.raises(InvalidOp, match="seq is not an integer in 1"):
        mem.apply([_op(identity.generate(), seq)])
    assert (mem.state_digest(), mem.stats()) == before


def test_a_push_naming_a_held_origin_with_a_huge_seq_is_refused_not_crashed(mem: Replica) -> None:
    """_held looks such an op up by (origin, seq) no more: peek refuses the seq, decode refuses the op."""
    mem.send_message("alice", "bob", "held origin")
    forged = _op(identity.generate(), 2**63, origin=mem.node_key)
    assert peek(forged) is None
    with pytest.raises(InvalidOp):
        mem.apply([forged])
    assert peek(_op(identity.generate(), MAX_SEQ)) is not None


@pytest.mark.parametrize(("field", "value"), [("d", 2**62), ("r", -1), ("d", True), ("r", 2**47)])
def test_receipt_times_outside_the_clock_are_refused(mem: Replica, field: str, value: object) -> None:
    """A receipt time must be wall-clock milliseconds an HLC can carry (0..2^47-1), never a bool."""
    body = {"w": [["rcpt", ["m", "role", ""], field, value]]}
    with pytest.raises(InvalidOp, match="bad value for rcpt"):
        mem.apply([_op(identity.generate(), 1, KIND_SET, body)])


def test_a_stamp_outside_the_calendar_shows_as_its_nearest_end() -> None:
    """to_iso never raises: far future and negative stamps show as 9999-12-31 and 1970-01-01."""
    assert hlc.to_iso(2**80).startswith("9999-12-31T23:59:59.999")
    assert hlc.to_iso(-(2**40)) == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize("msg", [
    {"t": "sync", "v": {b"o" * 8: 2**63}},
    {"t": "sync", "v": {b"o" * 8: -1}},
    {"t": "sync", "v": {b"o" * 7: 1}},
    {"t": "pull", "w": {b"o" * 8: 2**64 - 1}},
    {"t": "pull", "w": {b"o" * 8: True}},
])
def test_sync_requests_with_seqs_outside_sqlite_are_protocol_errors(mem: Replica, msg: protocol.Msg) -> None:
    """Vectors and wants hold short ids and seqs in 0..2^63-1; anything else is a 400, not a crash."""
    req = protocol.Request(msg["t"], msg, protocol.Envelope())
    with pytest.raises(ProtocolError, match="malformed entry"):
        protocol.dispatch(mem, req, protocol.Here(ME, "me", 4096, 0))


def test_a_page_with_ranges_outside_sqlite_fails_the_round() -> None:
    """A reply page whose ranges name seqs past 2^63 - 1 is a ProtocolError of the round."""
    a = Replica.open()
    gen = protocol.client_round(a, budget=4096)
    protocol.step(gen, None)
    diff = {"t": "diff", "v": {b"o" * 8: 3}}
    req, _ = protocol.step(gen, diff)
    assert req is not None and req["t"] == "pull"
    with pytest.raises(ProtocolError, match="page range"):
        protocol.step(gen, {"t": "page", "g": [], "r": {b"o" * 8: [1, 2**63]}, "m": False})


def test_an_envelope_port_outside_1_to_65535_reads_as_absent() -> None:
    """A caller's p of 0, 65536 or -1 (or an n that is not 8 bytes) is ignored, never dialled."""
    for port in (0, 65536, -1, 2**63):
        assert protocol.envelope({"p": port}).port is None
    assert protocol.envelope({"n": b"x" * 9, "p": 7733}) == protocol.Envelope(None, 7733, None)


# -- item 4: peer-exchange records as strict as --seed ----------------------------------------------


BAD_RECORDS = [
    {"a": "a" * 64 + ".example", "p": 7733},  # a 64-character label (the issue's UnicodeError)
    {"a": "10.0.0.1", "p": -1}, {"a": "10.0.0.1", "p": 65536}, {"a": "10.0.0.1", "p": True},
    {"a": "10.0.0.1", "p": "7733"}, {"a": "", "p": 7733}, {"a": " 10.0.0.1", "p": 7733},
    {"a": "[::1]", "p": 7733}, {"a": "10.0.0.1:80", "p": 7733}, {"a": "host\n", "p": 7733},
    {"a": "h\u00e9te", "p": 7733}, {"a": "999.1.1.1", "p": 7733}, {"a": "10.0.0.1", "p": 7733, "n": b"short"},
    {"a": 5, "p": 7733}, "not a record",
]
GOOD_RECORDS = [{"a": "10.0.0.1", "p": 7733, "n": b"N" * 8}, {"a": "::1", "p": 1}, {"a": "peer-1.example", "p": 65535}]


def test_each_bad_exchange_record_is_skipped_on_its_own() -> None:
    """One message mixing bad and good records: every bad one is dropped, every good one kept."""
    learnt = protocol.learn({"k": [*BAD_RECORDS, *GOOD_RECORDS]})
    assert [(r.host, r.port) for r in learnt.peers] == [("10.0.0.1", 7733), ("::1", 1), ("peer-1.example", 65535)]


@given(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.binary(max_size=10)),
       st.one_of(st.integers(min_value=-(2**64), max_value=2**64), st.booleans(), st.text(max_size=6), st.none()))
def test_a_learnt_address_is_one_a_seed_could_be(host: object, port: object) -> None:
    """Whatever a record holds, learn keeps it only when parse_address (the --seed rules) accepts it."""
    learnt = protocol.learn({"k": [{"a": host, "p": port}]})
    try:
        want = parse_address(host, port)
    except SeedError:
        assert learnt.peers == ()
    else:
        assert [(r.host, r.port) for r in learnt.peers] == [(want.host, want.port)]


async def test_a_host_no_url_can_hold_is_a_transport_error() -> None:
    """Dialling a host with a 64-character label names the failure instead of raising UnicodeError."""
    http = HttpTransport(max_body=1000, total=5)
    try:
        with pytest.raises(TransportError) as caught:
            await http.post("a" * 64 + ".example:7733", b"x")
        assert caught.value.kind == "unreachable"
    finally:
        await http.close()


# -- the peer table stays bounded and current ---------------------------------------------------------


def test_learnt_peers_that_never_answer_are_forgotten() -> None:
    """An exchange-learnt peer failing FAIL_THRESHOLD times with no answer is dropped; seeds never are."""
    t = PeerTable(ME)
    learnt = t.add("10.0.0.1", 1, "exchange", now=0.0)
    seed = t.add("10.0.0.2", 1, "seed", now=0.0)
    assert learnt is not None and seed is not None
    for i in range(FAIL_THRESHOLD):
        assert t.expire(float(i)) == []
        t.failed(learnt, float(i), "refused")
        t.failed(seed, float(i), "refused")
    assert t.expire(10.0) == [learnt]
    assert list(t.peers) == [seed.addr]


def test_a_learnt_peer_that_stops_answering_expires_after_stale_after() -> None:
    """A peer that once answered is kept while failing until STALE_AFTER has passed since it last did."""
    t = PeerTable(ME)
    peer = t.add("10.0.0.1", 1, "inbound", now=0.0)
    assert peer is not None
    t.succeeded(peer, 5.0, None)
    t.failed(peer, 6.0, "timeout")
    assert t.expire(5.0 + STALE_AFTER - 1) == []
    assert t.expire(5.0 + STALE_AFTER) == [peer]


def test_the_table_stops_taking_learnt_peers_when_full() -> None:
    """Past MAX_PEERS rows, exchange and inbound candidates are refused; a seed still gets in."""
    t = PeerTable(ME)
    for i in range(MAX_PEERS):
        t.add(f"10.{i // 250}.{i % 250}.1", 1, "exchange")
    assert t.add("10.99.0.1", 1, "exchange") is None and t.add("10.99.0.2", 1, "inbound") is None
    assert t.add("10.99.0.3", 1, "seed") is not None


# -- resource bounds: caps under the open-file limit, the gate, the rate log ---------------------------


def test_both_ports_fit_under_the_open_file_limit() -> None:
    """Each port takes at most a quarter of the soft limit, so both at their caps leave half free."""
    for soft in (64, 256, 1024, 4096, 65536):
        total, per_source = peer_caps(soft)
        local = connection_cap(soft, 512)
        assert total + local <= max(soft // 2, 32) and 1 <= per_source <= total
    assert peer_caps(-1) == (1024, 32)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), max_size=200))
def test_the_gate_never_lets_a_source_or_the_port_past_its_cap(events: list[tuple[str, bool]]) -> None:
    """Any sequence of opens and closes: per-source and total counts stay within the caps and add up."""
    gate = Gate(total=5, per_source=3)
    held: list[str] = []
    for source, opening in events:
        if opening:
            if gate.admit(source):
                held.append(source)
        elif source in held:
            held.remove(source)
            gate.release(source)
        assert gate.count == len(held) <= 5
        assert all(gate.held(s) == held.count(s) <= 3 for s in "abc")


@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.floats(0, 5)), max_size=300))
def test_the_rate_log_writes_a_burst_then_one_summary_per_window(steps: list[tuple[str, float]]) -> None:
    """At most 2 x burst lines per source in any window-long span; every other event is told once in a summary."""
    log = RateLog(burst=3, window=10.0, max_sources=2)
    now, written, told = 0.0, 0, 0
    lines: dict[str, list[float]] = {"x": [], "y": []}
    for source, gap in steps:
        now += gap
        verdict = log.note(source, now)
        written += verdict.write
        if verdict.write:
            lines[source].append(now)
            assert sum(now - t < 10.0 for t in lines[source]) <= 6
        told += sum(n for _, n in log.due(now))
    told += sum(n for _, n in log.due(now + 1e9))
    assert written + told == len(steps)


@given(st.lists(st.tuples(st.integers(0, 9).map(str), st.floats(0, 5)), max_size=300))
def test_the_rate_log_stays_bounded_and_loses_no_count(steps: list[tuple[str, float]]) -> None:
    """More sources than it tracks: it keeps at most max_sources windows, and still tells every event once."""
    log = RateLog(burst=2, window=10.0, max_sources=3)
    now, told, written = 0.0, 0, 0
    for source, gap in steps:
        now += gap
        written += log.note(source, now).write
        told += sum(n for _, n in log.due(now))
        assert len(log._windows) <= 3
    assert written + told + sum(n for _, n in log.due(now + 1e9)) == len(steps)


def test_the_rate_log_tells_a_flood_in_one_summary() -> None:
    """1,500 events in a minute from one source: 5 written, one summary of 1,495 when it ends."""
    log = RateLog()
    verdicts = [log.note("1.2.3.4", i / 100) for i in range(1500)]
    assert sum(v.write for v in verdicts) == 5
    assert [v.flush_at for v in verdicts if v.flush_at is not None] == [60.0]
    assert log.due(59.0) == [] and log.due(60.0) == [("1.2.3.4", 1495)] and log.due(1e9) == []


# -- whole nodes: refusals, loops that survive, last errors ------------------------------------------


class Nodes:
    def __init__(self) -> None:
        self.net = MemoryNetwork()
        self.key = new_fleet_key()
        self.nodes: list[Node] = []

    async def add(self, name: str, port: int, *seeds: Node, **settings: Any) -> Node:
        cfg = Config(name=name, fleet_key=self.key, port=port, local_port=0, mdns=False,
                     seeds=tuple(f"127.0.0.1:{s.peer_port}" for s in seeds),
                     **{"gossip_interval": 0.2, "gossip_max_interval": 0.5, **settings})
        node = Node(cfg, Replica.open(), bind="127.0.0.1", transport=self.net.transport())
        await node.start()
        self.nodes.append(node)
        return node

    async def close(self) -> None:
        for node in self.nodes:
            await node.stop()
            node.rep.close()


@pytest.fixture
async def nodes() -> AsyncIterator[Nodes]:
    n = Nodes()
    try:
        yield n
    finally:
        await n.close()


class BadRecords:
    """A node whose peer lists carry bad records around one good one."""

    def __init__(self, node: Node, good_port: int) -> None:
        self.node = node
        self.good_port = good_port

    async def answer(self, body: bytes, remote: str) -> Answer:
        answer = await self.node.answer(body, remote)
        reply = protocol.decode(open_sealed(self.node.cfg.fleet_key, answer.body))
        if reply.get("t") == "peers":
            reply["k"] = [*BAD_RECORDS, {"a": "127.0.0.1", "p": self.good_port}]
        return Answer(answer.status, seal(self.node.cfg.fleet_key, protocol.encode(reply)))

    def refuse(self, remote: str, why: str) -> None:
        self.node.refuse(remote, why)


async def test_bad_exchange_records_teach_only_the_good_one_and_log_nothing(
        nodes: Nodes, caplog: pytest.LogCaptureFixture) -> None:
    """A peer list full of bad records (64-character label, ports -1, 65536, true): no error, no traceback,
    the peer stays healthy, and only the one good record becomes a candidate."""
    caplog.set_level(logging.INFO)
    b = await nodes.add("b", 7101)
    c = await nodes.add("c", 7102)
    nodes.net.servers["127.0.0.1:7101"] = BadRecords(b, c.peer_port)
    a = await nodes.add("a", 7100, b)
    await eventually(lambda: "127.0.0.1:7102" in a.table.peers, 10, "c learnt from b's list")
    row = a.table.peers["127.0.0.1:7101"]
    assert row.reachable and row.last_error is None and a.counters["exchange_failures"] == 0
    assert set(a.table.peers) <= {"127.0.0.1:7101", "127.0.0.1:7102"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_an_exception_from_a_peers_data_is_counted_shown_and_logged_once(
        nodes: Nodes, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exception in a round (here: learning a peer list raises UnicodeError) is recorded against
    that peer as its last error, counted, logged once with its traceback; gossip goes on."""
    caplog.set_level(logging.WARNING, logger="peerd.node")
    b = await nodes.add("b", 7201)
    a = await nodes.add("a", 7200, b)
    await eventually(lambda: a.table.peers.get("127.0.0.1:7201") and a.table.peers["127.0.0.1:7201"].reachable,
                     10, "b reachable")

    def boom(_msg: protocol.Msg) -> protocol.Learnt:
        raise UnicodeError("label empty or too long")

    monkeypatch.setattr(protocol, "learn", boom)  # b's own exchanges (if any now) fail too, told by b
    peer = a.table.peers["127.0.0.1:7201"]
    await a._round(peer, exchange=True)
    told = [r for r in caplog.records if r.exc_info]
    assert told and "logged once" in told[-1].getMessage()
    for _ in range(3):
        await a._round(peer, exchange=True)
    report = {r["address"]: r for r in await a.peers_report()}
    assert "internal error: UnicodeError: label empty or too long" in (report["127.0.0.1:7201"]["last_error"] or "")
    assert report["127.0.0.1:7201"]["reachable"], "like a refused exchange, a failing one leaves the peer reachable"
    assert a.counters["peer_errors"] >= 4 and a.counters["internal_errors"] >= 4
    # a logs once; b may log once of its own (its exchanges with a fail too while learn is patched)
    logged = [r for r in caplog.records if r.exc_info]
    assert logged[: len(told)] == told and len(logged) <= 2, "logged once per node, not every loop"
    monkeypatch.undo()
    rounds = a.counters["rounds"]
    await eventually(lambda: a.counters["rounds"] > rounds, 10, "gossip going on after the failures")


async def test_a_store_failure_while_answering_is_a_503_not_a_crash(
        nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that cannot be read answers 503 with a sealed error; a bug of ours answers 500; neither raises."""
    a = await nodes.add("a", 7300)
    body = seal(nodes.key, protocol.encode({"t": "sync", "v": {}}))

    def locked() -> dict[bytes, int]:
        raise StoreError("database is locked")

    monkeypatch.setattr(a.rep, "vector", locked)
    assert (await a.answer(body, "10.0.0.5")).status == 503
    monkeypatch.setattr(a.rep, "vector", lambda: 1 / 0)
    assert (await a.answer(body, "10.0.0.5")).status == 500
    assert a.counters["internal_errors"] == 1


async def test_refusals_are_counted_always_and_logged_at_most_a_burst_then_summed_up(
        nodes: Nodes, caplog: pytest.LogCaptureFixture) -> None:
    """200 bodies that do not open: 200 counted, 5 lines, then one summary line when the window ends."""
    caplog.set_level(logging.WARNING, logger="peerd.node")
    a = await nodes.add("a", 7400)
    a._refusals = RateLog(window=0.5)
    for _ in range(200):
        assert (await a.answer(b"not sealed", "10.9.9.9")).status == 403
    assert a.counters["refused"] == 200
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5 and all(line.startswith("refused request from 10.9.9.9") for line in lines)
    await eventually(lambda: any("suppressed 195 more" in r.getMessage() for r in caplog.records), 10,
                     "the summary line")
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_peer_learnt_second_hand_that_never_answers_is_dropped(nodes: Nodes) -> None:
    """An exchange record naming nothing that listens: tried, failed, then gone from the table."""
    a = await nodes.add("a", 7500)
    a.add_candidate("127.0.0.1", 7599, source="exchange")
    await eventually(lambda: "127.0.0.1:7599" not in a.table.peers, 20, "the dead row expired")
    assert a.counters["expired_peers"] == 1


def test_msgpack_garbage_in_a_push_is_a_protocol_error(mem: Replica) -> None:
    """Ops that are not byte strings, or bytes that are not ops, get a 400-class error, never a crash."""
    for ops in ([1, 2], [b"\xc1"], [msgpack.packb([b"x", b"y"])]):
        req = protocol.Request("push", {"t": "push", "o": ops}, protocol.Envelope())
        with pytest.raises((ProtocolError, InvalidOp)):
            protocol.dispatch(mem, req, protocol.Here(ME, "me", 4096, 0))


@settings(max_examples=50)
@given(st.integers(min_value=1, max_value=MAX_SEQ))
def test_every_seq_up_to_2_63_minus_1_is_held_to_the_signature(seq: int) -> None:
    """Within range, only the signature decides: a valid op of any seq decodes."""
    ident = identity.generate()
    assert peek(_op(ident, seq)) == (ident.public_key, seq)


async def test_gossip_goes_on_after_a_scheduling_bug(nodes: Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception while picking peers is logged once and the schedule keeps ticking."""
    b = await nodes.add("b", 7601)
    a = await nodes.add("a", 7600, b)
    real = a.table.pick
    calls = {"n": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(a.table, "pick", flaky)
    a._wake.set()
    await eventually(lambda: calls["n"] > 3 and a.counters["rounds"] > 0, 15, "rounds after the bug")
    assert a.counters["internal_errors"] >= 2


# -- MCP and the command line ------------------------------------------------------------------------


@pytest.fixture
def served_replica(tmp_path: Path) -> Iterator[tuple[Replica, FeedWaiter]]:
    rep = open_home(tmp_path / "home")
    wiring = Wiring.over(rep)
    yield rep, wiring.waiter
    wiring.close()
    rep.close()


def _text(result: Any) -> str:
    return str(result.content[0].text)


@pytest.mark.parametrize(("tool", "args", "expected"), [
    ("search_messages", {"query": "\x00"}, "invalid_argument: query must not contain NUL characters"),
    ("search_messages", {"query": "a", "since": 2**63}, "invalid_argument: 'since'"),
    ("check_messages", {"recipient": "bob", "since": 2**64}, "invalid_argument: since must be between 0 and"),
    ("send_message", {"from": "a", "channel": "b", "content": "\ud800"},
     "invalid_argument: 'content': is not valid Unicode (it holds a lone surrogate)"),
    ("message_status", {"messageId": "0123456789abcdef-99999999999999999999"}, "not_found: unknown message id"),
    ("check_messages", {"recipient": "bob", "wait": float("inf")}, "invalid_argument: 'wait'"),
])
async def test_mcp_arguments_of_the_issue_get_clear_errors(served_replica: tuple[Replica, FeedWaiter], tool: str,
                                                           args: dict[str, Any], expected: str) -> None:
    """A NUL search, integers of 2^63 or more, a lone surrogate, 19-digit ids: clear errors, nothing written."""
    rep, waiter = served_replica
    before = rep.state_digest()
    async with Client(build_server(rep, waiter=waiter)) as client:  # entered and left in this task, as anyio wants
        result = await client.call_tool(tool, args)
    assert result.is_error and _text(result).startswith(expected), _text(result)
    assert rep.state_digest() == before


async def test_a_bug_in_a_tool_is_internal_error_and_logged_once(
        served_replica: tuple[Replica, FeedWaiter], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """run_tool catches everything: a handler's ZeroDivisionError becomes internal_error (not the SDK's
    generic text), logged with its traceback the first time and in one line after that."""
    rep, waiter = served_replica
    caplog.set_level(logging.ERROR, logger="mcp_server")

    def broken(_r: Replica) -> list[Any]:
        return [1 / 0]

    monkeypatch.setattr(Replica, "list_profiles", broken)
    async with Client(build_server(rep, waiter=waiter)) as client:
        for _ in range(3):
            result = await client.call_tool("list_peers", {})
            assert result.is_error and _text(result) == "internal_error: ZeroDivisionError: division by zero"
        assert (await client.call_tool("whoami", {})).is_error is False, "the server goes on"
    ours = [r for r in caplog.records if r.name == "mcp_server"]
    assert len(ours) == 3 and [bool(r.exc_info) for r in ours] == [True, False, False]


@pytest.mark.parametrize("argv", [
    [b"send", b"--from", b"a", b"--to", b"b", b"\xed\xa0\x80"],  # a UTF-8-encoded lone surrogate
    [b"search", b"\xff"],
    [b"profile", b"\xff"],
])
def test_an_argument_that_is_not_utf8_is_a_usage_error(tmp_path: Path, argv: list[bytes]) -> None:
    """`peerd send` (and any command) with undecodable bytes: exit 2 and one line, never a traceback."""
    open_home(tmp_path / "home").close()
    proc = subprocess.run([bytes(PEERD), *argv, b"--home", bytes(tmp_path / "home")], capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(b"peerd: argument ") and b"is not valid UTF-8 text" in proc.stderr
    assert b"Traceback" not in proc.stderr
