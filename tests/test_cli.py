"""The ``peerd`` CLI as a user runs it: real processes against two real daemons (and against
homes with no daemon), text and ``--json`` output, and exit codes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from peerd import home as homes
from peerd.cli import format as cli_format
from peerd.config import load_config, save_config
from replica import open_home
from tests.daemons import PEERD, Daemon, Fleet, patience, wait_until
from tests.imports import MCP_STACK, among, imported, run_traced

pytest_plugins = ["tests.daemons"]

SPREAD = 15.0
BACKLOG = 20_000  # messages a new node must pull: long enough (a few seconds) to watch
ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


@pytest.fixture(scope="module")
def duo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    """Two daemons seeded with each other, shared by this module's tests (each test uses its own roles)."""
    fleet = Fleet(tmp_path_factory.mktemp("cli"))
    try:
        a, b = fleet.add("a"), fleet.add("b")
        fleet.mesh()
        fleet.start()
        wait_until(lambda: (b.peer(a) or {}).get("reachable") and (a.peer(b) or {}).get("reachable"), SPREAD,
                   "a and b live in each other's peer table")
        yield a, b
    finally:
        fleet.close()


def run(*argv: str, home: Path, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``peerd ARGV --home HOME`` as a separate process."""
    return subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, input=stdin,
                          timeout=timeout, env=ENV, check=False)


def ok(*argv: str, home: Path, stdin: str | None = None) -> str:
    proc = run(*argv, home=home, stdin=stdin)
    assert proc.returncode == 0, f"peerd {' '.join(argv)} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def ok_json(*argv: str, home: Path) -> Any:
    return json.loads(ok(*argv, "--json", home=home))


def arrived(d: Daemon, message_id: str) -> None:
    wait_until(lambda: d.has_message(message_id), SPREAD, f"{message_id} on {d.name}")


class Lines:
    """Lines a long-running ``peerd`` process prints, collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def json(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines)]

    def stop(self) -> int:
        """Ctrl-C, then the exit code."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=patience(15))
        self._thread.join(timeout=5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code


_FOLLOWERS: list[Lines] = []


def follow(*argv: str, home: Path) -> Lines:
    """Start a long-running ``peerd`` command (stopped at the end of the test whatever happens)."""
    proc = subprocess.Popen([str(PEERD), *argv, "--home", str(home)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=ENV)
    lines = Lines(proc)
    _FOLLOWERS.append(lines)
    return lines


@pytest.fixture(autouse=True)
def _stop_followers() -> Iterator[None]:
    yield
    while _FOLLOWERS:
        lines = _FOLLOWERS.pop()
        if lines.proc.poll() is None:
            lines.proc.kill()
            lines.proc.wait()
        if lines.proc.stdout is not None and not lines.proc.stdout.closed:
            lines._thread.join(timeout=5)
            lines.proc.stdout.close()


# -- status and peers -------------------------------------------------------------------------------


def test_status_shows_node_fleet_peers_lag_and_totals(duo: tuple[Daemon, Daemon]) -> None:
    """`status` prints node, fleet, URLs, totals and a peer table with per-peer lag; --json has the same data."""
    a, b = duo
    text = ok("status", home=b.home)
    assert b.node_id[:16] in text and b.info["fleet_id"] in text
    assert f"{b.info['local_url']}/dashboard" in text
    assert "totals" in text and "messages" in text
    header = next(line for line in text.splitlines() if line.startswith("PEER"))
    assert "LAG" in header and "FOUND BY" in header and "LIVE" in header
    row = next(line for line in text.splitlines() if line.startswith(a.addr))
    assert a.short_id in row and "seed" in row and "yes" in row

    def with_lag() -> dict[str, Any] | None:
        d = ok_json("status", home=b.home)
        return d if any(p["address"] == a.addr and p["lag"] is not None for p in d["peers"]) else None

    # a peer can be live (a push or exchange got through) before a sync round has told b its vector
    data = wait_until(with_lag, SPREAD, "b to know a's lag")
    assert data["node_id"] == b.node_id and data["live_peers"] >= 1
    assert {"messages", "ops", "origins"} <= set(data["totals"])


def test_status_watch_refreshes_until_its_count(duo: tuple[Daemon, Daemon]) -> None:
    """`status --watch --json` prints one JSON object per refresh; --count ends it with exit 0."""
    _a, b = duo
    t0 = time.monotonic()
    out = ok("status", "--watch", "--interval", "0.2", "--count", "3", "--json", home=b.home)
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 and all(d["node_id"] == b.node_id for d in lines)
    assert lines[-1]["uptime"] > lines[0]["uptime"]
    assert time.monotonic() - t0 >= 0.4
    text = ok("status", "--watch", "--interval", "0.1", "--count", "2", home=b.home)
    assert text.count("refreshing every 0.1s") == 2


def test_status_watch_stops_cleanly_on_ctrl_c(duo: tuple[Daemon, Daemon]) -> None:
    """Ctrl-C ends `status --watch` with exit 0."""
    _a, b = duo
    lines = follow("status", "--watch", "--interval", "0.2", "--json", home=b.home)
    wait_until(lambda: len(lines.lines) >= 2, 15, "two refreshes")
    assert lines.stop() == 0
    assert all(d["node_id"] == b.node_id for d in lines.json())


def test_status_watch_shows_a_real_catch_up_as_a_progress_bar(fleet: Fleet) -> None:
    """While a new node pulls a large backlog, `status --watch` shows a progress bar with rate and ETA."""
    a = fleet.add("a")
    b = fleet.add("b", seeds=[a])
    fleet.init([a, b])
    with open_home(a.home) as rep:
        for i in range(BACKLOG):
            rep.send_message("bulk", "archive", f"record {i} " + "x" * 60)
    path = homes.config_path(a.home)
    save_config(path, dataclasses.replace(load_config(path), max_content_bytes=1024, page_bytes=8192))  # many pages
    fleet.start(a)
    b.spawn()
    b.wait_ready()
    watch = follow("status", "--watch", "--interval", "0.1", home=b.home)
    wait_until(lambda: b.status()["totals"]["messages"] == BACKLOG, 60, "b caught up", interval=0.2)

    def frame_after_catch_up() -> bool:  # a whole frame printed since the catch-up ended
        frames = "\n".join(watch.lines).split("refreshing every")
        return len(frames) >= 3 and "catching up" not in frames[-2]

    wait_until(frame_after_catch_up, 15, "a status frame without the progress bar")
    assert watch.stop() == 0
    bars = [line for line in watch.lines if line.startswith(f"catching up from {a.addr}")]
    assert bars, "no progress line while catching up:\n" + "\n".join(watch.lines[-20:])
    assert all(re.search(r"\[#*-*\] +\d+\.\d%  [\d,]+/[\d,]+ ops  [\d,]+ ops/s  ETA (\?|\d)", line) for line in bars)
    assert "catching up" not in "\n".join(watch.lines[-12:]), "the bar stays after the catch-up ended"


def test_progress_bar_shows_percent_rate_and_eta() -> None:
    """The catch-up line has a bar, the percentage, done/total, the rate and the ETA."""
    bar = cli_format.progress_bar({"peer": "10.0.0.2:7733", "done": 4520, "total": 10000, "rate": 1234.5, "eta": 4.4,
                            "percent": 45.2}, width=20)
    assert bar == ("catching up from 10.0.0.2:7733  [#########-----------]  45.2%  4,520/10,000 ops  "
                   "1,234 ops/s  ETA 4s")
    assert "ETA ?" in cli_format.progress_bar({"peer": "p", "done": 0, "total": 5000, "rate": 0.0, "eta": None,
                                        "percent": 0.0})
    status = {"node_id": "ab" * 32, "name": "n", "fleet_id": "f", "peer_url": "p", "local_url": "http://l",
              "mcp_url": "m", "uptime": 3, "totals": {"messages": 1, "receipts": 0, "ops": 1, "origins": 1},
              "peers": [], "live_peers": 0, "lag": 0,
              "catchup": {"peer": "x:1", "done": 1, "total": 2000, "rate": 10.0, "eta": 199.9, "percent": 0.1}}
    assert "catching up from x:1" in cli_format.format_status(status) and "ETA 3m20s" in cli_format.format_status(status)
    assert "catching up" not in cli_format.format_status({**status, "catchup": None})


def test_peers_lists_each_peer_with_how_found_liveness_and_lag(duo: tuple[Daemon, Daemon]) -> None:
    """`peers` shows the other daemon: address, node, found by seed, live, lag (text and JSON)."""
    a, b = duo
    text = ok("peers", home=a.home)
    row = next(line for line in text.splitlines() if line.startswith(b.addr))
    assert b.short_id in row and "seed" in row and "yes" in row
    rows = ok_json("peers", home=a.home)
    mine = next(p for p in rows if p["address"] == b.addr)
    assert mine["node_id"] == b.short_id and mine["found_by"] == "seed" and mine["reachable"] is True


# -- messaging ----------------------------------------------------------------------------------------


def test_send_inbox_read_round_trip_across_daemons(duo: tuple[Daemon, Daemon]) -> None:
    """send on one node, inbox on the other records delivery, read marks it, --all still shows it as read."""
    a, b = duo
    sent = ok_json("send", "--from", "planner", "--to", "coder1", "please", "pick", "up", "task", "12", home=a.home)
    assert sent["recipients"] == ["coder1"]
    arrived(b, sent["messageId"])
    inbox = ok_json("inbox", "coder1", home=b.home)
    assert [m["content"] for m in inbox["messages"]] == ["please pick up task 12"]
    receipt = inbox["messages"][0]["receiptId"]
    text = ok("inbox", "coder1", home=b.home)
    assert "planner -> coder1: please pick up task 12" in text and f"receipt {receipt}" in text
    assert ok("read", receipt, home=b.home).strip() == "marked 1 read"
    assert ok("inbox", "coder1", home=b.home).strip() == "no unread messages"
    everything = ok_json("inbox", "coder1", "--all", home=b.home)
    assert [(m["messageId"], m["readAt"] is not None) for m in everything["messages"]] == [(sent["messageId"], True)]
    assert "(read)" in ok("inbox", "coder1", "--all", home=b.home)
    wait_until(lambda: all(s["readAt"] for s in a.message_status(sent["messageId"])), SPREAD, "read receipt on a")


def test_send_to_an_instance_and_from_stdin(duo: tuple[Daemon, Daemon]) -> None:
    """--instance targets one instance; TEXT '-' reads the message from stdin."""
    a, _b = duo
    sent = json.loads(ok("send", "--from", "ops", "--to", "worker2", "--instance", "w-1", "--json", "-",
                         home=a.home, stdin="line one\nline two\n"))
    assert ok_json("inbox", "worker2", "--instance", "w-2", home=a.home)["messages"] == []
    got = ok_json("inbox", "worker2", "--instance", "w-1", home=a.home)["messages"]
    assert [(m["messageId"], m["content"]) for m in got] == [(sent["messageId"], "line one\nline two\n")]


def test_inbox_follow_prints_messages_as_they_arrive(duo: tuple[Daemon, Daemon]) -> None:
    """`inbox --follow --json` prints a message sent later on the other node, and stops on Ctrl-C with 0."""
    a, b = duo
    first = a.send("lead", "follower3", "before")["messageId"]
    arrived(b, first)
    lines = follow("inbox", "follower3", "--follow", "--json", home=b.home)
    wait_until(lambda: len(lines.lines) >= 1, SPREAD, "the waiting message")
    later = a.send("lead", "follower3", "after")["messageId"]
    wait_until(lambda: len(lines.lines) >= 2, SPREAD, "the new message printed")
    assert lines.stop() == 0
    assert [(m["messageId"], m["content"]) for m in lines.json()] == [(first, "before"), (later, "after")]


def test_log_shows_latest_traffic_in_arrival_order_and_follows(duo: tuple[Daemon, Daemon]) -> None:
    """`log` lists the latest messages oldest first (--limit); `log --follow` adds new ones as they land."""
    a, b = duo
    ids = [a.send("logger", "sink4", f"entry {i}")["messageId"] for i in range(3)]
    for mid in ids:
        arrived(b, mid)
    latest = ok_json("log", "--limit", "2", home=b.home)["messages"]
    assert [m["messageId"] for m in latest] == ids[1:] and latest[0]["seq"] < latest[1]["seq"]
    text = ok("log", "--limit", "3", home=b.home).splitlines()
    assert [line.split(": ", 1)[1] for line in text] == ["entry 0", "entry 1", "entry 2"]
    assert all("logger -> sink4" in line for line in text)
    lines = follow("log", "--limit", "1", "--follow", "--json", home=b.home)
    wait_until(lambda: len(lines.lines) >= 1, SPREAD, "the latest message")
    new = a.send("logger", "sink4", "entry 3")["messageId"]
    wait_until(lambda: any(new in line for line in lines.lines), SPREAD, "the new entry in the log")
    assert lines.stop() == 0
    assert [m["messageId"] for m in lines.json()][-2:] == [ids[2], new]


def test_search_finds_messages_with_filters(duo: tuple[Daemon, Daemon]) -> None:
    """`search` finds messages by words; --from, --channel and --since narrow; no hit is still exit 0."""
    a, b = duo
    one = a.send("alice5", "bob5", "zebra migration plan")["messageId"]
    two = a.send("carol5", "dave5", "zebra migration done")["messageId"]
    arrived(b, two)
    arrived(b, one)
    hits = ok_json("search", "zebra", "migration", home=b.home)["hits"]
    assert {h["messageId"] for h in hits} == {one, two}
    assert [h["messageId"] for h in ok_json("search", "zebra", "--from", "carol5", home=b.home)["hits"]] == [two]
    assert [h["messageId"] for h in ok_json("search", "zebra", "--channel", "bob5", home=b.home)["hits"]] == [one]
    first_seq = next(h["seq"] for h in hits if h["messageId"] == one)
    assert [h["messageId"] for h in ok_json("search", "zebra", "--since", str(first_seq), home=b.home)["hits"]] == [two]
    text = ok("search", "zebra", "plan", home=b.home)
    assert "alice5 -> bob5: zebra migration plan" in text and f"id {one}" in text
    assert ok("search", "quagga", home=b.home).strip() == "no messages match 'quagga'"


def test_profile_set_show_and_list(duo: tuple[Daemon, Daemon]) -> None:
    """`profile ID --set` writes fields (others kept), `profile ID` shows it on the other node, `profile` lists."""
    a, b = duo
    ok("profile", "coder6", "--set", "name=Coder Six", "static=writes code", home=a.home)
    out = ok_json("profile", "coder6", "--set", "dynamic=on task 12", home=a.home)
    assert (out["name"], out["static"]["role"], out["dynamic"]["currentTask"]) == ("Coder Six", "writes code",
                                                                                  "on task 12")
    shown = wait_until(lambda: (run("profile", "coder6", "--json", home=b.home).stdout or "null"), SPREAD,
                       "the profile on b", interval=0.2)
    got = json.loads(shown)
    assert got is not None and got["dynamic"]["currentTask"] == "on task 12"
    text = ok("profile", "coder6", home=b.home)
    assert "name     Coder Six" in text and "dynamic  on task 12" in text
    listing = ok("profile", home=b.home)
    assert any(line.startswith("coder6") and "Coder Six" in line for line in listing.splitlines())


def test_threads_lists_participants_and_counts(duo: tuple[Daemon, Daemon]) -> None:
    """`threads` shows threads made on another node with participant names and message counts."""
    a, b = duo
    with open_home(a.home) as rep:  # a second process on a running daemon's replica, as `peerd mcp` is
        x, y = rep.get_or_create_agent("xena7"), rep.get_or_create_agent("yuri7")
        tid = rep.create_thread(x, y)
        rep.append(tid, x, "hello yuri")
        rep.append(tid, y, "hi xena")

    def listed() -> dict[str, Any] | None:
        return next((t for t in ok_json("threads", home=b.home) if t["thread_id"] == tid), None)

    row = wait_until(listed, SPREAD, "the thread on b", interval=0.2)
    assert sorted(row["participants"]) == ["xena7", "yuri7"] and row["message_count"] == 2
    line = next(line for line in ok("threads", home=b.home).splitlines() if line.startswith(tid))
    assert "xena7" in line and "yuri7" in line


# -- exit codes and offline use -------------------------------------------------------------------


def test_exit_codes_mean_what_the_docs_say(duo: tuple[Daemon, Daemon], tmp_path: Path) -> None:
    """1 request failed, 2 usage, 3 no daemon, 4 no home; errors go to stderr prefixed 'peerd:'."""
    a, _b = duo
    bad = run("read", "no-such-receipt", home=a.home)
    assert bad.returncode == 1 and bad.stderr.startswith("peerd: ") and "no receipt id this node knows" in bad.stderr
    assert run("send", "--from", "x", "--to", " , ", "hi", home=a.home).returncode == 1
    assert run("profile", "nobody-has-this", home=a.home).returncode == 1
    assert run("status", "--bogus-flag", home=a.home).returncode == 2
    assert run("profile", "--set", "name=x", home=a.home).returncode == 2
    usage = run("profile", "p", "--set", "colour=red", home=a.home)
    assert usage.returncode == 2 and "--set takes name=" in usage.stderr
    ok("init", "--name", "idle", home=tmp_path / "idle")
    for argv in (["status"], ["peers"]):
        proc = run(*argv, home=tmp_path / "idle")
        assert proc.returncode == 3 and "no daemon is running" in proc.stderr
    nowhere = run("log", home=tmp_path / "nowhere")
    assert nowhere.returncode == 4 and "peerd init" in nowhere.stderr
    assert not (tmp_path / "nowhere").exists()


def test_messaging_commands_work_on_the_replica_with_no_daemon(tmp_path: Path) -> None:
    """With no daemon, send/inbox/read/log/search/profile/threads work straight on the replica file."""
    home = tmp_path / "solo"
    ok("init", "--name", "solo", home=home)
    sent = ok_json("send", "--from", "me", "--to", "you", "offline", "hello", home=home)
    assert [m["messageId"] for m in ok_json("log", home=home)["messages"]] == [sent["messageId"]]
    assert [h["messageId"] for h in ok_json("search", "offline", home=home)["hits"]] == [sent["messageId"]]
    receipt = ok_json("inbox", "you", home=home)["messages"][0]["receiptId"]
    assert ok_json("read", receipt, home=home)["markedAsRead"] == 1
    assert ok_json("inbox", "you", "--all", home=home)["messages"][0]["readAt"] is not None
    assert ok_json("profile", "you", "--set", "name=You", home=home)["name"] == "You"
    assert ok_json("threads", home=home) == []
    assert ok("threads", home=home).strip() == "no threads"


@pytest.mark.parametrize("argv", [
    ("send", "--from", "alpha", "--to", "beta", "no mcp here"),
    ("inbox", "beta"),
    ("status",),
    ("hook", "--role", "beta"),
])
def test_quick_commands_load_no_mcp_stack(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """`send`, `inbox`, `status` and `hook` never import the MCP SDK, pydantic or the ASGI server."""
    home = tmp_path / "home"
    ok("init", home=home)
    out = run_traced([*argv], home)
    assert out.returncode in (0, 3), out.stderr[-2000:]  # status: 3 when no daemon runs
    loaded = imported(out.stderr)
    assert "peerd.cli" in loaded and "replica" in loaded  # the trace is there
    assert not among(loaded, MCP_STACK)


COMMAND_MODULES = ("peerd.cli.arguments", "peerd.cli.commands", "peerd.cli.backends", "peerd.cli.pairing",
                   "peerd.cli.joining", "peerd.cli.backup", "peerd.cli.mcpserve", "peerd.cli.hook")


@pytest.mark.parametrize(("argv", "code", "own"), [
    (("mcp", "--transport", "http", "--role", "x"), 2, ("peerd.cli.mcpserve",)),  # a usage error, told by mcp itself
    (("send", "--from", "alpha", "--to", "beta", "hello"), 0, ("peerd.cli.arguments", "peerd.cli.commands",
                                                             "peerd.cli.backends")),
    (("hook", "--role", "beta"), 0, ("peerd.cli.hook",)),
])
def test_a_command_loads_no_other_commands_module(tmp_path: Path, argv: tuple[str, ...], code: int,
                                                  own: tuple[str, ...]) -> None:
    """The one parser builds the called command's flags only: `peerd mcp` (which starts with every MCP
    session), `peerd send` and `peerd hook` load their own modules and none of the others'."""
    home = tmp_path / "home"
    ok("init", home=home)
    out = run_traced([*argv], home)
    assert out.returncode == code, out.stderr[-2000:]
    if argv[0] == "mcp":
        assert "--role and --instance apply to --transport stdio" in out.stderr
    loaded = imported(out.stderr)
    assert "peerd.cli.parser" in loaded and set(own) <= loaded
    assert among(loaded, COMMAND_MODULES) == set(own)


def test_every_command_of_the_table_is_built_and_runs_a_function() -> None:
    """The command table and the parser agree: every row builds a subcommand that sets ``fn``, and a
    call's parser holds the command it names and no other."""
    from peerd.cli import parser as cli_parser  # noqa: PLC0415

    full = cli_parser.build_parser()
    [sub] = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == [c.name for c in cli_parser.COMMANDS]
    assert all(callable(p.get_default("fn")) for p in sub.choices.values())
    [one] = [a for a in cli_parser.parser_for(["--json", "inbox", "bob"])._actions
             if isinstance(a, argparse._SubParsersAction)]
    assert list(one.choices) == ["inbox"]
