"""``peerd retention`` as a user runs it: set, show and clear, the guard on short horizons, a removed node."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from replica import Replica, open_home
from tests.conftest import pull
from tests.daemons import PEERD

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def run(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, env=ENV,
                          timeout=60, check=False)


def ok(*argv: str, home: Path) -> str:
    proc = run(*argv, home=home)
    assert proc.returncode == 0, f"peerd {' '.join(argv)} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def ops_held(home: Path) -> int:
    with open_home(home) as rep:
        return rep.max_lseq()


def test_set_show_and_clear_the_horizon(tmp_path: Path) -> None:
    """show says keep everything; set 30d writes the op and says what it means; clear and set forever undo it."""
    home = tmp_path / "n"
    ok("init", "--name", "n", home=home)
    assert "retention  forever: nothing is purged (the default)" in ok("retention", "show", home=home)
    out = ok("retention", "set", "30d", home=home)
    assert "retention horizon set to 30d for the whole fleet" in out and "after 60 days" in out
    assert "no daemon runs for this home" in out
    shown = ok("retention", "show", home=home)
    assert "retention  30d: messages older than 30 days leave every replica (unread ones after 60 days)" in shown
    assert "by this node" in shown
    assert json.loads(ok("retention", "show", "--json", home=home))["horizon_ms"] == 30 * 86_400_000
    assert "keeps everything from now on" in ok("retention", "clear", home=home)
    assert json.loads(ok("retention", "show", "--json", home=home))["horizon"] == "forever"
    ok("retention", "set", "12h", "--force", home=home)
    ok("retention", "set", "forever", home=home)
    assert json.loads(ok("retention", "show", "--json", home=home))["horizon_ms"] == 0


def test_a_short_horizon_needs_force_and_says_what_it_would_purge(tmp_path: Path) -> None:
    """Under a day, set refuses without --force, names how many messages would go, and writes nothing."""
    home = tmp_path / "n"
    ok("init", "--name", "n", home=home)
    ok("send", "--from", "a", "--to", "b", "hello", home=home)
    before = ops_held(home)
    proc = run("retention", "set", "10s", home=home)
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert "purges every read message older than 10 seconds" in proc.stderr and "every replica" in proc.stderr
    assert ops_held(home) == before
    # 12 hours: as forced as 10 s, and the message just sent is not past it however slow this machine is
    assert "Held here and past it now: 0 message(s)" in ok("retention", "set", "12h", "--force", home=home)


def test_bad_durations_and_missing_homes_get_their_exit_codes(tmp_path: Path) -> None:
    """A duration that is not one is a usage error (2); no home is exit 4; nothing is created."""
    home = tmp_path / "n"
    ok("init", "--name", "n", home=home)
    for bad in ("30", "2x", "1w", "0s"):
        proc = run("retention", "set", bad, home=home)
        assert proc.returncode == 2 and "horizon" in proc.stderr, bad
    missing = tmp_path / "nowhere"
    assert run("retention", "show", home=missing).returncode == 4 and not missing.exists()


def test_a_removed_node_is_told_it_cannot_set_the_horizon(tmp_path: Path) -> None:
    """On a node the fleet removed, set says why it cannot and writes nothing."""
    home = tmp_path / "x"
    ok("init", "--name", "x", home=home)
    ok("send", "--from", "x", "--to", "team", "before", home=home)
    member = Replica.open()
    with open_home(home) as x:
        x.admit_node(member.node_key, "member", "0" * 16)  # x founded the fleet and let member in
        member.set_fleet_roots(frozenset({x.node_key}))
        pull(member, x)
        member.remove_node(x.node_key, os.urandom(32), "0" * 16)
        pull(x, member)
        before = x.max_lseq()
    proc = run("retention", "set", "30d", home=home)
    assert proc.returncode == 1 and "this node was removed from the fleet" in proc.stderr
    assert ops_held(home) == before
