"""Daemon lifecycle: clean stop on SIGTERM and SIGINT, same node id after restart, one daemon per
home, clear errors for taken ports."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import pytest

from tests.daemons import PEERD, Fleet, patience, wait_until

pytest_plugins = ["tests.daemons"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_and_restart_keeps_the_node_id(fleet: Fleet, sig: signal.Signals) -> None:
    """The daemon exits 0 on the signal, removes daemon.json, and comes back as the same node
    with its messages."""
    d = fleet.add("solo")
    fleet.start(d)
    assert json.loads((d.home / "daemon.json").read_text()) == d.info, "the ready line is daemon.json"
    node = d.node_id
    mid = d.send("a", "b", "survives the restart")["messageId"]
    assert d.proc is not None
    d.proc.send_signal(sig)
    assert d.proc.wait(timeout=patience(15)) == 0
    assert not (d.home / "daemon.json").exists()
    d.start()
    assert d.node_id == node
    assert d.has_message(mid)


def test_second_daemon_on_one_home_is_refused(fleet: Fleet) -> None:
    """A second `peerd run` on a home in use exits 1 saying so, and the first keeps running."""
    d = fleet.add("solo")
    fleet.start(d)
    out = subprocess.run([str(PEERD), "run", "--home", str(d.home), "--port", "0", "--local-port", "0",
                          "--no-mdns"], capture_output=True, text=True, timeout=patience(60), check=False)
    assert out.returncode == 1
    assert out.stdout == "", "no ready line from a daemon that did not start"
    assert "another peerd is already running" in out.stderr
    assert d.running and d.status()["node_id"] == d.node_id
    assert (d.home / "daemon.json").exists()


def test_taken_port_is_a_clear_error(fleet: Fleet) -> None:
    """A peer port already in use stops start-up with a message naming the port and the way out."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    try:
        d = fleet.add("solo")
        fleet.init([d])
        out = subprocess.run([str(PEERD), "run", "--home", str(d.home), "--port", str(port), "--bind", "127.0.0.1",
                              "--local-port", "0", "--no-mdns"], capture_output=True, text=True, timeout=patience(60),
                             check=False)
    finally:
        blocker.close()
    assert out.returncode == 1
    assert f"cannot listen for peers on 127.0.0.1:{port}" in out.stderr and "--port" in out.stderr
    assert "Traceback" not in out.stderr
    wait_until(lambda: not (d.home / "daemon.json").exists(), 1, "no daemon.json left behind")
