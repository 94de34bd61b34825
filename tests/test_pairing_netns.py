"""Joining and leaving a fleet between network namespaces, with mDNS, real daemons and the real CLI.

Each machine is a namespace of a ``NetnsLab`` on one LAN (bridge); daemons run ``peerd run`` with
mDNS on; the joining side runs ``peerd join`` inside its namespace, the member side ``peerd
approve`` / ``reject`` / ``invite`` / ``remove`` inside its own. Namespace labels start with ``pj``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerd.config import fleet_id, new_fleet_key
from tests.daemons import PEERD, Daemon, Fleet, wait_until
from tests.netns import NetnsLab, Node
from tests.test_discovery_daemons import in_namespace, wait_message

pytestmark = pytest.mark.netns
pytest_plugins = ["tests.daemons"]


@pytest.fixture
def lab() -> Iterator[NetnsLab]:
    with NetnsLab.create() as lab:
        yield lab


@pytest.fixture
def cluster(lab: NetnsLab, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path / "fleet")
    try:
        yield fleet
    finally:
        fleet.close()


def cli(lab: NetnsLab, node: Node, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``peerd ARGS --home HOME`` inside ``node``'s namespace, waited for."""
    return lab.run(node, [str(PEERD), *args, "--home", str(home)], check=False, timeout=120)


def cli_json(lab: NetnsLab, node: Node, home: Path, *args: str) -> Any:
    done = cli(lab, node, home, *args, "--json")
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def start_join(lab: NetnsLab, node: Node, home: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """``peerd join ARGS --json`` in ``node``'s namespace; returns once it shows its verification code."""
    proc = lab.spawn(node, [str(PEERD), "join", *args, "--home", str(home), "--json"])
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the code line comes first; pytest-timeout guards the wait
    assert line, f"join ended without a code: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}"
    return proc, json.loads(line)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def wait_past(deadline: float) -> None:
    """Let an expiry pass: the event under test is the clock passing a given time."""
    while time.time() <= deadline:
        time.sleep(0.05)


def fleet_of(d: Daemon) -> str:
    return str(d.status()["fleet_id"])


def test_two_fresh_fleets_see_each_other_and_pair_by_approval(cluster: Fleet, lab: NetnsLab) -> None:
    """Two machines that each started a fleet are told of the other; `join --lan` + `approve` pairs them
    (same code on both sides) and the joiner's running daemon switches without a restart."""
    lan = lab.lan("pja")
    na, nb = lab.node("pja0", lan), lab.node("pja1", lan)
    key_a, key_b = new_fleet_key(), new_fleet_key()
    a, b = in_namespace(cluster, na, key_a), in_namespace(cluster, nb, key_b)
    cluster.start(a, b)

    wait_until(lambda: [o["fleet_id"] for o in b.status()["other_fleets"]] == [fleet_id(key_a)], 20,
               "b to see fleet a on the LAN")
    status = b.status()
    assert status["other_fleets"][0]["nodes"][0]["name"] == a.name
    text = cli(lab, nb, b.home, "status").stdout
    assert f"another fleet {fleet_id(key_a)} is on this LAN" in text and "turn mDNS on" not in text
    doctor = json.loads(cli(lab, nb, b.home, "doctor", "--json").stdout)
    news = [f for f in doctor["findings"] if f["check"] == "fleet"]
    assert news and news[0]["status"] == "warn" and "peerd join --lan" in news[0]["fix"], news
    assert b.log_text().count(f"another peerd fleet {fleet_id(key_a)} is on this LAN") == 1

    join, shown = start_join(lab, nb, b.home, "--lan")
    assert shown["fleet_id"] == fleet_id(key_a) and shown["member"] == a.name
    requests = cli_json(lab, na, a.home, "requests")
    assert [(r["code"], r["name"]) for r in requests] == [(shown["verification_code"], b.name)]
    approved = cli_json(lab, na, a.home, "approve", shown["verification_code"])
    assert approved["approved"] == b.name
    code, out, err = finish(join)
    assert code == 0, err
    result = json.loads(out)
    assert result["fleet_id"] == fleet_id(key_a) and result["daemon"]["fleet_id"] == fleet_id(key_a)

    assert fleet_of(b) == fleet_id(key_a)
    wait_until(lambda: a.status()["other_fleets"] == [] and b.status()["other_fleets"] == [], 20,
               "no other fleet left on the LAN")
    a.send("alice", "bob", "welcome aboard")
    wait_message(b, "bob", "welcome aboard", 20)
    b.send("bob", "alice", "glad to be here")
    wait_message(a, "alice", "glad to be here", 20)


def test_rejected_request_and_one_time_codes(cluster: Fleet, lab: NetnsLab, tmp_path: Path) -> None:
    """A rejected request fails the join and leaves the home alone; wrong codes use up the tries and
    void the code; an expired code is refused; a fresh right code joins (the member found by mDNS)."""
    lan = lab.lan("pjb")
    na, nb = lab.node("pjb0", lan), lab.node("pjb1", lan)
    a = in_namespace(cluster, na, new_fleet_key())
    cluster.start(a)
    home = tmp_path / "newcomer"

    join, shown = start_join(lab, nb, home, "--lan", "--name", "newcomer")
    cli_json(lab, na, a.home, "reject", shown["verification_code"])
    code, _out, err = finish(join)
    assert code == 1 and "rejected" in err
    assert not home.exists()  # nothing was written: no key, no replica, no config

    made = cli_json(lab, na, a.home, "invite", "--code")
    right = made["code"]
    wrong = right[:3] + ("x" if right[3] != "x" else "y") + right[4:]
    errors = [cli(lab, nb, home, "join", "--code", wrong).stderr for _ in range(3)]
    assert "wrong code (2 tries left)" in errors[0] and "wrong code (1 try left)" in errors[1], errors
    assert "void" in errors[2], errors
    again = cli(lab, nb, home, "join", "--code", right)
    assert again.returncode == 1 and "void" in again.stderr, again.stderr
    assert not home.exists()

    short = cli_json(lab, na, a.home, "invite", "--code", "--expires", "1s")
    wait_past(short["expires"])
    late = cli(lab, nb, home, "join", "--code", short["code"])
    assert late.returncode == 1 and "expired" in late.stderr, late.stderr

    fresh = cli_json(lab, na, a.home, "invite", "--code")
    joined = cli_json(lab, nb, home, "join", "--code", fresh["code"], "--name", "newcomer")
    assert joined["fleet_id"] == fleet_of(a) and joined["daemon"] is None
    config = (home / "config.toml").read_text()
    assert "fleet_key" in config
    admitted = {n["name"] for n in a.api("GET", "/api/fleet")["nodes"]}
    assert "newcomer" in admitted


def test_an_invite_token_is_single_use_and_expires(cluster: Fleet, lab: NetnsLab, tmp_path: Path) -> None:
    """The first machine joins with a token; a second one with the same token is refused; an
    expired token is refused; no token carries the fleet key."""
    lan = lab.lan("pjc")
    na, n1, n2 = lab.node("pjc0", lan), lab.node("pjc1", lan), lab.node("pjc2", lan)
    key = new_fleet_key()
    a = in_namespace(cluster, na, key)
    cluster.start(a)
    made = cli_json(lab, na, a.home, "invite", "--host", na.address)
    token = made["invite"]
    from peerd.config import encode_fleet_key  # noqa: PLC0415

    assert encode_fleet_key(key) not in token and key.hex() not in token
    first = cli_json(lab, n1, tmp_path / "one", "join", token)
    assert first["fleet_id"] == fleet_id(key)
    second = cli(lab, n2, tmp_path / "two", "join", token)
    assert second.returncode == 1 and "used already" in second.stderr, second.stderr
    assert not (tmp_path / "two").exists()

    short = cli_json(lab, na, a.home, "invite", "--host", na.address, "--expires", "1s")
    wait_past(short["expires"])
    late = cli(lab, n2, tmp_path / "two", "join", short["invite"])
    assert late.returncode == 1 and "expired" in late.stderr, late.stderr


def test_removed_node_is_cut_off_and_an_offline_member_catches_up(cluster: Fleet, lab: NetnsLab) -> None:
    """`peerd remove x` on a: a and b switch to the new key, x is told it was removed and its new
    message reaches nobody while a and b keep exchanging; c, offline during the rotation, catches up."""
    lan = lab.lan("pjd")
    nodes = [lab.node(f"pjd{i}", lan) for i in range(4)]
    key = new_fleet_key()
    a, b, c, x = (in_namespace(cluster, n, key) for n in nodes)
    a.name, b.name, c.name, x.name = "a", "b", "c", "x"
    cluster.start(a, b, c, x)
    x.send("xavier", "broadcast", "x before")
    for d in (a, b, c):
        wait_message(d, "team", "x before", 30)
    c.stop()

    removed = cli_json(lab, nodes[0], a.home, "remove", "x")
    assert removed["name"] == "x" and removed["upto"] >= 1
    new_fleet = removed["fleet_id"]
    wait_until(lambda: fleet_of(a) == fleet_of(b) == new_fleet, 30, "a and b on the new fleet key")
    wait_until(lambda: x.status()["fleet"]["removed_here"], 30, "x to learn it was removed")
    assert "removed from the fleet" in cli(lab, nodes[3], x.home, "status").stdout

    x.send("xavier", "broadcast", "x after removal")
    a.send("alice", "broadcast", "a after removal")
    wait_message(b, "team", "a after removal", 30)
    b.send("bob", "broadcast", "b after removal")
    wait_message(a, "team", "b after removal", 30)

    c.restart()
    wait_until(lambda: fleet_of(c) == new_fleet, 30, "c to catch up with the rotation")
    wait_message(c, "team", "a after removal", 30)
    c.send("carol", "broadcast", "c is back")
    wait_message(a, "team", "c is back", 30)
    for d in (a, b, c):
        assert "x after removal" not in d.inbox("team"), d.name
        assert "x after removal" not in {m["content"] for m in d.api("GET", "/api/messages?limit=100")["messages"]}
