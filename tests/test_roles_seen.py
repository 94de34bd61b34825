"""A typo'd role is caught on the read side too: reading the inbox of a role nobody has seen warns
(naming the close known roles, as a send does); a role seen only reading stays unconfirmed (sends to
it still warn, ``peerd roles`` lists it as such) until it sends or sets a profile, and can be
forgotten on every replica (``peerd roles forget``). Replicas in memory, the real CLI on a home with
no daemon, and one real daemon for the local API."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from replica import Replica, firstseen, migrate
from replica import ops as opsmod
from replica.errors import InvalidArgument, NotFound
from replica.service import Service
from tests.conftest import pull
from tests.daemons import PEERD, Fleet

pytest_plugins = ["tests.daemons"]

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def inbox(r: Replica, role: str) -> dict[str, object]:
    return Service(r).inbox(role, now_ms=r._wall())


def standing(r: Replica, role: str) -> str | None:
    with r._store.read() as cur:
        return firstseen.status(cur, role)


def test_reading_a_never_seen_role_warns_and_leaves_it_unconfirmed() -> None:
    """A typo'd reader gets its (empty) inbox with a warning naming the close confirmed role; it is
    then unconfirmed: a send to it still warns (its next read is quiet: it was seen)."""
    r = Replica.open()
    r.update_profile("coder", name="Coder")
    r.send_message("planner", "coder", "task 12")
    first = inbox(r, "codr")
    assert first["messages"] == [] and "has not been seen" in str(first["warning"])
    assert "Did you mean 'coder'?" in str(first["warning"]) and "Known roles: coder, planner." in str(first["warning"])
    assert standing(r, "codr") == firstseen.UNCONFIRMED
    assert inbox(r, "codr")["warning"] is None
    sent = Service(r).send("planner", "codr", "again")
    assert sent.check.unknown_recipients == ("codr",) and sent.check.unconfirmed == ("codr",)
    assert "only been seen reading an inbox" in str(sent.warning) and "'coder'" in str(sent.warning)
    assert inbox(r, "coder")["warning"] is None  # a confirmed role reads without one


def test_sending_or_a_profile_confirms_a_role_which_then_cannot_be_forgotten() -> None:
    r = Replica.open()
    inbox(r, "qa")
    inbox(r, "ops")
    r.send_message("qa", "ops", "hello")
    r.update_profile("ops", name="Ops")
    for role in ("qa", "ops"):
        assert standing(r, role) == firstseen.CONFIRMED and inbox(r, role)["warning"] is None
        with pytest.raises(InvalidArgument, match="only a role seen only reading"):
            r.forget_role(role)
    assert r.recipient_check("qa, ops").unknown_recipients == ()
    with pytest.raises(NotFound):
        r.forget_role("nobody")


def test_a_forgotten_role_is_unknown_again_and_leaves_the_broadcasts_recipients() -> None:
    """After a forget, sends warn as for a role never seen, ``role_senders`` no longer lists it, and
    a broadcast it had read no longer counts it; a later read makes it unconfirmed again."""
    r = Replica.open()
    b = r.send_message("planner", "broadcast", "freeze on Thursday")
    inbox(r, "codr")
    assert [s.role for s in r.message_status(b.id)] == ["codr"]
    assert [(x.role, x.status) for x in r.role_senders()] == [("codr", "unconfirmed"), ("planner", "confirmed")]
    gone = r.forget_role("CODR")
    assert gone.role == "codr" and gone.first_seen is not None
    assert r.message_status(b.id) == []
    assert [x.role for x in r.role_senders()] == ["planner"]
    assert r.recipient_check("codr").unconfirmed == () and r.recipient_check("codr").unknown_recipients == ("codr",)
    assert "has not been seen" in str(inbox(r, "codr")["warning"])
    assert standing(r, "codr") == firstseen.UNCONFIRMED


def test_a_forget_replicates_and_a_read_after_it_counts_everywhere() -> None:
    """The forget is an op: a peer that pulls it forgets the role too, also one whose clock runs
    behind; a read after the forget (on any replica) makes the role known again everywhere."""
    a, b = Replica.open(wall=lambda: 10**12 + 30_000), Replica.open(wall=lambda: 10**12)  # b's clock runs behind
    inbox(a, "codr")
    pull(b, a)
    assert standing(b, "codr") == firstseen.UNCONFIRMED
    a.forget_role("codr")
    pull(b, a)
    assert standing(b, "codr") is None and standing(a, "codr") is None
    inbox(b, "codr")  # written after the forget it holds: it counts, whatever b's clock says
    pull(a, b)
    assert standing(a, "codr") == standing(b, "codr") == firstseen.UNCONFIRMED
    assert a.state_digest() == b.state_digest()


def test_a_word_for_everyone_points_to_broadcast() -> None:
    r = Replica.open()
    r.send_message("planner", "coder", "hi")
    for word in ("all", "Everyone", "broadcst"):
        sent = Service(r).send("planner", word, "to everyone?")
        assert "Did you mean 'broadcast'?" in str(sent.warning), sent.warning
        assert "broadcast" not in sent.check.known_roles  # not a role: only the sentence names it
    assert firstseen.close(["all"], ["coder"]) == ["broadcast"]


def run(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, timeout=60,
                          env=ENV, check=False)


def test_the_cli_warns_on_a_typo_lists_it_unconfirmed_and_forgets_it(tmp_path: Path) -> None:
    """``peerd inbox codr`` warns on stderr and says how to undo it (its next read is quiet); ``peerd
    roles`` shows it unconfirmed; ``peerd roles forget codr`` makes a send to it warn as for a role
    never seen."""
    home = tmp_path / "home"
    assert run("init", home=home).returncode == 0
    assert run("send", "--from", "coder", "--to", "planner", "ready", home=home).returncode == 0
    read = run("inbox", "codr", home=home)
    assert read.returncode == 0 and read.stdout == "no unread messages\n"
    assert "warning: role 'codr' has not been seen" in read.stderr and "Did you mean 'coder'?" in read.stderr
    assert f"peerd roles forget codr --home {home}" in read.stderr
    assert json.loads(run("inbox", "codr", "--json", home=home).stdout)["warning"] is None
    roles = run("roles", home=home)
    assert [line.split()[:2] for line in roles.stdout.splitlines()[1:3]] == [["coder", "confirmed"],
                                                                            ["codr", "unconfirmed"]], roles.stdout
    assert "forget one with: peerd roles forget ROLE" in roles.stdout
    listed = {r["role"]: r["status"] for r in json.loads(run("roles", "--json", home=home).stdout)}
    assert listed == {"codr": "unconfirmed", "coder": "confirmed"}
    assert "only been seen reading" in run("send", "--from", "x", "--to", "codr", "hi", home=home).stderr
    forgot = run("roles", "forget", "codr", home=home)
    assert forgot.returncode == 0 and "forgot role 'codr'" in forgot.stdout, forgot.stderr
    assert "codr" not in run("roles", home=home).stdout
    assert "'codr' has not been seen" in run("send", "--from", "x", "--to", "codr", "hi", home=home).stderr
    refused = run("roles", "forget", "coder", home=home)
    assert refused.returncode == 1 and "only a role seen only reading" in refused.stderr
    assert "Did you mean 'broadcast'?" in run("send", "--from", "x", "--to", "all", "hi", home=home).stderr


def test_the_local_api_inbox_carries_the_warning(fleet: Fleet) -> None:
    a = fleet.add("a")
    fleet.start()
    a.send("coder", "planner", "ready")
    typo = a.check("codr")
    assert typo["messages"] == [] and "Did you mean 'coder'?" in typo["warning"]
    assert a.check("coder")["warning"] is None


def test_a_release_before_forgets_holds_one_and_applies_it_on_upgrade(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A release of op level 4 does not know ``seen.forgot``: it stores the forget as a newer op, relays
    it byte for byte and still knows the role; this release opening the file forgets it. A first-release
    peer is never offered it."""
    a = Replica.open()
    inbox(a, "codr")
    a.forget_role("codr")
    raws = a.ops_missing({}, 1 << 20).ops
    forget = opsmod.read_stored(raws[-1])
    assert forget.understood and not forget.v1
    before = {**opsmod.LWW_SCHEMA, "seen": ((1,), {"at": opsmod.LWW_SCHEMA["seen"][1]("at")}.get)}
    db = tmp_path / "r.db"
    with monkeypatch.context() as m:
        m.setattr(opsmod, "LWW_SCHEMA", before)
        m.setattr(opsmod, "OP_LEVEL", 4)
        m.setattr(migrate, "OP_LEVEL", 4)
        with Replica.open(db) as r:
            r.apply(raws)
            assert r.newer_ops() == {"set": 1} and standing(r, "codr") == firstseen.UNCONFIRMED
            assert r.ops_missing({}, 1 << 20).ops == raws
    with Replica.open(db) as r:
        assert r.stats()["newer_ops"] == 0 and standing(r, "codr") is None
        assert r.state_digest() == a.state_digest()
