"""Joining with consent, end to end in one process: a real member node (replica, pairing host) of
the in-memory fleet answering a real joiner (``Guest``), on the fleet's clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from peerd.config import Config, new_fleet_key
from peerd.invite import issue, parse_invite, records
from peerd.node import Node
from peerd.pairing import codes
from peerd.pairing.crypto import PairingError
from peerd.pairing.guest import Guest, Joiner
from peerd.protocol import join as wire
from peerd.transport import JOIN_PATH
from replica import Replica, identity
from tests.memfleet import MemFleet

pytest_plugins = ["tests.memfleet"]


class Pair:
    """One member node of the in-memory fleet and the means to make joiners on its network."""

    def __init__(self, fleet: MemFleet, node: Node) -> None:
        self.fleet = fleet
        self.net = fleet.net
        self.node = node
        self.addr = f"127.0.0.1:{node.peer_port}"

    def joiner(self, name: str = "laptop", host: str = "10.0.0.9") -> Guest:
        ident = identity.generate()
        return Guest(self.net.transport(host), Joiner(ident.public_key, ident.signing_key, name))

    async def post(self, kind: str, host: str = "10.0.0.9", **fields: object) -> tuple[int, dict[str, object]]:
        answer = await self.net.transport(host).post(self.addr, wire.request(kind, **fields), JOIN_PATH)
        from peerd.protocol.wire import decode_map as decode  # noqa: PLC0415

        return answer.status, decode(answer.body)


@pytest.fixture
async def pair(memfleet: MemFleet, tmp_path: Path) -> AsyncIterator[Pair]:
    yield Pair(memfleet, await memfleet.add("alpha", home=tmp_path))


def admitted(pair: Pair) -> dict[bytes, object]:
    """The nodes the member let in (every node also records itself)."""
    return {k: a for k, a in pair.node.rep.fleet_view().admitted.items() if k != pair.node.rep.node_key}


async def wait_for_request(pair: Pair) -> dict[str, object]:
    """The one join request the member shows, once it shows one (its code is known)."""
    rows = await pair.fleet.until(pair.node.pairing.requests, 10, step=0.1)
    return rows[0]


async def test_approval_lets_the_machine_in_with_the_fleet_key_sealed_to_it(pair: Pair) -> None:
    """Both sides show the same code; approving hands the joiner the fleet key and records an admit op."""
    guest = pair.joiner("laptop")
    shown: list[str] = []
    task = asyncio.create_task(guest.ask(pair.addr, lambda code, _asked: shown.append(code)))
    row = await wait_for_request(pair)
    assert shown == [row["code"]] and row["name"] == "laptop"
    out = await pair.node.pairing.approve(str(row["code"]))
    grant = await task
    assert grant.fleet_key == pair.node.keys.current and grant.member_name == "alpha"
    assert out["approved"] == "laptop"
    view = pair.node.rep.fleet_view()
    assert view.admitted[guest.me.key].name == "laptop"
    assert view.admitted[guest.me.key].fleet_id == pair.node.keys.fleet_id
    assert pair.node.pairing.requests() == []


async def test_reject_ends_the_joiners_wait_with_a_clear_error(pair: Pair) -> None:
    """A rejected request fails the join, and nothing is recorded on the member."""
    task = asyncio.create_task(pair.joiner().ask(pair.addr, lambda _c, _a: None))
    row = await wait_for_request(pair)
    pair.node.pairing.reject(str(row["code"]))
    with pytest.raises(PairingError, match="rejected"):
        await task
    assert admitted(pair) == {}


async def test_an_expired_request_cannot_be_approved_and_the_joiner_is_told(pair: Pair) -> None:
    """Past its time, a request is gone: approve says no such request, the joiner hears it expired."""
    pair.node.pairing.desk.ask_ttl = 0.3
    task = asyncio.create_task(pair.joiner().ask(pair.addr, lambda _c, _a: None))
    row = await wait_for_request(pair)
    await pair.fleet.until(task.done, 5, step=0.1)  # the member's clock passes the request's time
    with pytest.raises(PairingError, match="expired"):
        await task
    with pytest.raises(Exception, match="no join request waits"):
        await pair.node.pairing.approve(str(row["code"]))
    assert admitted(pair) == {}


async def test_a_one_time_code_lets_one_machine_in_once(pair: Pair) -> None:
    """The right code joins; the same code again is refused as used."""
    code = codes.parse_code(str(pair.node.pairing.new_code(60)["code"]))
    assert code is not None
    grant = await pair.joiner("one").code(pair.addr, code)
    assert grant.fleet_key == pair.node.keys.current
    with pytest.raises(PairingError, match="used already"):
        await pair.joiner("two").code(pair.addr, code)
    assert [a.name for a in admitted(pair).values()] == ["one"]


async def test_wrong_codes_use_up_the_tries_then_even_the_right_one_is_void(pair: Pair) -> None:
    """Each wrong code says how many tries are left; after the last, the code is void."""
    code = codes.parse_code(str(pair.node.pairing.new_code(60)["code"]))
    assert code is not None
    wrong = code[:2] + ("2" if code[2] != "2" else "3") + code[3:]
    with pytest.raises(PairingError, match=r"wrong code \(2 tries left\)"):
        await pair.joiner().code(pair.addr, wrong)
    with pytest.raises(PairingError, match=r"wrong code \(1 try left\)"):
        await pair.joiner().code(pair.addr, wrong)
    with pytest.raises(PairingError, match="void"):
        await pair.joiner().code(pair.addr, wrong)
    with pytest.raises(PairingError, match="void"):
        await pair.joiner().code(pair.addr, code)
    assert admitted(pair) == {}


async def test_an_expired_code_is_refused(pair: Pair) -> None:
    """A code past its time says it expired."""
    code = codes.parse_code(str(pair.node.pairing.new_code(0.2)["code"]))
    assert code is not None
    await pair.fleet.advance(0.3)  # the event under test: the member's clock passes the code's time
    with pytest.raises(PairingError, match="expired"):
        await pair.joiner().code(pair.addr, code)


async def test_an_invite_works_once_and_holds_no_fleet_key(pair: Pair, tmp_path: Path) -> None:
    """A token redeems once; the second use is refused naming who used it; the key is not in it."""
    token, inv = issue(tmp_path, [pair.addr], pair.node.keys.fleet_id, ttl=60)
    assert pair.node.keys.current not in token.encode() and pair.node.keys.current not in inv.secret
    grant = await pair.joiner("first").redeem(pair.addr, parse_invite(token))
    assert grant.fleet_key == pair.node.keys.current
    with pytest.raises(PairingError, match="used already \\(by first"):
        await pair.joiner("second").redeem(pair.addr, parse_invite(token))
    assert records(tmp_path)[inv.id.hex()]["used"]["by"] == "first"


async def test_an_expired_invite_is_refused(pair: Pair, tmp_path: Path) -> None:
    """An invite past its expiry is refused, and nothing is recorded."""
    token, _inv = issue(tmp_path, [pair.addr], pair.node.keys.fleet_id, ttl=60, now=time.time() - 61)
    with pytest.raises(PairingError, match="expired"):
        await pair.joiner().redeem(pair.addr, parse_invite(token))
    assert admitted(pair) == {}


async def test_a_removed_node_cannot_join_again_under_its_key(pair: Pair) -> None:
    """A node the fleet removed is refused at once, with the way out in the message."""
    guest = pair.joiner("old")
    pair.node.rep.admit_node(guest.me.key, "old", pair.node.keys.fleet_id)
    pair.node.rep.remove_node(guest.me.key, new_fleet_key(), "0" * 16)
    with pytest.raises(PairingError, match="fresh home"):
        await guest.ask(pair.addr, lambda _c, _a: None)


async def test_garbage_and_oversized_join_requests_get_clear_refusals(pair: Pair) -> None:
    """Malformed requests get 400 naming the field; unknown ids 404; nothing is created."""
    status, body = await pair.post("ask", k=b"short", nm="x", c=b"c" * 32)
    assert (status, body["e"]) == (400, "join request 'ask' lacks a valid 'k'")
    status, body = await pair.post("wait", id=b"x" * 16)
    assert (status, body["e"]) == (404, "no such join request on this member")
    status, body = await pair.post("nonsense")
    assert status == 400 and "unknown join request kind" in str(body["e"])
    answer = await pair.net.transport().post(pair.addr, b"\xc1" * 10, JOIN_PATH)
    assert answer.status == 400
    assert pair.node.pairing.desk.asks == {}


async def test_one_source_cannot_flood_the_desk(pair: Pair) -> None:
    """Pending requests are capped per source, and a fast source is rate-limited (429)."""
    statuses = []
    for _ in range(12):
        status, _body = await pair.post("ask", host="10.6.6.6", k=b"k" * 32, nm="spam", c=b"c" * 32)
        statuses.append(status)
    assert statuses[:3] == [200, 200, 200]
    assert set(statuses[3:]) == {429}
    assert len(pair.node.pairing.desk.asks) == 3


async def test_the_join_route_over_real_http_is_bounded(tmp_path: Path) -> None:
    """On a real aiohttp peer port: an oversized join body gets 413, garbage 400, a good ask 200."""
    from peerd.node import http_transport  # noqa: PLC0415
    from peerd.protocol.wire import decode_map as decode  # noqa: PLC0415

    cfg = Config(name="alpha", fleet_key=new_fleet_key(), port=0, local_port=0, mdns=False)
    node = Node(cfg, Replica.open(":memory:"), bind="127.0.0.1", transport=http_transport(cfg), home=tmp_path)
    await node.start()
    client = http_transport(cfg)
    addr = f"127.0.0.1:{node.peer_port}"
    try:
        assert (await client.post(addr, b"x" * 3000, JOIN_PATH)).status == 413
        assert (await client.post(addr, b"\xc1", JOIN_PATH)).status == 400
        good = await client.post(addr, wire.request(wire.ASK, k=b"k" * 32, nm="n", c=b"c" * 32), JOIN_PATH)
        assert good.status == 200 and decode(good.body)["t"] == wire.ASKED
        assert node.counters["refused"] >= 1
    finally:
        await client.close()
        await node.stop()
        node.rep.close()
