"""An IPv6-only pair of members (network namespaces with no IPv4 address but loopback) finds
each other by a ``[addr]:port`` seed, converges and delivers; the peer port listens dual-stack by
default, daemon.json and the peer table carry the IPv6 addresses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Daemon, Fleet, wait_until
from tests.netns import NetnsLab

pytest_plugins = ["tests.daemons"]
pytestmark = pytest.mark.netns

PORT = 7851
SPREAD = 20.0


@pytest.fixture
def v6pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    with NetnsLab.create() as lab:
        lan = lab.lan("six")
        nodes = []
        for label in ("a", "b"):
            node = lab.bare_node(label)
            lab.attach(node, lan, ipv6=True)
            nodes.append(node)
        fleet = Fleet(tmp_path / "fleet")
        try:
            a = fleet.add("a", port=PORT, host=nodes[0].address, bind="::", exec_prefix=nodes[0].exec_prefix(),
                          transport=fleet.relay(nodes[0].exec_prefix()))
            b = fleet.add("b", port=PORT + 1, host=nodes[1].address, bind="::", exec_prefix=nodes[1].exec_prefix(),
                          transport=fleet.relay(nodes[1].exec_prefix()), seeds=[a])
            assert lab.run(nodes[0], ["ip", "-o", "-4", "addr", "show", "scope", "global"]).stdout == ""
            fleet.start()
            yield a, b
        finally:
            fleet.close()


def test_an_ipv6_only_pair_converges_and_delivers(v6pair: tuple[Daemon, Daemon]) -> None:
    """b, seeded with a's ``[fd77:..]:port``, syncs with it; mail goes both ways; each knows the
    other by its IPv6 address."""
    a, b = v6pair
    assert b.seeds == [f"[{a.host}]:{a.port}"]
    assert a.info["peer_url"] == f"http://[{a.host}]:{a.port}"
    sent = a.send("alice", "bob", "over IPv6")
    wait_until(lambda: b.has_message(sent["messageId"]), SPREAD, "a's message on b")
    back = b.send("bob", "alice", "and back")
    wait_until(lambda: a.has_message(back["messageId"]), SPREAD, "b's answer on a")
    wait_until(lambda: any(p["address"] == b.addr and p["reachable"] for p in a.peers()), SPREAD,
               "a to know b by its IPv6 address")
    assert [m["content"] for m in b.check("bob")["messages"]] == ["over IPv6"]
