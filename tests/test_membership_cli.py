"""``peerd init --fleet-key`` and ``peerd admit`` as a user runs them: a home given only the key says it
is no member and what to run; a member lets it in by its node id; bad ids and non-members are told
why, with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from peerd.config import encode_fleet_key, load_config, new_fleet_key
from replica import open_home
from tests.daemons import PEERD

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def run(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, env=ENV,
                          timeout=60, check=False)


def ok_json(*argv: str, home: Path) -> dict[str, object]:
    proc = run(*argv, "--json", home=home)
    assert proc.returncode == 0, f"peerd {' '.join(argv)} exited {proc.returncode}: {proc.stderr}"
    out: dict[str, object] = json.loads(proc.stdout)
    return out


def ops_held(home: Path) -> int:
    with open_home(home) as rep:
        return rep.max_lseq()


def test_a_home_given_the_key_is_let_in_by_a_member(tmp_path: Path) -> None:
    """The founder's home counts itself a member; a home made with the fleet key does not, and says
    the admit to run; once the member's admit reaches it, it trusts the member and counts itself in."""
    founder, newcomer = tmp_path / "founder", tmp_path / "newcomer"
    made = ok_json("init", "--name", "founder", home=founder)
    assert made["member"] is True
    key = encode_fleet_key(load_config(founder / "config.toml").fleet_key)
    proc = run("init", "--name", "build-7", "--fleet-key", key, home=newcomer)
    assert proc.returncode == 0
    node = json.loads(run("init", "--json", home=newcomer).stdout)["node_id"]
    assert "not a member yet" in proc.stdout and f"peerd admit {node} --name build-7" in proc.stdout

    out = ok_json("admit", node, "--name", "build-7", home=founder)
    assert out == {"admitted": node, "name": "build-7", "fleet_id": made["fleet_id"]}
    with open_home(founder) as f, open_home(newcomer) as n:
        n.apply(f.membership_ops())
        assert n.fleet_view().standing.counts(n.node_key) and f.fleet_view().standing.counts(n.node_key)
    assert json.loads(run("init", "--json", home=newcomer).stdout)["member"] is True


def test_admit_refuses_what_it_cannot_do_and_writes_nothing(tmp_path: Path) -> None:
    """Not a whole node id: a usage error (2). From a home nobody let in: exit 1 saying so. Either way
    the replica is as it was."""
    founder, stranger = tmp_path / "founder", tmp_path / "stranger"
    ok_json("init", "--name", "founder", home=founder)
    before = ops_held(founder)
    for bad in ("8aff4b74", "zz" * 32, ""):
        proc = run("admit", bad, home=founder)
        assert proc.returncode == 2 and "64 hex digits" in proc.stderr, (bad, proc.stderr)
    assert ops_held(founder) == before
    run("init", "--name", "stranger", "--fleet-key", encode_fleet_key(new_fleet_key()), home=stranger)
    held = ops_held(stranger)
    proc = run("admit", "ab" * 32, home=stranger)
    assert proc.returncode == 1 and "never admitted to the fleet" in proc.stderr
    assert ops_held(stranger) == held
