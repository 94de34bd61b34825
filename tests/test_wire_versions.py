"""Wire negotiation on a real daemon: a peer that speaks no wire version in common is told once,
shown in ``peerd peers`` and by ``peerd doctor``, and never called again in a loop; the peer table's
rules on their own."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from peerd import protocol
from peerd.config import decode_fleet_key
from peerd.peers import PeerTable
from peerd.protocol import versions
from peerd.seal import open_sealed, seal
from tests.daemons import PEERD, Fleet, wait_until

pytest_plugins = ["tests.daemons"]

FUTURE = frozenset({4, 5})


class FuturePeer:
    """A peer port of a release that speaks only wire 4 and 5: it opens our sealed requests (it is
    in the fleet) and answers each with a sealed 400 that states its versions, as this release does."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.requests = 0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                open_sealed(peer.key, self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with peer.lock:
                    peer.requests += 1
                reply = {"t": "error", "e": "this peerd speaks wire 4 and 5 only", "n": b"\x45" * 8,
                         versions.KEY: versions.mask(FUTURE)}
                body = seal(peer.key, protocol.encode(reply))
                self.send_response(400)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


def test_a_peer_with_no_version_in_common_is_told_once_and_left_alone(fleet: Fleet) -> None:
    """A daemon seeded with a wire-4/5 peer and a real one: one log line naming both sides' versions,
    the peer shown as WIRE none in ``peerd peers`` and warned of by ``peerd doctor``, and no further
    request to it while rounds with the real peer go on."""
    future = FuturePeer(decode_fleet_key(fleet.key))
    with future.serving() as address:
        a, _ = fleet.add("a"), fleet.add("b")
        fleet.mesh()
        a.seeds.append(address)
        fleet.start()
        row = wait_until(lambda: next((p for p in a.peers() if p["address"] == address and p["wire"]), None), 30,
                         "the future peer's versions in a's peer table")
        assert "speaks wire 4, 5, this peerd speaks 2, 3: no version in common" in row["wire"]
        assert not row["reachable"]
        calls, rounds = future.requests, a.status()["counters"]["rounds"]
        wait_until(lambda: a.status()["counters"]["rounds"] >= rounds + 4, 90, "four more rounds of a with b")
        assert future.requests == calls, "the daemon kept calling a peer it cannot talk to"
        told = [line for line in a.log_text().splitlines() if "no version in common" in line]
        assert len(told) == 1 and "not contacted until it states a version in common" in told[0]

        shown = subprocess.run([str(PEERD), "peers", "--home", str(a.home)], capture_output=True, text=True,
                               timeout=60, check=True).stdout
        line = next(ln for ln in shown.splitlines() if ln.startswith(address))
        assert " none " in line and "no version in common" in line
        doctor = subprocess.run([str(PEERD), "doctor", "--home", str(a.home), "--json"], capture_output=True,
                                text=True, timeout=60, check=False)
        found = [f for f in json.loads(doctor.stdout)["findings"] if f["subject"] == address]
        assert found and "no version in common" in found[0]["detail"] and "upgrade" in found[0]["fix"]


def test_the_table_never_picks_an_incompatible_peer_until_it_speaks_again() -> None:
    """An incompatible peer is not live, not due, not a push target, and says so once; a statement
    of versions in common makes it a peer again."""
    table = PeerTable(b"me" * 4)
    peer = table.add("10.0.0.2", 7733, "seed", b"p" * 8)
    assert peer is not None
    table.succeeded(peer, 1.0, b"p" * 8)
    assert table.live() == [peer] and not peer.takes_every_op  # versions not known yet: first release only
    assert peer.set_wire(FUTURE) is True
    assert peer.set_wire(FUTURE) is False  # told once
    assert table.live() == [] and table.due(2.0) == [] and table.push_targets(3) == []
    assert "no version in common" in str(peer.wire_text())
    assert peer.set_wire(frozenset({3, 4})) is False
    assert table.live() == [peer] and peer.takes_every_op and peer.wire_text() == "3"
    peer.set_wire(frozenset({2}))
    assert peer.wire_text() == "2" and not peer.takes_every_op
