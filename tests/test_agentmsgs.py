"""AgentMsgs' Python API on peerd: its README examples run with only their import lines changed."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replica import NotFound, Replica, StoreError, open_home
from replica.agentmsgs import Agent, App, InMemoryStore, Message, SQLiteStore, Thread
from tests.daemons import Fleet, wait_until

pytest_plugins = ["tests.daemons"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def app() -> Iterator[App]:
    with App(store=InMemoryStore()) as a:
        yield a


# -- the README, verbatim but for the imports ------------------------------------------------------
# Each example is AgentMsgs' README text with only its import lines changed (the originals are in
# the comments), run as it stands.

QUICK_START = """
from replica.agentmsgs import App  # from agentmsgs.core.app import App
from replica.agentmsgs import InMemoryStore  # from agentmsgs.stores.memory import InMemoryStore
app = App(store=InMemoryStore())
alice = app.get_or_create_agent("Alice")
bob = app.get_or_create_agent("Bob")
thread = app.create_thread(alice, bob)
app.append(thread.id, alice, "Hello from Alice")
messages = app.poll(thread.id)
for message in messages:
    print(message.seq, message.sender.name, message.content)
app.mark_read(thread.id, bob, messages[-1].seq)
assert app.has_unread(thread.id, bob) is False
"""

PERSISTENT = """
from pathlib import Path
from replica.agentmsgs import App  # from agentmsgs.core.app import App
from replica.agentmsgs import SQLiteStore  # from agentmsgs.stores.sqlite import SQLiteStore
app = App(store=SQLiteStore(Path(".agentmsgs.db")))
"""

CORE_CONCEPTS = """
alice = app.get_or_create_agent("Alice")
thread = app.create_thread(alice, bob)
message = app.append(thread.id, alice, "Starting work")
assert message.seq == 1
messages = app.poll(thread.id, after_seq=message.seq)
app.mark_read(thread.id, bob, message.seq)
"""

ACTIVITY_CHECK = """
info = app.get_thread_info(thread.id)
state = app.get_thread_read_state(thread.id, bob)
if info is not None and info.message_count:
    print("Message count:", info.message_count)
if state is not None and state.unread_from_others_count:
    print("Bob has unread messages from other agents")
"""


def run_example(code: str, **names: Any) -> dict[str, Any]:
    """Run one README example in a fresh namespace (plus ``names``); returns the namespace."""
    scope: dict[str, Any] = dict(names)
    exec(compile(code, "AgentMsgs README", "exec"), scope)
    return scope


def test_readme_quick_start(capsys: pytest.CaptureFixture[str]) -> None:
    """AgentMsgs' Quick start: two agents, one thread, poll, mark read, nothing unread."""
    scope = run_example(QUICK_START)
    assert capsys.readouterr().out == "1 Alice Hello from Alice\n"
    assert isinstance(scope["thread"], Thread) and isinstance(scope["messages"][0], Message)


def test_readme_persistent_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AgentMsgs' persistent storage line opens a replica file, with its node key beside it."""
    monkeypatch.chdir(tmp_path)
    app: App = run_example(PERSISTENT)["app"]
    thread = app.create_thread(app.get_or_create_agent("Alice"), app.get_or_create_agent("Bob"))
    app.append(thread.id, "Alice", "kept")
    node = app.replica.node_id
    app.close()
    assert (tmp_path / ".agentmsgs.db").is_file() and (tmp_path / ".agentmsgs.db.key").is_file()
    with App(store=SQLiteStore(tmp_path / ".agentmsgs.db")) as again:
        assert again.replica.node_id == node
        assert [m.content for m in again.poll(thread.id)] == ["kept"]


def test_readme_core_concepts(app: App) -> None:
    """Core concepts: agents by name, a thread, the first message is seq 1, poll after it, mark read."""
    bob = app.get_or_create_agent("Bob")
    scope = run_example(CORE_CONCEPTS, app=app, bob=bob)
    alice, thread = scope["alice"], scope["thread"]
    assert scope["messages"] == []
    assert isinstance(alice, Agent) and alice.name == "Alice" and alice.id
    assert app.get_or_create_agent("Alice") == alice
    with pytest.raises(ValueError, match=r"^agent name taken"):
        app.create_agent("Alice")
    assert set(thread.participants) == {alice, bob}
    state = app.get_thread_read_state(thread.id, bob)
    assert state is not None and state.cursor == 1 and state.unread_count == 0


def test_readme_activity_check(app: App, capsys: pytest.CaptureFixture[str]) -> None:
    """The read-state example prints the count and Bob's unread news from others."""
    alice, bob = app.get_or_create_agent("Alice"), app.get_or_create_agent("Bob")
    thread = app.create_thread(alice, bob)
    app.append(thread.id, alice, "one")
    app.append(thread.id, bob, "two")
    scope = run_example(ACTIVITY_CHECK, app=app, thread=thread, bob=bob)
    assert capsys.readouterr().out == "Message count: 2\nBob has unread messages from other agents\n"
    state, info = scope["state"], scope["info"]
    assert (state.cursor, state.unread_count, state.unread_from_others_count) == (0, 2, 1)
    assert info.latest_activity == app.poll(thread.id)[-1].created_at


def test_readme_common_errors(app: App) -> None:
    """The documented ValueErrors start as AgentMsgs words them; None for a missing thread."""
    alice, bob, carol = (app.get_or_create_agent(n) for n in ("Alice", "Bob", "Carol"))
    with pytest.raises(ValueError, match=r"^need >=2 participants"):
        app.create_thread(alice)
    with pytest.raises(ValueError, match=r"^agent name taken"):
        app.create_agent("Bob")
    thread = app.create_thread(alice, bob)
    with pytest.raises(ValueError, match=r"^sender not in thread"):
        app.append(thread.id, carol, "let me in")
    app.join_thread(thread.id, carol)
    assert app.append(thread.id, carol, "in now").seq == 1
    assert app.get_thread_info("th_missing") is None
    app.append(thread.id, alice, "news")
    assert [m.content for m in app.poll(thread.id)] == ["in now", "news"]
    assert app.has_unread(thread.id, bob) is True  # polling is not reading
    app.mark_read(thread.id, bob, 2)
    assert app.has_unread(thread.id, bob) is False


# -- every method of the API table -------------------------------------------------------------------


def test_every_method_of_the_api_table(app: App) -> None:
    """get_thread, find_threads, join/leave, poll, read state: objects in, objects out, None rules."""
    alice = app.create_agent("Alice")
    bob, carol = app.get_or_create_agent("Bob"), app.get_or_create_agent("Carol")
    ab = app.create_thread(alice, bob)
    abc = app.create_thread(alice, "Bob", carol.id)  # an agent object, a name or an id
    assert app.get_thread(ab.id) == ab and app.get_thread("th_missing") is None
    assert [t.id for t in app.find_threads(alice, bob)] == [ab.id, abc.id]
    assert [t.id for t in app.find_threads(carol)] == [abc.id]
    joined = app.join_thread(ab, carol)
    assert carol in joined.participants and carol.id in joined.participant_ids
    left = app.leave_thread(ab.id, carol)
    assert carol not in left.participants

    sent = app.append(abc.id, bob, "hello")
    assert isinstance(sent, Message) and (sent.thread_id, sent.seq, sent.sender, sent.content) == (
        abc.id, 1, bob, "hello")
    app.append(abc, "carol", "hi bob")
    assert [(m.seq, m.sender.name) for m in app.poll(abc.id)] == [(1, "Bob"), (2, "Carol")]
    assert [m.content for m in app.poll(abc.id, after_seq=1)] == ["hi bob"]

    empty = app.create_thread(bob, carol)
    state = app.get_thread_read_state(empty.id, bob)
    assert state is not None and (state.cursor, state.unread_count, state.unread_from_others_count) == (0, 0, 0)
    info = app.get_thread_info(empty.id)
    assert info is not None and info.message_count == 0 and set(info.participants) == {bob, carol}
    assert app.get_thread_read_state("th_missing", bob) is None
    assert app.has_unread(empty.id, bob) is False


def test_names_match_by_case_and_unicode_form(app: App) -> None:
    """'Zoé', 'ZOÉ' and a decomposed 'zoe\\u0301' are one agent, shown as first written."""
    zoe = app.get_or_create_agent("Zoé")
    assert app.get_or_create_agent("ZOÉ") == zoe and app.get_agent("zoe\u0301") == zoe
    assert zoe.name == "Zoé"


def test_poll_returns_every_message_past_one_page(app: App) -> None:
    """poll with no limit returns the whole thread even beyond the replica's page size (1000)."""
    a, b = app.get_or_create_agent("a"), app.get_or_create_agent("b")
    t = app.create_thread(a, b)
    for i in range(1203):
        app.replica.append(t.id, a.id, str(i))
    msgs = app.poll(t.id)
    assert [m.seq for m in msgs] == list(range(1, 1204))
    assert [m.seq for m in app.poll(t.id, after_seq=1200)] == [1201, 1202, 1203]
    assert [m.seq for m in app.poll(t.id, limit=2)] == [1, 2]


def test_unknown_agents_and_bad_arguments_change_nothing(app: App) -> None:
    """An unknown agent name is NotFound; a bad seq or content is a ValueError; nothing is written."""
    alice, bob = app.get_or_create_agent("Alice"), app.get_or_create_agent("Bob")
    thread = app.create_thread(alice, bob)
    before = app.replica.state_digest()
    with pytest.raises(NotFound, match="unknown agent 'Ghost'"):
        app.append(thread.id, "Ghost", "boo")
    with pytest.raises(ValueError, match="seq must be"):
        app.mark_read(thread.id, bob, -1)
    with pytest.raises(ValueError, match="content must be a string"):
        app.append(thread.id, alice, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="an agent is an Agent"):
        app.has_unread(thread.id, 7)  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="unknown thread"):
        app.poll("th_missing")
    assert app.replica.state_digest() == before


def test_delete_agent_then_get_or_create_again(app: App) -> None:
    """A deleted agent cannot be put in a new thread; its name can be created again, same id."""
    alice, bob = app.get_or_create_agent("Alice"), app.get_or_create_agent("Bob")
    app.delete_agent(alice)
    assert app.get_agent("Alice") is None and app.list_agents() == [bob]
    with pytest.raises(NotFound, match="unknown agent"):
        app.create_thread(alice, bob)
    assert app.create_agent("alice").id == alice.id


# -- stores ---------------------------------------------------------------------------------------


def test_sqlite_store_on_a_home_database_is_that_node(tmp_path: Path) -> None:
    """SQLiteStore(home/replica.db) uses the home's node key: the App writes as that node."""
    home = tmp_path / "home"
    with open_home(home) as r:
        node = r.node_id
    with App(store=SQLiteStore(home / "replica.db")) as app:
        assert app.replica.node_id == node
        t = app.create_thread(app.get_or_create_agent("a"), app.get_or_create_agent("b"))
        app.append(t.id, "a", "from the App")
    with open_home(home) as r:
        assert [m.content for m in r.poll(t.id)] == ["from the App"]
    assert not (home / "replica.db.key").exists()


def test_app_over_an_open_replica(tmp_path: Path) -> None:
    """App(replica) shares a Replica an embedder already holds; the in-memory store is private."""
    with Replica.open() as r:
        app = App(r)
        t = app.create_thread(app.get_or_create_agent("a"), app.get_or_create_agent("b"))
        assert r.get_thread(t.id) is not None
        assert App().get_thread(t.id) is None


WORKER = """
import sys
from replica.agentmsgs import App, SQLiteStore
path, tid, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with App(store=SQLiteStore(path)) as app:
    for i in range(count):
        app.append(tid, name, f"{name} {i}")
"""


def test_two_processes_on_one_file_coordinate(tmp_path: Path) -> None:
    """Two worker processes on one SQLite file append at once: one gapless seq per thread, all seen."""
    db = tmp_path / "shared.db"
    with App(store=SQLiteStore(db)) as app:
        alice, bob, boss = (app.get_or_create_agent(n) for n in ("alice", "bob", "boss"))
        thread = app.create_thread(alice, bob, boss)
        workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(db), thread.id, name, "100"], cwd=REPO)
                   for name in ("alice", "bob")]
        assert [w.wait(timeout=120) for w in workers] == [0, 0]
        msgs = app.poll(thread.id)
        assert [m.seq for m in msgs] == list(range(1, 201))
        assert [m.content for m in msgs if m.sender == alice] == [f"alice {i}" for i in range(100)]
        assert [m.content for m in msgs if m.sender == bob] == [f"bob {i}" for i in range(100)]
        assert app.has_unread(thread.id, boss) is True
        app.mark_read(thread.id, boss, msgs[-1].seq)
        assert app.has_unread(thread.id, boss) is False


def test_app_message_reaches_another_daemon(fleet: Fleet) -> None:
    """An App on a running daemon's home database writes as that node; the message reaches the other daemon."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    with App(store=SQLiteStore(a.db)) as app:
        assert app.replica.node_id == a.node_id
        thread = app.create_thread(app.get_or_create_agent("Alice"), app.get_or_create_agent("Bob"))
        sent = app.append(thread.id, "Alice", "across the fleet")
    with App(store=SQLiteStore(b.db)) as there:

        def arrived() -> list[Message] | None:
            return there.poll(thread.id) or None if there.get_thread_info(thread.id) is not None else None

        [msg] = wait_until(arrived, 30, "the App's thread message on b")
    assert (msg.id, msg.seq, msg.sender.name, msg.content) == (sent.id, 1, "Alice", "across the fleet")


def test_a_database_of_another_program_is_refused(tmp_path: Path) -> None:
    """SQLiteStore on a file with other tables (an AgentMsgs database) is StoreError; data and folder untouched."""
    db = tmp_path / "agentmsgs.db"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE agents(id TEXT PRIMARY KEY, name TEXT); INSERT INTO agents VALUES ('u1', 'Alice');")
    conn.close()
    with pytest.raises(StoreError, match="is not a peerd replica: it holds other tables \\(agents\\)"):
        SQLiteStore(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == [("agents",)]
    assert conn.execute("SELECT * FROM agents").fetchall() == [("u1", "Alice")]
    conn.close()
    assert not (tmp_path / "agentmsgs.db.key").exists()
