"""The first minutes with ``peerd``, as a new user meets them: homes that cannot go wrong
silently, what ``peerd run`` says once ready, ``peerd stop``, global options anywhere, typo
suggestions, hints that keep ``--home``, feedback on sending to an unknown role, and
``peerd status MESSAGE_ID``. Real ``peerd`` processes on real homes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from discovery.netif import LocalAddress
from peerd import home as homes
from peerd import netaddr
from peerd.cli import format as fmt
from peerd.config import encode_fleet_key, load_config, new_fleet_key
from tests.daemons import PEERD, Fleet, wait_until
from tests.netns import NetnsLab

pytest_plugins = ["tests.daemons"]

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}
ROOT = Path(__file__).resolve().parent.parent


def peerd(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), *argv], capture_output=True, text=True, input=stdin, env=ENV, timeout=60,
                          check=False)


def ok(*argv: str) -> str:
    proc = peerd(*argv)
    assert proc.returncode == 0, f"peerd {shlex.join(argv)} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


class Running:
    """A ``peerd run --json`` started by the test: its ready line, then its stderr line by line."""

    def __init__(self, home: Path, *extra: str) -> None:
        argv = [str(PEERD), "run", "--home", str(home), "--port", "0", "--local-port", "0", "--no-mdns", "--json",
                *extra]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                     stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.first = self.proc.stdout.readline()  # blocks until the ready line (or the process ends)
        self.stderr: list[str] = []

    def ready(self) -> dict[str, Any]:
        info = json.loads(self.first)
        assert isinstance(info, dict) and info["pid"] == self.proc.pid
        return info

    def read_until(self, marker: str) -> str:
        """stderr up to the first line holding ``marker`` (fails if the process ends first)."""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            if marker in line:
                return "".join(self.stderr)
        raise AssertionError(f"peerd run ended without {marker!r}:\n{''.join(self.stderr)}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.close()


def start(running: list[Running], home: Path, *extra: str) -> Running:
    r = Running(home, *extra)
    running.append(r)
    return r


def orphan(home: Path) -> Path:
    """A home whose config.toml is gone but whose node (key and replica) is kept."""
    ok("init", "--home", str(home))
    homes.config_path(home).unlink()
    return home


# -- homes that cannot go wrong silently --------------------------------------------------------


def test_mcp_on_a_missing_home_fails_with_exit_4_and_creates_nothing(tmp_path: Path) -> None:
    """`peerd mcp` with a home that does not exist (an MCP client dropped PEERD_HOME, a typo) says
    so and exits 4 instead of serving a new replica that belongs to no fleet."""
    home = tmp_path / "nowhere"
    proc = subprocess.run([str(PEERD), "mcp", "--home", str(home), "--role", "a"], capture_output=True, text=True,
                          env=ENV, stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "no peerd home at" in proc.stderr and "--init" in proc.stderr and "PEERD_HOME" in proc.stderr
    assert proc.stdout == "" and not home.exists()


async def test_mcp_init_makes_the_home_and_serves_its_fleet(tmp_path: Path) -> None:
    """`peerd mcp --init` creates a home (a new fleet) and serves it: whoami names that fleet."""
    home = tmp_path / "fresh"
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--init", "--role", "a"])
    async with Client(params) as c:
        who = (await c.call_tool("whoami", {})).structured_content
    assert who is not None and who["fleetId"] == load_config(homes.config_path(home)).fleet_id


def test_run_refuses_to_invent_a_fleet_for_a_home_that_lost_its_config(tmp_path: Path,
                                                                       running: list[Running]) -> None:
    """config.toml lost, node kept: `run` (and `init`, `invite`, `mcp --init`) refuse with exit 4 and
    say how to recover, keeping --home in every hint; nothing is written."""
    home = orphan(tmp_path / "lost")
    for argv in (["run", "--no-mdns"], ["init"], ["invite"], ["mcp", "--init"]):
        proc = subprocess.run([str(PEERD), *argv, "--home", str(home)], capture_output=True, text=True, env=ENV,
                              stdin=subprocess.DEVNULL, timeout=60, check=False)
        assert proc.returncode == 4, (argv, proc.stderr)
        assert "no config.toml" in proc.stderr and "fleet key is lost" in proc.stderr
        assert f"peerd join TOKEN --home {home}" in proc.stderr
        assert f"peerd init --home {home} --fleet-key" in proc.stderr
        assert f"peerd run --home {home} --new-fleet" in proc.stderr
        assert not homes.config_path(home).exists()
    r = start(running, home, "--new-fleet")
    assert r.ready()["fleet_id"] == load_config(homes.config_path(home)).fleet_id
    assert "(a new fleet, made just now)" in r.read_until("invite")


def test_init_with_the_fleet_key_recovers_a_home_that_lost_its_config(tmp_path: Path) -> None:
    """The recovery the error names: `init --fleet-key` gives the kept node its fleet back (same node id)."""
    home = orphan(tmp_path / "lost")
    before = ok("init", "--home", str(tmp_path / "other"), "--json")  # just to have a second node around
    key = encode_fleet_key(new_fleet_key())
    out = json.loads(ok("init", "--home", str(home), "--fleet-key", key, "--json"))
    assert out["fleet_id"] == load_config(homes.config_path(home)).fleet_id
    assert out["node_id"] != json.loads(before)["node_id"]
    assert json.loads(ok("init", "--home", str(home), "--json"))["node_id"] == out["node_id"]


def test_new_fleet_on_a_home_that_has_one_is_refused(tmp_path: Path) -> None:
    """--new-fleet never replaces a fleet a home already has."""
    home = tmp_path / "home"
    fleet = json.loads(ok("init", "--home", str(home), "--json"))["fleet_id"]
    proc = peerd("run", "--home", str(home), "--new-fleet")
    assert proc.returncode == 1 and f"already belongs to fleet {fleet}" in proc.stderr
    assert load_config(homes.config_path(home)).fleet_id == fleet


# -- what `peerd run` says, and `peerd stop` ----------------------------------------------------------


def test_run_json_prints_the_ready_line_then_an_orientation_block(tmp_path: Path, running: list[Running]) -> None:
    """With --json, on a fresh home the first stdout line is the JSON ready line; stderr then tells the
    home, node, fleet (new), the peer address, the dashboard, how to stop and how to invite, with --home
    kept."""
    home = tmp_path / "first"
    r = start(running, home)
    info = r.ready()
    block = r.read_until("invite")
    assert f"home       {home}" in block
    assert f"node       {info['name']}  ({info['node_id'][:16]})" in block
    assert f"fleet      {info['fleet_id']}  (a new fleet, made just now)" in block
    assert f"peer       {info['peer_url'].removeprefix('http://')}" in block
    assert f"dashboard  {info['local_url']}/dashboard" in block
    assert f"peerd stop --home {home}" in block and f"peerd invite --home {home}" in block


def first_screen(home: Path, *extra: str) -> tuple[str, str]:
    """What a person sees of ``peerd run``: its stdout up to the last line of the ready block, then
    (once ``peerd stop`` has stopped it) the rest of stdout, and all its stderr."""
    argv = [str(PEERD), "run", "--home", str(home), "--port", "0", "--local-port", "0", "--no-mdns", *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # blocks until each line (or the process ends)
            lines.append(line)
            if line.startswith("  stop "):
                break
        assert lines and lines[-1].startswith("  stop "), "".join(lines) + (proc.stderr.read() if proc.stderr else "")
        ok("stop", "--home", str(home))
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        return "".join(lines) + rest, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_run_shows_the_ready_block_alone_and_logs_to_a_file_in_the_home(tmp_path: Path) -> None:
    """`peerd run` on an existing home prints the friendly block and nothing else, on stdout, and
    nothing on stderr; its log goes to peerd.log in the home (owner-only). With -v the log is on
    stderr instead."""
    home = tmp_path / "home"
    ok("init", "--home", str(home))
    out, err = first_screen(home)
    assert out.startswith("peerd is running\n  home       ") and out.rstrip("\n").splitlines()[-1].startswith("  stop ")
    assert "{" not in out and err == ""
    log = home / "peerd.log"
    assert "peerd ready: node" in log.read_text() and oct(log.stat().st_mode & 0o777) == "0o600"
    out, err = first_screen(home, "-v")
    assert out.startswith("peerd is running\n") and "{" not in out
    assert "peerd ready: node" in err and log.read_text().count("peerd ready: node") == 1


def test_a_start_that_fails_leaves_no_new_home_behind(tmp_path: Path) -> None:
    """With the peer port taken, `peerd run` on a new home says why and exits 1, and the home it was
    about to make is gone (its parent folders too); an empty folder given as home stays empty; an
    existing home keeps everything."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = str(blocker.getsockname()[1])
    try:
        def run(home: Path) -> subprocess.CompletedProcess[str]:
            return peerd("run", "--home", str(home), "--port", port, "--bind", "127.0.0.1", "--local-port", "0",
                         "--no-mdns")

        new = tmp_path / "new" / "home"
        failed = run(new)
        assert failed.returncode == 1 and f"cannot listen for peers on 127.0.0.1:{port}" in failed.stderr
        assert failed.stdout == "" and not (tmp_path / "new").exists()
        empty = tmp_path / "empty"
        empty.mkdir()
        assert run(empty).returncode == 1 and list(empty.iterdir()) == []
        kept = tmp_path / "kept"
        ok("init", "--home", str(kept))
        before = sorted(p.name for p in kept.iterdir())
        assert run(kept).returncode == 1
        assert set(before) <= {p.name for p in kept.iterdir()} and homes.config_path(kept).exists()
    finally:
        blocker.close()


def test_stop_ends_the_daemon_and_waits_for_it(tmp_path: Path, running: list[Running]) -> None:
    """`peerd stop` SIGTERMs the home's daemon and returns once it has exited (cleanly: daemon.json
    removed); with none running it says so and exits 3."""
    home = tmp_path / "home"
    r = start(running, home)
    pid = r.ready()["pid"]
    out = json.loads(ok("stop", "--home", str(home), "--json"))
    assert out == {"stopped": True, "pid": pid, "home": str(home)}
    assert r.proc.poll() == 0  # already exited when stop returned
    assert not homes.daemon_json_path(home).exists()
    again = peerd("stop", "--home", str(home))
    assert again.returncode == 3 and "no daemon is running" in again.stderr


def test_stop_after_a_crash_clears_the_stale_file_and_signals_nobody(tmp_path: Path, running: list[Running]) -> None:
    """A daemon.json left by a kill -9 names a dead pid: stop removes it and exits 3."""
    home = tmp_path / "home"
    r = start(running, home)
    r.ready()
    r.proc.send_signal(signal.SIGKILL)
    r.proc.wait()
    assert homes.daemon_json_path(home).exists()
    proc = peerd("stop", "--home", str(home))
    assert proc.returncode == 3 and not homes.daemon_json_path(home).exists()


# -- the command line itself -------------------------------------------------------------------------


def test_global_options_work_before_or_after_the_command(tmp_path: Path) -> None:
    """`peerd --home X --json inbox R` works as `peerd inbox R --home X --json` does."""
    home = tmp_path / "home"
    ok("init", "--home", str(home))
    ok("send", "--home", str(home), "--from", "a", "--to", "b", "hello")
    before = json.loads(ok("--home", str(home), "--json", "inbox", "b", "--all"))
    after = json.loads(ok("inbox", "b", "--all", "--home", str(home), "--json"))
    mixed = json.loads(ok("--home", str(tmp_path / "elsewhere"), "inbox", "b", "--all", "--json",
                          "--home", str(home)))  # given twice: the one after the command wins
    assert [m["content"] for m in before["messages"]] == ["hello"]
    assert before.pop("warning").startswith("role 'b' has not been seen")  # the first read makes it known
    assert after.pop("warning") is mixed.pop("warning") is None
    assert before == after == mixed


GROUPS = ("messaging", "fleet", "agents", "coordination", "operations")


def test_help_groups_the_commands_as_git_does() -> None:
    """`peerd --help` lists the commands under five headings, each command once with its line of
    help, and how to get a command's own help."""
    from peerd.cli.parser import COMMANDS  # noqa: PLC0415

    text = ok("--help")
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.split(":")[0] in GROUPS and not line.startswith(" ")]
    assert [lines[i].split(":")[0] for i in heads] == list(GROUPS), text
    listed = [line.split()[0] for line in lines[heads[0]:] if line.startswith("   ") and line[3] != " "]
    assert sorted(listed) == sorted(c.name for c in COMMANDS), text
    for c in COMMANDS:
        assert any(line.split()[:1] == [c.name] and c.help.split()[0] in line for line in lines), c.name
    assert "peerd COMMAND --help" in text


def test_every_command_and_argument_has_help() -> None:
    """Walking the whole parser: every command, verb, option and positional argument says what it is."""
    import argparse  # noqa: PLC0415

    from peerd.cli.parser import build_parser  # noqa: PLC0415

    missing: list[str] = []

    def walk(p: argparse.ArgumentParser, where: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in a._choices_actions}
                for name, sub in a.choices.items():
                    if not helps.get(name):
                        missing.append(f"{where} {name}")
                    walk(sub, f"{where} {name}")
            elif a.help in (None, "") and a.dest != "help":
                missing.append(f"{where} {'/'.join(a.option_strings) or a.dest}")

    walk(build_parser(), "peerd")
    assert missing == []


def test_hints_name_the_right_tool_and_keep_the_home(tmp_path: Path, running: list[Running]) -> None:
    """`requests` with no daemon repeats --home; `read MESSAGE_ID` names `peerd inbox` (not an MCP
    tool); `status RECEIPT_ID` says it is a receipt and names the message; through the daemon and on
    the replica file alike."""
    home = tmp_path / "home"
    ok("init", "--home", str(home))
    flag = f"--home {home}"
    proc = peerd("requests", "--home", str(home))
    assert proc.returncode == 3 and f"start one with: peerd run {flag}" in proc.stderr
    mid = json.loads(ok("send", "--home", str(home), "--from", "a", "--to", "b", "--json", "hi"))["messageId"]
    rid = json.loads(ok("inbox", "b", "--home", str(home), "--json"))["messages"][0]["receiptId"]
    for state in ("offline", "daemon"):
        if state == "daemon":
            start(running, home).ready()
        read = peerd("read", mid, "--home", str(home))
        assert read.returncode == 1 and "peerd inbox" in read.stderr and "check_messages" not in read.stderr, state
        status = peerd("status", rid, "--home", str(home))
        assert status.returncode == 1 and f"{rid} is a receipt id" in status.stderr and mid in status.stderr, state


def test_peers_with_mdns_on_and_no_peer_does_not_suggest_turning_it_on(fleet: Fleet) -> None:
    d = fleet.add("solo", mdns=True)
    fleet.start(d)
    text = ok("peers", "--home", str(d.home))
    assert "mDNS is on" in text and "turn mDNS on" not in text


def test_mistyped_commands_and_flags_get_a_suggestion() -> None:
    """A typo is a usage error (exit 2) that names the closest command or flag."""
    proc = peerd("inbx", "bob")
    assert proc.returncode == 2 and "did you mean 'inbox'?" in proc.stderr
    proc = peerd("inbox", "bob", "--lmit", "3")
    assert proc.returncode == 2 and "did you mean --limit?" in proc.stderr


def test_hints_keep_the_home_the_user_gave(tmp_path: Path, running: list[Running]) -> None:
    """join's "start with", and the no-daemon and no-home errors, repeat --home."""
    inviter = tmp_path / "inviter"
    start(running, inviter).ready()  # an invite is redeemed at the member that made it
    token = json.loads(ok("invite", "--home", str(inviter), "--host", "127.0.0.1", "--json"))["invite"]
    joiner = tmp_path / "joiner"
    assert f"start with: peerd run --home {joiner}" in ok("join", token, "--home", str(joiner))
    proc = peerd("peers", "--home", str(joiner))
    assert proc.returncode == 3 and f"start one with: peerd run --home {joiner}" in proc.stderr
    proc = peerd("log", "--home", str(tmp_path / "none"))
    assert proc.returncode == 4 and f"peerd init --home {tmp_path / 'none'}" in proc.stderr


def test_default_node_name_is_the_host_and_a_piece_of_the_node_id(tmp_path: Path, running: list[Running]) -> None:
    """Without --name, two nodes on one host get distinct readable names: host-<4 hex of node id>."""
    one = json.loads(ok("init", "--home", str(tmp_path / "one"), "--json"))
    two = json.loads(ok("init", "--home", str(tmp_path / "two"), "--json"))
    host = socket.gethostname().split(".")[0]
    assert one["name"] == f"{host}-{one['node_id'][:4]}" and two["name"] == f"{host}-{two['node_id'][:4]}"
    joined = tmp_path / "joined"
    start(running, tmp_path / "one").ready()
    token = json.loads(ok("invite", "--home", str(tmp_path / "one"), "--host", "127.0.0.1", "--json"))["invite"]
    ok("join", token, "--home", str(joined))
    node = json.loads(ok("init", "--home", str(joined), "--json"))
    assert node["name"] == f"{host}-{node['node_id'][:4]}"


# -- sending to a role nobody has seen, and a message's state -------------------------------------------


def test_send_to_an_unknown_role_warns_and_still_stores(tmp_path: Path) -> None:
    """Offline `send --to` a role never seen warns on stderr with the known roles (closest first);
    the message is stored all the same, and --json output stays one JSON object."""
    home = tmp_path / "home"
    ok("init", "--home", str(home))
    ok("profile", "reviewer", "--set", "name=Reviewer", "--home", str(home))
    proc = peerd("send", "--home", str(home), "--from", "lead", "--to", "reveiwer", "--json", "please look")
    assert proc.returncode == 0
    assert "warning: role 'reveiwer' has not been seen in this fleet yet" in proc.stderr
    assert "Did you mean 'reviewer'?" in proc.stderr
    sent = json.loads(proc.stdout)
    assert sent["unknownRecipients"] == ["reveiwer"]
    assert [m["messageId"] for m in json.loads(ok("log", "--home", str(home), "--json"))["messages"]] == [sent["messageId"]]
    quiet = peerd("send", "--home", str(home), "--from", "lead", "--to", "reviewer", "hi")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_status_of_a_message_shows_each_recipient_through_the_daemon_and_offline(fleet: Fleet) -> None:
    """`status MESSAGE_ID` shows per recipient pending / delivered / read, from a running daemon, and
    from the replica file once the daemon is stopped; the daemon's send reports unknown roles too."""
    a, b = fleet.add("a"), fleet.add("b")
    fleet.mesh()
    fleet.start()
    b.send("bob", "lead", "ready")  # bob is first seen on b, and a learns it by sync; carol is never seen
    fleet.wait_converged()
    sent = json.loads(ok("send", "--home", str(a.home), "--from", "lead", "--to", "bob,carol", "--json", "plan"))
    assert sent["unknownRecipients"] == ["carol"] and "bob" in sent["knownRoles"]
    wait_until(lambda: b.has_message(sent["messageId"]), 15, "the message on b")
    receipt = b.check("bob")["messages"][0]["receiptId"]
    b.mark_read([receipt])

    def read_on_a() -> dict[str, Any] | None:
        out = json.loads(ok("status", sent["messageId"], "--home", str(a.home), "--json"))
        return out if out["recipients"][0]["state"] == "read" else None

    out = wait_until(read_on_a, 15, "bob's read receipt on a")
    assert [(r["role"], r["state"]) for r in out["recipients"]] == [("bob", "read"), ("carol", "pending")]
    text = ok("status", sent["messageId"], "--home", str(a.home))
    assert text.startswith(f"message {sent['messageId']}: 1 of 2 recipients read, 0 delivered and not read, 1 pending")
    a.stop()
    offline = json.loads(ok("status", sent["messageId"], "--home", str(a.home), "--json"))
    assert offline == out
    missing = peerd("status", "0000000000000000-1", "--home", str(a.home))
    assert missing.returncode == 1 and "unknown message id" in missing.stderr


# -- the peer address others can use ---------------------------------------------------------------------


def test_peer_address_is_the_bind_address_or_else_a_lan_address() -> None:
    """Bound to all interfaces, a daemon shows a LAN address: the default route's source, else the
    first non-loopback interface that is up; loopback only when there is nothing else."""
    eth = LocalAddress("eth0", "10.1.2.3", 24)
    lo = LocalAddress("lo", "127.0.0.1", 8, loopback=True)
    down = LocalAddress("wlan0", "10.9.9.9", 24, up=False)
    assert netaddr.pick_address("192.168.1.5", [eth]) == "192.168.1.5"
    assert netaddr.pick_address(None, [lo, down, eth]) == "10.1.2.3"
    assert netaddr.pick_address("127.0.0.1", [lo, eth]) == "10.1.2.3"
    assert netaddr.pick_address(None, [lo, down]) == "127.0.0.1"
    assert netaddr.advertised_host("0.0.0.0", lambda: "10.1.2.3") == "10.1.2.3"
    assert netaddr.advertised_host("::", lambda: "10.1.2.3") == "10.1.2.3"
    assert netaddr.advertised_host("10.7.7.7", lambda: "10.1.2.3") == "10.7.7.7"


@pytest.mark.netns
def test_a_daemon_on_all_interfaces_shows_its_lan_address_not_loopback(tmp_path: Path) -> None:
    """In a namespace whose only network is a LAN (no default route), `peerd run` with the default
    bind writes its LAN address as the peer URL (daemon.json, the ready line, status)."""
    with NetnsLab.create() as lab:
        node = lab.node("fc1", lab.lan("fc"))
        home = tmp_path / "home"
        proc = lab.spawn(node, [str(PEERD), "run", "--home", str(home), "--port", "0", "--local-port", "0",
                                "--no-mdns", "--json"], env=ENV, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["peer_url"] == f"http://{node.address}:{info['peer_port']}"
        assert json.loads(homes.daemon_json_path(home).read_text())["peer_url"] == info["peer_url"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_pluralisation_of_counts() -> None:
    """One is singular: "1 message", "1 receipt", "1 node"; other counts are plural."""
    status = {"node_id": "ab" * 32, "name": "n", "fleet_id": "f", "peer_url": "p", "local_url": "http://l",
              "mcp_url": "m", "uptime": 3, "totals": {"messages": 1, "receipts": 1, "ops": 2, "origins": 1},
              "peers": [], "live_peers": 0, "lag": 0, "catchup": None}
    assert "totals  1 message, 1 receipt, 2 ops from 1 node\n" in fmt.format_status(status)
    assert fmt.plural(0, "message") == "0 messages" and fmt.plural(1234, "op") == "1,234 ops"


def test_the_test_script_installs_chromium_without_recommended_packages() -> None:
    """scripts/test asks apt for Chromium alone (--no-install-recommends), not a desktop's worth."""
    script = (ROOT / "scripts" / "test").read_text()
    installs = [line for line in script.splitlines() if "apt-get install" in line]
    assert installs and all("--no-install-recommends" in line for line in installs)
