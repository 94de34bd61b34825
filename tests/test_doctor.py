"""``peerd doctor`` finds each broken condition it claims to detect, on real files, sockets and daemons,
and says how to fix it; a healthy node passes."""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from peerd import doctor, protocol
from peerd import home as homes
from peerd.config import decode_fleet_key, encode_fleet_key, init_home, new_fleet_key, save_config
from peerd.seal import seal
from replica import open_home
from tests.daemons import PEERD, Fleet, free_ports, patience, wait_until

pytest_plugins = ["tests.daemons"]

ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}


def make_home(tmp_path: Path, name: str = "home", key: bytes | None = None, **changes: Any) -> Path:
    """An initialised home (config, key, replica) on free ports, mDNS off unless asked."""
    home = tmp_path / name
    cfg = init_home(home, name=name, fleet_key=key)
    open_home(home).close()
    peer, local = free_ports(2)
    save_config(homes.config_path(home),
                dataclasses.replace(cfg, **{"port": peer, "local_port": local, "mdns": False, **changes}))
    return home


def findings(report: doctor.Report, check: str) -> list[doctor.Finding]:
    return [f for f in report.findings if f.check == check]


def one(report: doctor.Report, check: str, subject: str | None = None) -> doctor.Finding:
    found = [f for f in findings(report, check) if subject is None or f.subject == subject]
    assert len(found) == 1, report.findings
    return found[0]


def run_doctor(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PEERD), "doctor", "--home", str(home), *extra], capture_output=True, text=True,
                          timeout=60, env=ENV, check=False)


# -- a fake peer port: a real HTTP server on 127.0.0.1 ---------------------------------------------------


@contextlib.contextmanager
def fake_peer(key: bytes | None, *, clock_offset: float = 0.0, reply_clock_ms: int | None = None,
              status: int = 200) -> Iterator[str]:
    """A peer port answering with a sealed peer reply (or 404 text when ``key`` is None), whose
    Date header is ``clock_offset`` s off ours; yields its ``host:port``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if key is None:
                body, code = b"no such page\n", 404
            else:
                reply: dict[str, Any] = {"t": "peers", "k": [], "n": b"\x42" * 8}
                if reply_clock_ms is not None:
                    reply["c"] = reply_clock_ms
                body, code = seal(key, protocol.encode(reply)), status
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def date_time_string(self, timestamp: float | None = None) -> str:
            return email.utils.formatdate(time.time() + clock_offset, usegmt=True)

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


@contextlib.contextmanager
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


# -- a healthy node and the CLI --------------------------------------------------------------------------


def test_a_healthy_fleet_node_has_nothing_to_fix(fleet: Fleet) -> None:
    """Doctor on a running daemon with a live peer: daemon, ports, seed (as the daemon runs) and clock ok;
    exit 0; text and JSON."""
    a = fleet.add("a")
    b = fleet.add("b", seeds=[a])
    fleet.start()
    wait_until(lambda: (b.peer(a) or {}).get("reachable") and (a.peer(b) or {}).get("reachable"), 15,
               "a and b live in each other's table")
    proc = run_doctor(b.home, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["healthy"] is True and report["counts"]["fail"] == 0
    by = {(f["check"], f["subject"]): f for f in report["findings"]}
    assert by[("daemon", f"pid {b.info['pid']}")]["status"] == "ok"
    assert by[("peer port", f"port {b.port}")]["status"] == "ok"
    assert by[("seed", a.addr)]["status"] == "ok" and a.short_id in by[("seed", a.addr)]["detail"]
    assert by[("clock", a.addr)]["status"] == "ok"
    assert by[("mdns", "")]["detail"] == "off; peers come from the seed list"  # --no-mdns and --seed, as run
    text = run_doctor(b.home)
    assert text.returncode == 0 and "0 problem(s)" in text.stdout
    assert any(line.split()[:3] == ["ok", "seed", f"{a.addr}:"] for line in text.stdout.splitlines())
    learned = doctor.run_checks(a.home, timeout=patience(2))  # a has no seeds: b is a peer that reached it
    inbound = next(f for f in learned.findings if f.check == "peer")
    assert inbound.status == "ok" and b.short_id in inbound.detail and "found by inbound" in inbound.detail
    assert not learned.failed


def test_a_broken_home_exits_5_and_says_what_to_fix(tmp_path: Path) -> None:
    """The CLI exits 5 when a check fails and prints the failure with its fix."""
    home = make_home(tmp_path)
    homes.node_key_path(home).write_text("not a key\n")
    proc = run_doctor(home)
    assert proc.returncode == 5
    line = next(line for line in proc.stdout.splitlines() if "node key" in line)
    assert line.lstrip().startswith("FAIL") and "not a node key" in line
    assert "fix: restore node.key from a backup" in proc.stdout


# -- files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "expected"), [
    ("zz-not-hex\n", "is not a node key"),
    ("ab" * 16 + "\n", "holds 16 bytes, expected 32"),
    (None, "missing while the replica exists"),
])
def test_a_bad_key_file_fails(tmp_path: Path, content: str | None, expected: str) -> None:
    """A key file that is not hex, has the wrong length, or is gone (replica kept) is a failure."""
    home = make_home(tmp_path)
    path = homes.node_key_path(home)
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    report = doctor.run_checks(home, timeout=1)
    f = one(report, "node key")
    assert f.status == "fail" and expected in f.detail and f.fix
    assert report.failed


def test_a_good_key_names_the_node(tmp_path: Path) -> None:
    """A good key is ok and the finding names this node's id."""
    home = make_home(tmp_path)
    with open_home(home) as rep:
        node = rep.node_id
    assert one(doctor.run_checks(home, timeout=1), "node key").detail == f"node {node[:16]}"


def test_no_home_fails_without_creating_it(tmp_path: Path) -> None:
    """A missing home is a failure with `peerd init` as the fix, and doctor does not create it."""
    report = doctor.run_checks(tmp_path / "missing", timeout=1)
    f = one(report, "home")
    assert f.status == "fail" and "peerd init" in (f.fix or "")
    assert one(report, "config").status == "skip"
    assert not (tmp_path / "missing").exists()


def test_a_broken_config_fails_and_network_checks_are_skipped(tmp_path: Path) -> None:
    """A config.toml with an unknown key fails naming the key; checks that need it are skipped."""
    home = make_home(tmp_path)
    path = homes.config_path(home)
    path.write_text(path.read_text() + "gossip_intervall = 3\n")
    report = doctor.run_checks(home, timeout=1)
    f = one(report, "config")
    assert f.status == "fail" and "gossip_intervall" in f.detail and "did you mean" in f.detail
    assert one(report, "network").status == "skip"


def test_files_others_can_read_are_warned_about(tmp_path: Path) -> None:
    """A home, config or key readable by other users is a warning with a chmod fix."""
    home = make_home(tmp_path)
    home.chmod(0o755)
    homes.config_path(home).chmod(0o644)
    homes.node_key_path(home).chmod(0o644)
    report = doctor.run_checks(home, timeout=1)
    for check, fix in (("home", "chmod 700"), ("config", "chmod 600"), ("node key", "chmod 600")):
        f = one(report, check)
        assert f.status == "warn" and (f.fix or "").startswith(fix), f
    assert not report.failed


def test_a_damaged_replica_fails(tmp_path: Path) -> None:
    """A replica file that is not a SQLite database is a failure."""
    home = make_home(tmp_path)
    for extra in ("-wal", "-shm"):
        Path(f"{homes.replica_path(home)}{extra}").unlink(missing_ok=True)
    homes.replica_path(home).write_bytes(b"this is not a database" * 100)
    f = one(doctor.run_checks(home, timeout=1), "replica")
    assert f.status == "fail" and "cannot be read" in f.detail


# -- the daemon and ports -----------------------------------------------------------------------------


def test_daemon_json_left_by_a_crash_is_reported(tmp_path: Path) -> None:
    """daemon.json naming a process that is gone: not running, with `peerd run` as the fix."""
    home = make_home(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    homes.write_daemon_json(home, {"pid": int(gone.stdout), "local_url": "http://127.0.0.1:9"})
    f = one(doctor.run_checks(home, timeout=1), "daemon")
    assert f.status == "warn" and "left behind" in f.detail and "peerd run" in (f.fix or "")


def test_a_daemon_whose_api_does_not_answer_fails(tmp_path: Path) -> None:
    """A live pid in daemon.json whose local API does not answer is a failure."""
    home = make_home(tmp_path)
    (closed,) = free_ports(1)
    homes.write_daemon_json(home, {"pid": os.getpid(), "local_url": f"http://127.0.0.1:{closed}"})
    f = one(doctor.run_checks(home, timeout=1), "daemon")
    assert f.status == "fail" and "does not answer" in f.detail


@pytest.mark.parametrize(("check", "key", "host"), [("peer port", "port", "0.0.0.0"),
                                                    ("local port", "local_port", "127.0.0.1")])
def test_a_port_taken_by_another_program_fails(tmp_path: Path, check: str, key: str, host: str) -> None:
    """With no daemon running, a configured port held by another program fails with a way out."""
    with socket.socket() as holder:
        holder.bind((host, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        home = make_home(tmp_path, **{key: port})
        report = doctor.run_checks(home, timeout=1)
    f = one(report, check)
    assert f.status == "fail" and f.subject == f"port {port}" and "in use" in f.detail
    assert f"{key} = " in (f.fix or "")
    other = "local port" if check == "peer port" else "peer port"
    assert one(report, other).status == "ok"


# -- mDNS, seeds, peers, clocks -------------------------------------------------------------------------


def test_no_mdns_and_no_seeds_is_a_warning(tmp_path: Path) -> None:
    """mDNS off with no seeds: the node finds nobody by itself (a warning, with the ways out)."""
    f = one(doctor.run_checks(make_home(tmp_path), timeout=1), "mdns")
    assert f.status == "warn" and "no seeds" in f.detail and "seeds" in (f.fix or "")


def test_unreachable_seeds_fail_each_with_its_reason(tmp_path: Path) -> None:
    """A seed that refuses, one that never answers and one whose name does not resolve each fail."""
    (closed,) = free_ports(1)
    with silent_listener() as silent:
        home = make_home(tmp_path, seeds=(f"127.0.0.1:{closed}", silent, "no-such-host.invalid:7733"))
        t0 = time.monotonic()
        report = doctor.run_checks(home, timeout=0.5)
    assert time.monotonic() - t0 < patience(5), "seeds are probed in parallel, each bounded by the timeout"
    refused = one(report, "seed", f"127.0.0.1:{closed}")
    assert refused.status == "fail" and "refused" in refused.detail and "start peerd there" in (refused.fix or "")
    hung = one(report, "seed", silent)
    assert hung.status == "fail" and "no answer within 0.5 s" in hung.detail and "firewall" in (hung.fix or "")
    dns = one(report, "seed", "no-such-host.invalid:7733")
    assert dns.status == "fail" and "cannot resolve" in dns.detail
    assert findings(report, "clock") == []


def test_seeds_in_another_fleet_or_not_peerd_fail(fleet: Fleet, tmp_path: Path) -> None:
    """A real daemon of another fleet and a web server that is not peerd fail; a same-fleet daemon is ok."""
    other = fleet.add("other", fleet_key=encode_fleet_key(new_fleet_key()))
    mate = fleet.add("mate")
    fleet.start()
    with fake_peer(None) as web:
        home = make_home(tmp_path, key=decode_fleet_key(fleet.key), seeds=(other.addr, mate.addr, web))
        report = doctor.run_checks(home, timeout=patience(2))
    wrong = one(report, "seed", other.addr)
    assert wrong.status == "fail" and "another fleet" in wrong.detail and "peerd join" in (wrong.fix or "")
    stranger = one(report, "seed", web)
    assert stranger.status == "fail" and "not with a body sealed" in stranger.detail
    good = one(report, "seed", mate.addr)
    assert good.status == "ok" and mate.short_id in good.detail
    assert one(report, "clock", mate.addr).status == "ok"


@pytest.mark.parametrize(("offset", "status", "words"), [
    (3600.0, "fail", "about 3600 s ahead of ours"),
    (-20.0, "warn", "about 20 s behind ours"),
    (0.0, "ok", "within a second"),
])
def test_clock_skew_against_a_peer_is_measured(tmp_path: Path, offset: float, status: str, words: str) -> None:
    """A peer whose clock is off is reported ok, warn or fail by how far off it is."""
    key = new_fleet_key()
    with fake_peer(key, clock_offset=offset) as peer:
        report = doctor.run_checks(make_home(tmp_path, key=key, seeds=(peer,)), timeout=patience(2))
    assert one(report, "seed", peer).status == "ok"
    f = one(report, "clock", peer)
    assert f.status == status, f
    said = re.match(r"about (\d+) s (ahead of|behind) ours", f.detail)
    wanted = re.match(r"about (\d+) s (ahead of|behind) ours", words)
    if wanted is None:
        assert words in f.detail, f
    else:  # the skew is read against the request's midpoint: off by up to half a round trip, long under load
        assert said is not None and said[2] == wanted[2], f
        assert abs(int(said[1]) - int(wanted[1])) <= patience(1), f
    assert (f.fix is not None) == (status != "ok")


def test_a_millisecond_clock_in_the_reply_wins_over_the_date_header(tmp_path: Path) -> None:
    """When a peer reply carries its clock (ms), that is used instead of the whole-second Date header."""
    key = new_fleet_key()
    behind_ms = int(time.time() * 1000) - 90_000
    with fake_peer(key, clock_offset=0.0, reply_clock_ms=behind_ms) as peer:
        report = doctor.run_checks(make_home(tmp_path, key=key, seeds=(peer,)), timeout=patience(2))
    f = one(report, "clock", peer)
    assert f.status == "fail" and "behind ours" in f.detail


def test_clock_skew_is_estimated_from_the_round_trip_midpoint() -> None:
    """The Date header (truncated to the second) is compared with the middle of the round trip."""
    sent = 1_000_000.0
    header = email.utils.formatdate(sent + 30, usegmt=True)
    skew = doctor.clock_skew(header, sent, sent + 0.2)
    assert skew is not None and 29.5 <= skew <= 30.5
    assert doctor.clock_skew(None, sent, sent) is None
    assert doctor.clock_skew("garbage", sent, sent) is None
    assert doctor.clock_skew(header, sent, sent + 0.2, reply_ms=int((sent + 0.1) * 1000) - 5000) == pytest.approx(-5)


def test_the_report_text_lists_fixes_under_problems() -> None:
    """Text output: one line per finding, a fix line under each warning or failure, then counts."""
    report = doctor.Report("/h", [
        doctor.Finding("home", "ok", "/h", "private folder"),
        doctor.Finding("seed", "fail", "10.0.0.9:7733", "connection refused", "start peerd there"),
        doctor.Finding("mdns", "warn", "", "off", "add seeds"),
    ])
    lines = doctor.format_report(report).splitlines()
    assert lines[0] == "peerd doctor: /h"
    assert lines[1].split() == ["ok", "home", "/h:", "private", "folder"]
    assert lines[2].lstrip().startswith("FAIL") and lines[3].strip() == "fix: start peerd there"
    assert lines[5].strip() == "fix: add seeds"
    assert lines[-1] == "1 ok, 1 warning(s), 1 problem(s)"
    assert report.to_dict()["healthy"] is False
