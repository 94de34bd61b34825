"""The current code beside a real earlier release (0.1.0, built from the repository's history by
``tests/baseline.py``): a mixed fleet, a replica upgraded from 0.1.0, a replica 0.1.0 must refuse,
and an op of a kind 0.1.0 does not know. Real daemons as separate processes, seeded with each
other, mDNS off."""

from __future__ import annotations

import subprocess
from pathlib import Path

from msgpack import unpackb

from replica import identity, key_path, open_home
from replica import ops as opsmod
from replica import schema as current_schema
from replica.core import now_ms
from replica.hlc import tick
from tests.baseline import (
    BASELINE_SCHEMA,
    BaselineApi,
    CurrentApi,
    Mail,
    Receipt,
    contents,
    schema_version,
)
from tests.daemons import PEERD, Fleet, integrity_check, patience, read_only, wait_until

pytest_plugins = ["tests.daemons", "tests.baseline"]

# A kind neither release knows (this release's leases are ``lease.take`` and its kin).
UNKNOWN_KIND = "lease"
# Refusals the baseline may log: none. The current daemon sends a peer whose versions it does not know
# yet only what the first release takes, so not even first contact costs a refused request.
MAX_REFUSALS = 0


def mixed_pair(fleet: Fleet, baseline_peerd: Path) -> tuple[BaselineApi, CurrentApi]:
    """A baseline daemon and a current daemon, seeded with each other, running and reaching each other."""
    old, new = fleet.add("old", executable=baseline_peerd), fleet.add("new")
    fleet.mesh()
    fleet.start()
    b, c = BaselineApi(old), CurrentApi(new)
    wait_until(lambda: b.reaches(new) and c.reaches(old), 30, "the baseline and the current daemon to reach each other")
    return b, c


def assert_converged(*apis: BaselineApi) -> None:
    """Equal state digests, then equal visible state (both releases define the digest alike: messages,
    retractions, registers, first-seen times; the visible state says what differs if they do not)."""
    digests: set[str] = set()

    def same() -> bool:
        digests.clear()
        digests.update(a.digest() for a in apis)
        return len(digests) == 1

    wait_until(same, 30, f"equal digests on {apis}", interval=0.1)
    first, *others = [a.visible_state() for a in apis]
    for api, state in zip(apis[1:], others, strict=True):
        assert state == first, f"{api} shows another state than {apis[0]}"


def contents_of(mail: list[Mail]) -> list[str]:
    return sorted(m.content for m in mail)


def read_states(receipts: list[Receipt]) -> set[tuple[str, bool, bool]]:
    return {(r.role, r.delivered, r.read) for r in receipts}


def deliver_and_read(src: BaselineApi, dst: BaselineApi, sender: str, direct: str, pair: tuple[str, str],
                     earlier: tuple[str, ...] = ()) -> str:
    """``sender`` on ``src`` writes to ``direct``, to both roles of ``pair`` and to everyone; each
    recipient on ``dst`` gets exactly its mail (plus the ``earlier`` broadcasts, which reach roles
    first seen after them) and reads it; ``src`` sees each recipient's delivered and read state.
    Returns the broadcast's content."""
    way = f"{src.daemon.name} -> {dst.daemon.name}"
    text = {"direct": f"to {direct} ({way})", "pair": f"to {pair} ({way})", "all": f"to everyone ({way})"}
    ids = {"direct": src.send(sender, direct, text["direct"]), "pair": src.send(sender, ",".join(pair), text["pair"]),
           "all": src.send(sender, "broadcast", text["all"])}
    wait_until(lambda: all(dst.has_message(m) for m in ids.values()), 30, f"{way}: the three messages")
    wanted = {direct: [text["direct"]], pair[0]: [text["pair"]], pair[1]: [text["pair"]]}
    for role, mine in wanted.items():
        mail = dst.inbox(role)
        assert contents_of(mail) == sorted([*mine, text["all"], *earlier]), f"{way}: {role}'s inbox"
        assert {m.sender for m in mail if m.content in mine} == {sender}
        assert dst.mark_read([m.receipt_id for m in mail]) == len(mail)

    def all_read() -> bool:
        return (read_states(src.receipts(ids["direct"])) == {(direct, True, True)}
                and read_states(src.receipts(ids["pair"])) == {(pair[0], True, True), (pair[1], True, True)}
                and {r.role for r in src.receipts(ids["all"]) if r.read} == set(wanted))

    wait_until(all_read, 30, f"{way}: the sender to see every recipient's read receipt")
    return text["all"]


def test_mixed_fleet_carries_messages_and_receipts_both_ways(fleet: Fleet, baseline_peerd: Path) -> None:
    """Baseline and current daemon exchange direct, multi-role and broadcast mail both ways, each sender
    sees its recipients' receipts, and the two replicas converge."""
    old, new = mixed_pair(fleet, baseline_peerd)
    first = deliver_and_read(old, new, "ann", "bob", ("tau", "phi"))
    deliver_and_read(new, old, "cat", "dan", ("rho", "chi"), earlier=(first,))
    assert_converged(old, new)


def test_mixed_fleet_shares_profiles_and_threads_both_ways(fleet: Fleet, baseline_peerd: Path) -> None:
    """A profile written on either release shows on the other with its fields, merged key by key; a
    thread started on the baseline is seen and answered on the current daemon, and back."""
    old, new = mixed_pair(fleet, baseline_peerd)
    static = {"role": "reviewer", "workspace": "/srv/ann", "capabilities": ["review", "merge"]}
    old.set_profile("ann", "Ann", static, {"currentTask": "reading the diff", "sessionCount": 3})
    wanted = {"name": "Ann", "static": static, "dynamic": {"currentTask": "reading the diff", "sessionCount": 3}}
    wait_until(lambda: new.profile("ann") == old.profile("ann") == wanted, 30, "ann's profile on the current daemon")
    new.set_profile("ann", "Ann", dynamic={"currentTask": "writing the review"})
    wanted["dynamic"] = {"currentTask": "writing the review", "sessionCount": 3}
    wait_until(lambda: old.profile("ann") == wanted, 30, "the current daemon's change of ann's task on the baseline")
    new.set_profile("cat", "Cat", {"role": "builder"}, {"currentTask": "a release"})
    wait_until(lambda: old.profile("cat") == new.profile("cat") is not None, 30, "cat's profile on the baseline")

    thread = old.create_thread(["ann-agent", "cat-agent"])
    old.append(thread, "ann-agent", "shall we cut 0.2.0?")
    wait_until(lambda: new.threads().get(thread) == {"participants": ["ann-agent", "cat-agent"], "messages": 1}, 30,
               "the baseline's thread on the current daemon")
    assert new.thread_messages(thread) == [("ann-agent", "shall we cut 0.2.0?")]
    new.append(thread, "cat-agent", "after the mixed-fleet test passes")
    answered = [("ann-agent", "shall we cut 0.2.0?"), ("cat-agent", "after the mixed-fleet test passes")]
    wait_until(lambda: old.thread_messages(thread) == answered, 30, "the current daemon's answer in the baseline's thread")
    assert_converged(old, new)


def write_history(api: BaselineApi) -> str:
    """Messages (direct, to two roles, to everyone, to one instance), receipts delivered and read,
    profiles and a thread, all on one daemon; returns the id of a message left unread."""
    api.send("ann", "bob", "read by bob")
    api.send("ann", "tau,phi", "to tau and phi")
    api.send("ann", "broadcast", "to everyone")
    unread = api.send("ann", "bob", "to bob's laptop only", instance="laptop")
    mail = api.inbox("bob")
    assert api.mark_read([m.receipt_id for m in mail if m.content == "read by bob"]) == 1
    assert contents_of(api.inbox("tau")) == ["to everyone", "to tau and phi"]  # delivered, left unread
    api.set_profile("ann", "Ann", {"role": "reviewer", "capabilities": ["review"]},
                    {"currentTask": "reviewing", "sessionCount": 2})
    api.set_profile("bob", "Bob", {"workspace": "/srv/bob"}, {"currentTask": "building"})
    thread = api.create_thread(["ann-agent", "bob-agent"])
    api.append(thread, "ann-agent", "first")
    api.append(thread, "bob-agent", "second")
    return unread


def test_baseline_replica_opens_in_the_current_version_with_nothing_lost(fleet: Fleet, baseline_peerd: Path) -> None:
    """A home written by a baseline daemon (messages, receipts, profiles, threads), run by the current
    version: the same node, the same messages, receipts, profiles and threads, the same state digest,
    and it keeps working."""
    node = fleet.add("node", executable=baseline_peerd)
    fleet.start(node)
    old = BaselineApi(node)
    unread = write_history(old)
    before, digest, node_id = old.visible_state(local=True), old.digest(), node.node_id
    assert node.stop() == 0

    node.executable = PEERD
    node.start()
    new = CurrentApi(node)
    assert node.node_id == node_id
    assert new.visible_state(local=True) == before
    assert new.digest() == digest
    assert read_states(new.receipts(unread)) == {("bob", False, False)}
    assert contents_of(new.inbox("phi")) == ["to everyone", "to tau and phi"]
    later = new.send("ann", "phi", "after the upgrade")
    assert contents_of(new.inbox("phi")) == ["after the upgrade", "to everyone", "to tau and phi"]
    assert read_states(new.receipts(later)) == {("phi", True, False)}


def test_baseline_refuses_a_replica_of_the_current_version_cleanly(fleet: Fleet, baseline_peerd: Path) -> None:
    """A home the current version has opened: the baseline's inbox, status and run exit non-zero
    saying the schema is newer, print no traceback, and leave the replica as it was."""
    node = fleet.add("node")
    fleet.start(node)
    api = CurrentApi(node)
    sent = api.send("ann", "bob", "written by the current version")
    assert node.stop() == 0
    version = schema_version(node.db)
    assert version == current_schema.LATEST
    assert version > BASELINE_SCHEMA, (f"the current version writes replica schema v{version}, as the baseline does: "
                                       "nothing for the baseline to refuse until the schema changes")
    before = contents(node.db)
    home = ["--home", str(node.home)]
    for argv in (["inbox", "bob"], ["status", sent], ["run", "--port", "0", "--local-port", "0", "--bind", "127.0.0.1",
                                                       "--no-mdns"]):
        done = subprocess.run([str(baseline_peerd), *argv, *home], capture_output=True, text=True, check=False,
                              timeout=patience(60), stdin=subprocess.DEVNULL)
        said = done.stdout + done.stderr
        assert done.returncode != 0, f"baseline peerd {argv[0]} accepted a schema v{version} replica: {said}"
        assert "Traceback" not in said, said
        assert f"schema v{version} is newer" in said, said
    assert integrity_check(node.db) == "ok"
    assert contents(node.db) == before
    node.start()
    assert api.has_message(sent)


def write_unknown_op(home: Path) -> int:
    """As the node of ``home`` (its own key), sign an op of a kind the baseline does not know at
    the node's next seq, and store it through ``Replica.apply``, as a newer release would have
    written it; returns its seq."""
    with open_home(home) as rep:
        ident = identity.load_or_create(key_path(home / "replica.db"))
        assert ident.public_key == rep.node_key
        seq = rep.vector().get(rep.node_key, 0) + 1
        body = {"p": "src/app.py", "x": True, "ttl": 60_000}
        raw = opsmod.encode(rep.node_key, seq, tick(rep.clock(), now_ms()), UNKNOWN_KIND, body, sign=ident.sign)
        result = rep.apply([raw])
        assert result.new == 1, f"the {UNKNOWN_KIND!r} op at seq {seq} was not stored: {result}"
        return seq


def test_an_op_of_a_kind_the_baseline_does_not_know_never_stalls_its_mail(fleet: Fleet, baseline_peerd: Path) -> None:
    """After the current node writes an op the baseline would refuse, the baseline still gets every
    later message of the current node, pushed on write and repaired by rounds after a restart; its
    own mail still reaches the current node; and it does not log refusals in a loop."""
    old, new = mixed_pair(fleet, baseline_peerd)
    sent = ["before the unknown op"]
    first = new.send("cat", "dan", sent[0])
    wait_until(lambda: old.has_message(first), 30, "the first message on the baseline")
    write_unknown_op(new.daemon.home)

    pushed = [new.send("cat", "dan", f"pushed {i}") for i in range(3)]
    sent += [f"pushed {i}" for i in range(3)]
    wait_until(lambda: all(old.has_message(m) for m in pushed), 30, "the messages after the unknown op, pushed")

    assert old.daemon.stop() == 0
    repaired = [new.send("cat", "dan", f"while the baseline was down {i}") for i in range(3)]
    sent += [f"while the baseline was down {i}" for i in range(3)]
    old.daemon.start()
    wait_until(lambda: all(old.has_message(m) for m in repaired), 30, "the messages after the unknown op, by rounds")
    assert contents_of(old.inbox("dan")) == sorted(sent)

    back = old.send("dan", "cat", "from the baseline after the unknown op")
    wait_until(lambda: new.has_message(back), 30, "the baseline's message on the current daemon")
    assert [m.content for m in new.inbox("cat")] == ["from the baseline after the unknown op"]

    refused, rounds = old.counter("refused"), new.counter("rounds")
    wait_until(lambda: new.counter("rounds") >= rounds + 3, 60, "three more rounds of the current daemon")
    assert old.counter("refused") == refused, "the baseline kept refusing requests round after round"
    said = [line for line in old.daemon.log_text().splitlines() if "refused" in line]
    assert refused <= MAX_REFUSALS and len(said) <= MAX_REFUSALS, "\n".join(said)


def test_this_releases_own_new_kind_never_reaches_the_baseline(fleet: Fleet, baseline_peerd: Path) -> None:
    """The current daemon sets a retention horizon (a ``ret`` op, a kind 0.1.0 does not know) and goes
    on writing: the baseline gets every later message, never the ``ret`` op, and refuses nothing."""
    old, new = mixed_pair(fleet, baseline_peerd)
    subprocess.run([str(PEERD), "retention", "set", "3650d", "--home", str(new.daemon.home)], check=True,
                   capture_output=True, timeout=60)
    later = [new.send("cat", "dan", f"after the horizon was set {i}") for i in range(3)]
    wait_until(lambda: all(old.has_message(m) for m in later), 30, "the messages after the ret op on the baseline")
    old.daemon.stop()
    more = new.send("cat", "dan", "while the baseline was down")
    old.daemon.start()
    wait_until(lambda: old.has_message(more), 30, "the message after the ret op, by rounds")
    with read_only(old.daemon.db) as conn:
        kinds = {str(unpackb(unpackb(bytes(blob))[0])[4]) for (blob,) in conn.execute("SELECT blob FROM ops")}
    assert "ret" not in kinds and "msg" in kinds
    assert old.counter("refused") == 0


def test_a_role_pin_never_reaches_the_baseline_and_refuses_its_sends_in_the_role(fleet: Fleet,
                                                                                 baseline_peerd: Path) -> None:
    """The current daemon pins a role (a ``pin`` op, a kind 0.1.0 does not know): the baseline never gets
    the op and refuses nothing; a message it then sends in the pinned role's name is refused by the
    current daemon (counted), and the baseline's later mail still arrives."""
    old, new = mixed_pair(fleet, baseline_peerd)
    subprocess.run([str(PEERD), "role", "pin", "cat", new.daemon.node_id, "--home", str(new.daemon.home)],
                   check=True, capture_output=True, timeout=60)
    later = new.send("cat", "dan", "after the pin")
    wait_until(lambda: old.has_message(later), 30, "the message after the pin op on the baseline")
    forged = old.send("cat", "dan", "in cat's name from the baseline")
    after = old.send("dan", "cat", "the baseline's own role")
    wait_until(lambda: new.has_message(after), 30, "the baseline's later message on the current daemon")
    assert not new.has_message(forged)
    assert new.daemon.status()["totals"]["pin_refused"] == 1
    with read_only(old.daemon.db) as conn:
        kinds = {str(unpackb(unpackb(bytes(blob))[0])[4]) for (blob,) in conn.execute("SELECT blob FROM ops")}
    assert "pin" not in kinds


def test_leases_and_acknowledgements_never_reach_the_baseline(fleet: Fleet, baseline_peerd: Path) -> None:
    """The current node takes a file reservation and asks for and records an acknowledgement (ops
    0.1.0 does not know) between messages: the baseline gets every message and its read mark, never
    the lease or acknowledgement ops, and refuses nothing."""
    old, new = mixed_pair(fleet, baseline_peerd)
    with open_home(new.daemon.home) as rep:  # as `peerd mcp` writes: the daemon notices and pushes
        rep.reserve("repo", "cat", ["src/"], reason="refactor")
        mid = rep.send_message("cat", "dan", "please acknowledge").id
        rep.require_ack(mid)
        rep.acknowledge(mid, "dan")
    later = [new.send("cat", "dan", f"after the lease {i}") for i in range(3)]
    wait_until(lambda: all(old.has_message(m) for m in [mid, *later]), 30, "the messages around the lease ops")
    with read_only(old.daemon.db) as conn:
        kinds = {str(unpackb(unpackb(bytes(blob))[0])[4]) for (blob,) in conn.execute("SELECT blob FROM ops")}
    assert not {k for k in kinds if k.startswith("lease.")} and "msg" in kinds
    assert old.counter("refused") == 0


def test_a_fleet_of_the_baseline_upgraded_one_machine_at_a_time_keeps_every_member(fleet: Fleet,
                                                                                     baseline_peerd: Path) -> None:
    """Two baseline machines that share the fleet key and only ever admitted themselves (all 0.1.0
    knew): upgraded one at a time, each upgraded machine keeps the other as a member (its mail is
    taken, both ways, at every step), and neither says it is no member."""
    one, two = fleet.add("one", executable=baseline_peerd), fleet.add("two", executable=baseline_peerd)
    fleet.mesh()
    fleet.start()
    old_one, old_two = BaselineApi(one), BaselineApi(two)
    first = old_one.send("ann", "bob", "from one on 0.1.0")
    wait_until(lambda: old_two.has_message(first), 30, "one's message on two, both on the baseline")

    assert one.stop() == 0
    one.executable = PEERD
    one.start()
    new_one = CurrentApi(one)
    from_old = old_two.send("cat", "dan", "from two, still on 0.1.0")
    wait_until(lambda: new_one.has_message(from_old), 30, "the baseline machine's later mail on the upgraded one")
    from_new = new_one.send("ann", "bob", "from one, upgraded")
    wait_until(lambda: old_two.has_message(from_new), 30, "the upgraded machine's mail on the baseline one")
    assert one.status()["fleet"]["admitted_here"] is True

    assert two.stop() == 0
    two.executable = PEERD
    two.start()
    new_two = CurrentApi(two)
    both = [new_two.send("cat", "dan", "from two, upgraded"), new_one.send("ann", "bob", "from one, both upgraded")]
    wait_until(lambda: all(new_one.has_message(m) and new_two.has_message(m) for m in both), 30,
               "mail both ways once both are upgraded")
    for d in (one, two):
        assert d.status()["fleet"]["admitted_here"] is True
        assert all(n["admitted"] and not n["removed"] for n in d.api("GET", "/api/fleet")["nodes"])
    assert_converged(new_one, new_two)
