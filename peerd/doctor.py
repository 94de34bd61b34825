"""``peerd doctor``: check one node's setup and say what to fix.

Checks, in order: the home folder, the other files in it (owner-only), ``config.toml``, the node
key, the replica file, the daemon (``daemon.json``, its process, its local API), the peer and local
ports, mDNS, every seed and every peer the daemon knows (reachable, same fleet), each answering peer's
clock against ours, the fleet's membership news (another fleet on this LAN, join requests waiting,
this node removed or not let in), and the retention horizon with what the last purge removed.

Invariants:
* Doctor changes nothing: the replica file is only looked at read-only
  (``replica.check_file``; no SQL here), test sockets are
  bound only for a moment, and a peer is probed with a sealed ``peers``
  request that names no address of ours, so the peer records nothing.
* Every finding is ``ok``, ``warn``, ``fail`` or ``skip``; every ``fail``
  and ``warn`` carries a fix. A check that cannot run because an earlier one
  failed is a ``skip`` saying why, not a second failure.
* Findings are plain values built by small functions; the I/O (files,
  sockets, HTTP) sits in thin probes that translate every error into a finding.
* Peers are probed with the daemon's own transport and codec, all at once, each bounded by
  the timeout (``peerd.probing``); findings and the report are ``peerd.findings``'.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import stat
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from discovery.netif import probe_mdns_port
from discovery.seeds import format_seed
from peerd import forks
from peerd import home as homes
from peerd.cli.retention import summary_lines as retention_summary
from peerd.config import Config, load_config
from peerd.errors import ConfigError, DaemonError
from peerd.findings import FAIL, OK, SKIP, WARN, Finding, Report, format_report
from peerd.probing import Probe, canonical, clock_finding, clock_skew, peer_finding, probe_all, seed_finding
from replica import StoreError, check_file, identity
from replica.purge import read_state as read_retention

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Finding", "Probe", "Report", "clock_skew", "format_report",
           "membership_findings", "run_checks"]

MDNS_PORT = 5353

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- files -------------------------------------------------------------------------------------


def _loose(path: Path) -> bool:
    """Group or others may read or write it (POSIX only)."""
    return os.name == "posix" and bool(path.stat().st_mode & 0o077)


def check_home(home: Path) -> Finding:
    if not home.exists():
        return Finding("home", FAIL, str(home), "no peerd home here", f"peerd init --home {home}")
    if not home.is_dir():
        return Finding("home", FAIL, str(home), "is not a folder", "point --home (or PEERD_HOME) at a folder")
    if not os.access(home, os.W_OK | os.X_OK):
        return Finding("home", FAIL, str(home), "this user cannot write to it",
                       f"run peerd as the folder's owner, or fix ownership: chown -R $USER {home}")
    loose = homes.open_to_others([home])
    if loose and not loose[0].ours:
        return Finding("home", FAIL, str(home), f"other users can look inside (mode {_mode(home)}), and it belongs "
                       f"to uid {loose[0].uid}, not to this user: peerd cannot make it private", chown_fix([home]))
    if loose:
        return Finding("home", WARN, str(home), f"other users can look inside (mode {_mode(home)})",
                       f"chmod 700 {home}  (peerd also does it when it next opens the home)")
    return Finding("home", OK, str(home), f"private folder (mode {_mode(home)})")


def chown_fix(paths: Sequence[Path]) -> str:
    names = " ".join(str(p) for p in paths)
    return f"as root: chown $(id -un) {names} && chmod go-rwx {names}  (or run peerd as their owner)"


OWN_CHECKS = (homes.CONFIG_TOML, homes.NODE_KEY)  # told about by their own findings


def check_files(home: Path) -> Finding:
    """Every other file in the home (replica and its -wal/-shm, local.token, daemon.json, invites,
    ...) owner-only: loose ones of this user's are a warning (peerd fixes them when it next opens
    the home), ones another user owns a failure peerd cannot fix."""
    entries = [p for p in homes.home_entries(home)[1:] if p.name not in OWN_CHECKS]
    loose = homes.open_to_others(entries)
    if not loose:
        return Finding("files", OK, str(home), "no other file in the home is open to other users")
    listing = ", ".join(x.describe() for x in loose[:5]) + (f" and {len(loose) - 5} more" if len(loose) > 5 else "")
    theirs = [x.path for x in loose if not x.ours]
    if theirs:
        return Finding("files", FAIL, str(home), f"open to other users, and not this user's to fix: {listing}",
                       chown_fix(theirs))
    return Finding("files", WARN, str(home), f"open to other users: {listing}",
                   f"chmod go-rwx {' '.join(str(x.path) for x in loose)}  (peerd also does it when it next opens "
                   "the home)")


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))[2:].rjust(4, "0")


def check_config(home: Path) -> tuple[Finding, Config | None]:
    path = homes.config_path(home)
    if not path.exists():
        if homes.replica_path(home).exists() or homes.node_key_path(home).exists():  # the fleet key is lost
            fix = (f"peerd join <invite> --home {home}  (or peerd init --home {home} --fleet-key <the fleet's key>, "
                   "or --new-fleet)")
            return Finding("config", FAIL, str(path), "missing beside an existing node", fix), None
        fix = f"peerd init --home {home}  (or peerd join <invite>)"
        return Finding("config", FAIL, str(path), "missing", fix), None
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        detail = str(exc).removeprefix(f"{path}: ")
        return Finding("config", FAIL, str(path), detail,
                       "edit the file to fix the named key (or move it aside and run peerd init / peerd join)"), None
    summary = (f"fleet {cfg.fleet_id}, name {cfg.name!r}, peer port {cfg.port}, local port {cfg.local_port}, "
               f"mDNS {'on' if cfg.mdns else 'off'}, {len(cfg.seeds)} seed(s)")
    if _loose(path):
        return Finding("config", WARN, str(path), f"other users can read the fleet key (mode {_mode(path)}); "
                       + summary, f"chmod 600 {path}"), cfg
    return Finding("config", OK, str(path), summary), cfg


def read_key(path: Path) -> tuple[str | None, str | None]:
    """(node id, None) for a good key file, else (None, what is wrong with it)."""
    try:
        seed = bytes.fromhex(path.read_text(encoding="ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None, "is not a node key (expected 64 hex digits)"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    if len(seed) != identity.SEED_BYTES:
        return None, f"holds {len(seed)} bytes, expected {identity.SEED_BYTES} (cut short or overwritten?)"
    return identity.from_seed(seed).node_id, None


def check_key(home: Path) -> tuple[Finding, str | None]:
    path = homes.node_key_path(home)
    restore = ("restore node.key from a backup of this home; if it is lost, move the home aside and run "
               "peerd init (this machine then joins as a new node)")
    if not path.exists():
        if homes.replica_path(home).exists():
            return Finding("node key", FAIL, str(path), "missing while the replica exists: the next start would "
                           "make a new identity for this replica", restore), None
        return Finding("node key", WARN, str(path), "not created yet", f"peerd init --home {home}"), None
    node_id, problem = read_key(path)
    if node_id is None:
        return Finding("node key", FAIL, str(path), problem or "unreadable", restore), None
    if _loose(path):
        return Finding("node key", WARN, str(path), f"other users can read the private key (mode {_mode(path)})",
                       f"chmod 600 {path}"), node_id
    return Finding("node key", OK, str(path), f"node {node_id[:16]}"), node_id


def check_replica(home: Path) -> Finding:
    path = homes.replica_path(home)
    if not path.exists():
        return Finding("replica", WARN, str(path), "not created yet", f"peerd init --home {home}")
    fix = ("stop the daemon and move the home aside; a fresh `peerd init` with the same fleet key "
           "refills the replica from the peers")
    try:
        found = check_file(path)
    except StoreError as exc:
        return Finding("replica", FAIL, str(path), f"cannot be read as a replica: {exc}", fix)
    if found.result != "ok":
        return Finding("replica", FAIL, str(path), f"damaged: {found.result[:200]}", fix)
    text = (f"intact; {found.messages:,} message{'' if found.messages == 1 else 's'}, "
            f"{found.ops:,} op{'' if found.ops == 1 else 's'}")
    if found.newer_ops:
        return Finding("replica", WARN, str(path), f"{text}, of which {found.newer_ops:,} from a newer peerd: "
                       "held, counted and passed on to peers, not applied here", NEWER_FIX)
    if found.pin_refused:
        return Finding("replica", WARN, str(path), f"{text}; {found.pin_refused:,} op(s) from peers refused: sent in "
                       "the name of a role pinned to other nodes", PIN_FIX)
    return Finding("replica", OK, str(path), text)


PIN_FIX = ("see which nodes sent in each role's name with: peerd roles; a member that sends in a pinned role's "
           "name may hold a misused node key (peerd remove NODE takes it out of the fleet)")
NEWER_FIX = "upgrade peerd on this machine: the upgrade applies the ops it holds from the newer one"


# -- the daemon and its ports --------------------------------------------------------------------



def fetch_status(local_url: str, timeout: float, headers: dict[str, str] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(f"{local_url}/api/status", headers=headers or {})
    with _OPENER.open(req, timeout=timeout) as resp:
        data = json.loads(resp.read())
    if not isinstance(data, dict):
        raise ValueError("status is not a JSON object")
    return data


def check_daemon(home: Path, node_id: str | None, timeout: float) -> tuple[Finding, dict[str, Any] | None]:
    start = f"peerd run --home {home}"
    try:
        info = homes.read_daemon_json(home)
    except DaemonError as exc:
        return Finding("daemon", FAIL, str(homes.daemon_json_path(home)), str(exc),
                       f"delete it if no daemon runs, then {start}"), None
    if info is None:
        return Finding("daemon", WARN, "", "not running", start), None
    pid = info.get("pid")
    if not homes.pid_alive(pid):
        return Finding("daemon", WARN, "", f"not running (daemon.json was left behind by pid {pid}, which is gone)",
                       start), None
    url = str(info.get("local_url", ""))
    try:
        st = fetch_status(url, timeout, homes.auth_headers(home))
    except (OSError, ValueError) as exc:
        return unanswered(home, pid, url, exc), None
    if node_id is not None and st.get("node_id") != node_id:
        return Finding("daemon", FAIL, f"pid {pid}", f"runs as node {str(st.get('node_id'))[:16]}, but node.key "
                       f"is node {node_id[:16]}", f"restart it so it loads the current key: {start}"), st
    live = sum(1 for p in st.get("peers", []) if p.get("reachable"))
    return Finding("daemon", OK, f"pid {pid}", f"up {st.get('uptime', 0):.0f} s, local API {url}, "
                   f"{live} of {len(st.get('peers', []))} peers live"), st


def unanswered(home: Path, pid: object, url: str, exc: Exception) -> Finding:
    """A live daemon whose local API did not answer us: refused this user (401), or is in trouble."""
    start = f"peerd run --home {home}"
    if isinstance(exc, urllib.error.HTTPError):
        exc.close()  # its answer is not read
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
        token = homes.local_token_path(home)
        return Finding("daemon", FAIL, f"pid {pid}", f"runs, but refuses this user: its local API at {url} answers "
                       f"only a caller that sends the token in {token}, which this user cannot read",
                       "run peerd as the home's owner")
    problem = f"answers HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else f"does not answer ({exc})"
    return Finding("daemon", FAIL, f"pid {pid}", f"runs, but its local API at {url} {problem}",
                   f"look at the daemon's log; stop it (kill {pid}) and start it again: {start}")


def port_free(host: str, port: int) -> str | None:
    """None if a listener could bind ``host:port`` now, else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use by another program"
            if exc.errno == errno.EACCES:
                return "needs privileges this user lacks (ports below 1024)"
            return exc.strerror or str(exc)
    return None


def check_ports(cfg: Config, status: dict[str, Any] | None, own: Probe | None) -> list[Finding]:
    if status is not None:
        out = [Finding("local port", OK, f"127.0.0.1:{status.get('local_port', '?')}", "the daemon answers here")]
        if own is None or not own.ok:
            why = own.detail if own is not None else "not probed"
            out.append(Finding("peer port", FAIL, f"port {status.get('peer_port')}",
                               f"the daemon's peer port does not answer on this machine: {why}",
                               "look at the daemon's log; check that no firewall blocks the port"))
        else:
            out.append(Finding("peer port", OK, f"port {status.get('peer_port')}", "answers sealed requests"))
        return out
    out = []
    for check, host, port, flag, key in (("peer port", "0.0.0.0", cfg.port, "--port", "port"),
                                         ("local port", "127.0.0.1", cfg.local_port, "--local-port", "local_port")):
        if port == 0:
            out.append(Finding(check, OK, "port 0", "the daemon picks a free port when it starts"))
            continue
        busy = port_free(host, port)
        if busy is None:
            out.append(Finding(check, OK, f"port {port}", "free for the daemon"))
        else:
            out.append(Finding(check, FAIL, f"port {port}", busy,
                               f"stop the program holding it (`ss -ltnp 'sport = :{port}'` names it), or pick "
                               f"another port: {key} = ... in config.toml, or {flag} N (0 = any free port)"))
    return out


# -- mDNS ----------------------------------------------------------------------------------------------


def lan_addresses() -> list[str]:
    """IPv4 addresses of this machine other than loopback."""
    import ifaddr  # noqa: PLC0415 - only this check needs it

    out: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                out.append(ip.ip)
    return out


def check_mdns(cfg: Config, status: dict[str, Any] | None, addresses: Sequence[str],
               port_problem: str | None) -> Finding:
    if not cfg.mdns:
        if not cfg.seeds:
            return Finding("mdns", WARN, "", "off, and there are no seeds: this node finds no peers by itself "
                           "(peers that know it can still reach it)",
                           "add seeds = [\"host:port\"] to config.toml or pass --seed HOST:PORT, or set mdns = true")
        return Finding("mdns", OK, "", "off; peers come from the seed list")
    if not addresses:
        return Finding("mdns", WARN, "", "no network interface besides loopback: mDNS cannot find anybody",
                       "connect this machine to a network, or list peers as seeds")
    if port_problem is not None:
        return Finding("mdns", WARN, f"udp {MDNS_PORT}", f"{port_problem}: another mDNS responder holds it "
                       "without sharing", "stop that responder, or set mdns = false and use seeds")
    found = [p for p in (status or {}).get("peers", []) if p.get("found_by") == "mdns"]
    seen = f"; {len(found)} peer(s) found by mDNS" if status is not None else ""
    return Finding("mdns", OK, "", f"on, on {', '.join(addresses[:4])}{seen}")


def membership_findings(status: dict[str, Any] | None) -> list[Finding]:
    """Other fleets on this LAN, join requests waiting, this node removed, its own history ahead of it
    elsewhere (from the daemon's status)."""
    if status is None:
        return []
    out, fleet, fid = [], status.get("fleet") or {}, str(status.get("fleet_id", ""))
    if fleet.get("removed_here"):
        out.append(Finding("fleet", FAIL, fid, "this node was removed from the fleet: members refuse its new ops and "
                           "its key opens nothing any more", "join again with a fresh home: peerd join --lan --home "
                           "NEW_FOLDER"))
    elif fleet.get("admitted_here") is False:
        out.append(Finding("fleet", FAIL, fid, "no member has let this node in: it holds the fleet key, but every "
                           "member refuses its messages", f"on a member: peerd admit {status.get('node_id')} --name "
                           "NAME (or join with peerd join, which asks a member)"))
    if status.get("join_requests"):
        out.append(Finding("fleet", WARN, "", f"{status['join_requests']} join request(s) wait for approval here",
                           "peerd requests, then peerd approve CODE (or peerd reject CODE)"))
    ahead = status.get("own_history_ahead")
    if isinstance(ahead, dict):
        seen = forks.OwnAhead(str(ahead.get("peer")), int(ahead.get("theirs") or 0), int(ahead.get("ours") or 0))
        out.append(Finding("history", FAIL, seen.peer, seen.message(), forks.FIX))
    for signer, n in ((status.get("snapshot") or {}).get("forged") or {}).items():  # peerd.snapshotting
        out.append(Finding("snapshot", FAIL, signer[:16], f"{n:,} ops this member vouched for in a snapshot did not "
                           "verify (dropped here, and fetched again): it forged them",
                           f"check that machine; if it is not yours, remove it: peerd remove {signer[:16]}"))
    for other in status.get("other_fleets") or []:
        nodes = ", ".join(f"{n.get('name') or n['node_id']} at {n['address']}" for n in other.get("nodes", []))
        out.append(Finding("fleet", WARN, other["fleet_id"], f"another peerd fleet is on this LAN ({nodes}); this "
                           f"node is in fleet {status.get('fleet_id')}, so they never sync",
                           f"to join it: {other['join']} here, then approve on one of its members; to bring those "
                           "machines here instead: peerd join --lan there, then peerd approve here"))
    return out


def relay_finding(relay: dict[str, Any]) -> Finding | None:
    """The return path: who relays for whom, and a member nobody can call that no member relays for;
    None for a member that can be called (or is not known yet not to be) and relays for none."""
    via = ", ".join(str(r.get("name") or r["address"]) for r in relay.get("via") or [])
    served = ", ".join(str(r.get("name") or r["address"]) for r in relay.get("relaying_for") or [])
    also = f"; relaying for {served}" if served else ""
    if relay.get("reachable") is False and not via:
        waits = "; ".join(f"{w['address']}: {w['last_error']}" for w in relay.get("waiting") or [])
        return Finding("relay", WARN, "", "other members cannot call this one and no reachable member holds a link "
                       f"for it yet: its mail waits for its own rounds{'; ' + waits if waits else ''}{also}",
                       "give it a seed that other members can call (a server), or check that one runs")
    if relay.get("reachable") is False:
        return Finding("relay", OK, "", f"other members cannot call this one; relayed by {via}{also}")
    if not served:
        return None
    if relay.get("reachable") is None:
        return Finding("relay", OK, "", f"not known yet whether other members can call this one{also}")
    return Finding("relay", OK, "", f"other members can call this one{also}")


def retention_finding(home: Path, status: dict[str, Any] | None) -> Finding:
    """The fleet's horizon and the last purge here: from the daemon, else from the file (read-only)."""
    state = (status or {}).get("retention")
    if not isinstance(state, dict):
        path = homes.replica_path(home)
        if not path.exists():
            return Finding("retention", SKIP, "", "no replica yet")
        try:
            state = read_retention(str(path)).to_dict()
        except StoreError as exc:
            return Finding("retention", SKIP, "", f"cannot read it: {exc}")
    return Finding("retention", OK, "", "; ".join(" ".join(line.split()) for line in retention_summary(state)))


def in_force(cfg: Config, status: dict[str, Any] | None) -> Config:
    """The config as the running daemon uses it (flags such as --no-mdns and --seed included)."""
    live = (status or {}).get("settings")
    if not isinstance(live, dict):
        return cfg
    seeds = live.get("seeds", cfg.seeds)
    mdns = live.get("mdns", cfg.mdns)
    try:
        return dataclasses.replace(cfg, seeds=tuple(seeds), mdns=bool(mdns))
    except (ConfigError, TypeError):
        return cfg


def run_checks(home: Path, *, timeout: float = 3.0) -> Report:
    """Every check against ``home``; never raises for a broken setup (that is what it reports)."""
    report = Report(str(home))
    add = report.findings.append
    add(check_home(home))
    if not home.is_dir() or not os.access(home, os.W_OK | os.X_OK):
        add(Finding("config", SKIP, "", "no home to check"))
        return report
    add(check_files(home))
    cfg_finding, file_cfg = check_config(home)
    add(cfg_finding)
    key_finding, node_id = check_key(home)
    add(key_finding)
    add(check_replica(home))
    daemon_finding, status = check_daemon(home, node_id, timeout)
    add(daemon_finding)
    if file_cfg is None:
        add(Finding("network", SKIP, "", "ports, mDNS, seeds, peers and clocks need a readable config.toml"))
        return report
    cfg = in_force(file_cfg, status)
    peers = [p for p in (status or {}).get("peers", []) if isinstance(p, dict) and "address" in p]
    seeds = [canonical(s) for s in cfg.seeds]
    own = format_seed("127.0.0.1", status["peer_port"]) if status is not None and "peer_port" in status else None
    addresses = [*seeds, *(p["address"] for p in peers), *([own] if own else [])]
    probes = probe_all(addresses, cfg, timeout, node_id)
    report.findings += check_ports(cfg, status, probes.get(own) if own else None)
    add(check_mdns(cfg, status, lan_addresses() if cfg.mdns else [], probe_mdns_port() if cfg.mdns else None))
    report.findings += membership_findings(status)
    if status is not None and isinstance(status.get("relay"), dict) and (relay := relay_finding(status["relay"])):
        add(relay)
    add(retention_finding(home, status))
    for s in seeds:
        add(seed_finding(probes[s]) if s in probes else Finding("seed", SKIP, s, "too many addresses to probe"))
    for row in peers:
        addr = row["address"]
        if addr not in seeds and addr != own and addr in probes:
            add(peer_finding(probes[addr], row))
    for addr, p in probes.items():
        clock = clock_finding(p) if addr != own else None
        if clock is not None:
            add(clock)
    if not seeds and not peers and status is not None:
        add(Finding("peers", WARN, "", "the daemon knows no peers yet", "add a seed (--seed HOST:PORT) or check mDNS"))
    return report
