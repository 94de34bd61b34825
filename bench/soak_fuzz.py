"""A fuzz and flood campaign against real daemons: the peer port and the local port of daemon A.

Run from the repository root::

    uv run python bench/soak_fuzz.py                 # 100,000 peer-port and 10,000 local inputs
    uv run python bench/soak_fuzz.py --quick         # 5,000 and 1,000 (about a minute)
    uv run python bench/soak_fuzz.py --peer N --local N --seed S

Two ``peerd run`` processes on 127.0.0.1 (the test suite's harness, ``tests/daemons.py``): A is
fuzzed, B is an honest peer seeded with A. Inputs come from a seeded random generator (``--seed``
replays a run), in classes:

* peer port: unsealed bytes; sealed garbage; sealed msgpack values; protocol messages with
  mutated fields (vectors, wants, page ranges, envelopes, peer records as the issue found them:
  64-character labels, ports -1/65536/true); pushes of refused ops (seq 0, 2^63 and 2^64 - 1, a
  held origin with seq >= 2^63, bit flips, A's own ops re-sent); malformed HTTP on raw sockets;
  bodies declared over the limit; wrong paths and methods; and, alongside, a slow-body flood
  (connections from 127.0.0.2 that send a head and then a byte a second).
* local port: API bodies and query strings with odd values (lone surrogates, 2^63, NaN, nesting),
  foreign Host and Origin headers, MCP JSON-RPC (read-only tools with odd arguments, garbage),
  malformed HTTP, declared bodies over the limit.

Nothing the campaign sends may change replicated state, so every write it attempts is invalid by
construction and every inbox it reads belongs to a role seen before the campaign (reading as a new
role records it as seen) that no message was sent to. It reports inputs
tried per class, status codes, crashes (the daemon gone, or a traceback in its log), 5xx answers,
A's state digest before and after, A's RSS after the warm-up and at the end (and its peak), and
the growth of A's log. Afterwards B must still sync with A both ways.

Exit status: 0 when the campaign passes (0 crashes, 0 5xx, state unchanged, RSS within 1.5 x, log
growth within its bound, sync after), 1 otherwise; the figures are printed either way.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _util import Figure, at_most, print_summary, report, section  # noqa: E402

from peerd.config import decode_fleet_key  # noqa: E402
from peerd.seal import seal  # noqa: E402
from replica import identity, open_home  # noqa: E402
from replica.ops import encode as encode_op  # noqa: E402
from tests.daemons import Daemon, Fleet, wait_until  # noqa: E402 - needs the repo root on sys.path
from tests.fuzzwire import wire  # noqa: E402

WORKERS = 8
RSS_FACTOR = 1.5
LOG_GROWTH_MAX = 256 * 1024  # bytes A's log may grow by over the whole campaign
SLOW_SOURCE = "127.0.0.2"
SLOW_COUNT = 200
WARMUP = 0.02  # share of each side's inputs sent before the starting RSS is read

EDGE_INTS = [0, 1, -1, 2**31, 2**32, 2**47, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
ODD_TEXT = ["", " ", "\x00", "a" * 300, "\u00e9\u0301", "a" * 64 + ".example", "::1", "-1", "65536",
            "\u202e", "x" * 70_000]
OUTCOMES_OK_PEER = {200, 400, 403, 404, 405, 408, 413, 431, "closed"}
OUTCOMES_OK_LOCAL = {200, 400, 401, 403, 404, 405, 406, 408, 413, 415, 421, 431, "closed"}


# -- random values ----------------------------------------------------------------------------------


def odd_int(rng: random.Random) -> int:
    return rng.choice(EDGE_INTS) if rng.random() < 0.7 else rng.randint(-(2**63), 2**64 - 1)


def odd_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(ODD_TEXT)
    return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0, 0x2FFF)])) for _ in range(rng.randint(0, 20)))


def odd_value(rng: random.Random, depth: int = 0) -> Any:
    """A msgpack-able value of any shape, up to three levels deep."""
    leaves: list[Callable[[], Any]] = [
        lambda: None, lambda: rng.random() < 0.5, lambda: odd_int(rng),
        lambda: rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf")]),
        lambda: odd_text(rng), lambda: rng.randbytes(rng.randint(0, 40)),
    ]
    nested: list[Callable[[], Any]] = [
        lambda: [odd_value(rng, depth + 1) for _ in range(rng.randint(0, 4))],
        lambda: {rng.choice([odd_text(rng), rng.randbytes(8), odd_int(rng)]): odd_value(rng, depth + 1)
                 for _ in range(rng.randint(0, 4))},
    ]
    return rng.choice(leaves + nested * 2 if depth < 3 else leaves)()


def jsonable(value: Any) -> Any:
    """``value`` with bytes as hex text, keys as text (JSON has no other kinds)."""
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value.hex() if isinstance(value, bytes) else value


# -- peer-port inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    kind: str
    body: bytes
    raw: bool = False  # a whole HTTP request written to a fresh socket, not a POST body


@dataclass
class PeerInputs:
    """Generates peer-port inputs; none of them can change A's replicated state."""

    rng: random.Random
    key: bytes
    a_ops: list[bytes]
    a_origin: bytes

    def sealed(self, msg: Any) -> bytes:
        return seal(self.key, wire(msg))

    def short(self) -> bytes:
        return self.a_origin[:8] if self.rng.random() < 0.5 else self.rng.randbytes(self.rng.choice([7, 8, 9]))

    def vector(self) -> dict[bytes, Any]:
        return {self.short(): odd_int(self.rng) if self.rng.random() < 0.8 else odd_value(self.rng)
                for _ in range(self.rng.randint(0, 3))}

    def refused_op(self) -> bytes:
        rng = self.rng
        pick = rng.randint(0, 4)
        body = {"f": "fz", "fi": None, "c": "fz-nobody", "ti": None, "t": None, "x": odd_text(rng)}
        if pick == 0:  # a held origin with a seq past SQLite's integers (Replica._held)
            ident = identity.generate()
            return encode_op(self.a_origin, rng.choice([2**63, 2**64 - 1]), 1, "msg", body, sign=ident.sign)
        if pick == 1:  # a valid signature on a seq out of range
            ident = identity.generate()
            return encode_op(ident.public_key, rng.choice([0, 2**63, 2**64 - 1]), 1, "msg", body, sign=ident.sign)
        if pick == 2:  # one of A's ops with a bit flipped
            raw = bytearray(rng.choice(self.a_ops))
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
            return bytes(raw)
        if pick == 3:  # one of A's own ops, unchanged: held already, so nothing new
            return rng.choice(self.a_ops)
        return rng.randbytes(rng.randint(0, 120))

    def peer_record(self) -> Any:
        rng = self.rng
        host = rng.choice(["a" * 64 + ".example", "", " 127.255.255.254", "[::1]", "h\u00e9", "999.1.1.1",
                           "127.255.255.254", "host\n", odd_text(rng)])
        port = rng.choice([-1, 0, 65536, True, "7733", 2**63, 9])
        return rng.choice([{"a": host, "p": port, "n": self.short(), "nm": odd_text(rng)}, odd_value(rng)])

    def envelope(self, msg: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        if rng.random() < 0.5:
            msg["n"] = self.short()
        if rng.random() < 0.5:  # only ports a node never dials: an envelope must not send A anywhere
            msg["p"] = rng.choice([0, -1, 65536, True, "x", 2**64 - 1])
        if rng.random() < 0.3:
            msg["nm"] = odd_text(rng)
        return msg

    def protocol_message(self) -> dict[str, Any]:
        rng = self.rng
        kind = rng.choice(["sync", "sync", "pull", "push", "push", "peers", "same", "nope"])
        msg: dict[str, Any] = {"t": kind}
        if kind == "sync":
            msg["v" if rng.random() < 0.7 else "d"] = self.vector() if rng.random() < 0.7 else odd_value(rng)
        elif kind == "pull":
            msg["w"] = self.vector() if rng.random() < 0.8 else odd_value(rng)
        elif kind == "push":
            msg["o"] = [self.refused_op() for _ in range(rng.randint(1, 4))] if rng.random() < 0.9 else odd_value(rng)
            if rng.random() < 0.3:
                msg["r"] = odd_value(rng)
        elif kind == "peers":
            msg["k"] = [self.peer_record() for _ in range(rng.randint(0, 6))] if rng.random() < 0.9 else odd_value(rng)
        for _ in range(rng.randint(0, 1)):
            msg[odd_text(rng)] = odd_value(rng)
        return self.envelope(msg)

    def raw_http(self) -> bytes:
        rng = self.rng
        return rng.choice([
            b"GARBAGE\r\n\r\n",
            b"POST /v1 HTTP/1.1\r\nHost: p\r\nContent-Length: abc\r\n\r\n",
            b"POST /v1 HTTP/1.1\r\nHost: p\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST /v1 HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(40),
            b"POST /v1 HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST /v1 HTTP/9.9\r\nHost: p\r\n\r\n",
            rng.randbytes(rng.randint(1, 200)) + b"\r\n\r\n",
            b"POST /v1 HTTP/1.1\r\nHost: p\r\nContent-Length: 300000000\r\n\r\n",
            b"GET /v1 HTTP/1.1\r\nHost: p\r\n\r\n",
            b"POST /other HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\n\r\n",
        ])

    def __call__(self) -> Input:
        rng = self.rng
        pick = rng.random()
        if pick < 0.15:
            return Input("unsealed bytes", rng.randbytes(rng.randint(0, 400)))
        if pick < 0.25:
            return Input("sealed garbage", seal(self.key, rng.randbytes(rng.randint(0, 300))))
        if pick < 0.40:
            return Input("sealed msgpack value", self.sealed(odd_value(rng)))  # mostly not a map: 400
        if pick < 0.92:
            return Input("protocol message", self.sealed(self.protocol_message()))
        return Input("raw HTTP", self.raw_http(), raw=True)


# -- local-port inputs ------------------------------------------------------------------------------------


READERS = ("fz-a", "fz-b", "fz-c")  # the roles the campaign reads as: seen before it starts, sent nothing


@dataclass
class LocalInputs:
    rng: random.Random
    port: int
    token: str | None  # the home's: most inputs carry it (to reach the handlers), some a wrong one or none

    def fz_role(self) -> str:
        """A role to read as: reading as a role never seen would record it as seen (a write)."""
        return self.rng.choice(READERS)

    def invalid(self) -> Any:
        return self.rng.choice(["\ud800", "", "  ", 5, None, ["x"], {"a": 1}, "a\x00b", "x" * 300, 2**63, True])

    def body(self) -> tuple[str, dict[str, Any]]:
        rng = self.rng
        path = rng.choice(["/api/send", "/api/check", "/api/read", "/api/profiles"])
        if path == "/api/send":  # "from" is always invalid, so nothing is ever sent
            fields: dict[str, Any] = {"from": self.invalid(), "channel": self.fz_role(), "content": odd_text(rng)}
            fields[rng.choice(["channel", "content", "instanceId", "fromInstanceId"])] = odd_value(rng)
        elif path == "/api/check":  # a role nobody wrote to: reading it delivers nothing
            fields = {"recipient": self.fz_role(), "since": odd_int(rng), "limit": odd_int(rng),
                      "recipientInstanceId": rng.choice([None, odd_text(rng)]), "all": rng.choice([True, False, 1])}
        elif path == "/api/read":
            fields = {"receiptIds": [odd_text(rng) for _ in range(rng.randint(0, 3))]}
        else:  # an invalid orchestrator id: no profile is written
            fields = {"orchestratorId": self.invalid(), "name": odd_text(rng), "dynamic": odd_text(rng)}
        for _ in range(rng.randint(0, 2)):
            fields[odd_text(rng)] = odd_value(rng)
        return path, fields

    def json_text(self, fields: dict[str, Any]) -> bytes:
        text = json.dumps(jsonable(fields), ensure_ascii=True)
        if self.rng.random() < 0.2:
            odd = self.rng.choice(['"\\ud800"', "1e400", "18446744073709551616", "NaN", "[" * 40])
            text = text.replace("null", odd, 1)
        return text.encode()

    def query(self) -> str:
        rng = self.rng
        path = rng.choice(["/api/messages", "/api/search", "/api/messages/{v}/status", "/api/profiles/{v}",
                           "/api/status", "/api/peers", "/api/digest", "/api/threads", "/nope"])
        value = rng.choice(["0011223344556677-99999999999999999999", "%ED%A0%80", "%00", "x" * 300, "-1",
                            "0011223344556677-9223372036854775808", odd_int(rng)])
        names = ["after", "limit", "since", "q", "from", "channel", "receipts"]
        params = {k: rng.choice([str(odd_int(rng)), "%00", "%ED%A0%80", "1e9", "", "abc", "99999999999999999999"])
                  for k in rng.sample(names, rng.randint(0, 3))}
        if path == "/api/search":
            params.setdefault("q", rng.choice(["%00", "a", "NEAR(", '"', "*", "%ED%A0%80"]))
        return path.format(v=value) + "?" + "&".join(f"{k}={v}" for k, v in params.items())

    def mcp(self) -> dict[str, Any]:
        rng = self.rng
        tool = rng.choice(["search_messages", "message_status", "get_profile", "whoami", "list_peers",
                           "thread_info", "poll", "has_unread", "check_messages", "send_message", "update_profile"])
        args = {rng.choice(["query", "messageId", "orchestratorId", "thread_id", "after_seq", "since", "limit",
                            "agent_name", odd_text(rng)]): odd_value(rng) for _ in range(rng.randint(0, 3))}
        if tool == "check_messages":
            args = {"recipient": self.fz_role(), "since": odd_int(rng)}
        elif tool in ("send_message", "update_profile"):  # always invalid: no write
            args = {"from": "\ud800", "channel": self.fz_role(), "content": "x", "orchestratorId": 5}
        if rng.random() < 0.2:
            return {"jsonrpc": "2.0", "id": rng.randint(1, 10**6), "method": odd_text(rng), "params": odd_value(rng)}
        return {"jsonrpc": "2.0", "id": rng.randint(1, 10**6), "method": "tools/call",
                "params": {"name": tool, "arguments": args}}

    def headers(self) -> list[tuple[str, str]]:
        rng = self.rng
        host = f"127.0.0.1:{self.port}"
        if rng.random() < 0.1:
            host = rng.choice(["localhost:80@evil.example", "evil.example", "[::1", "127.0.0.1:0", ""])
        out = [("Host", host), ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")]
        token = rng.choices([self.token, "x" * 43, None], weights=[90, 5, 5])[0]
        if token is not None:
            out.append(("Authorization", f"Bearer {token}"))
        if rng.random() < 0.1:
            out.append(("Origin", rng.choice(["http://[::1].evil.example", "http://[::1", "null", "http://evil"])))
        return out


# -- sending --------------------------------------------------------------------------------------------


def raw_exchange(port: int, data: bytes, source: str = "127.0.0.1") -> int | str:
    """Write ``data`` on a fresh connection; the status the server answers with, or "closed"."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        with contextlib.suppress(OSError):
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        try:
            head = s.recv(64)
        except OSError:
            return "closed"
    if head.startswith(b"HTTP/1.1 ") and head[9:12].isdigit():
        return int(head[9:12])
    return "closed"


class Conn(threading.local):
    peer: http.client.HTTPConnection | None = None
    local: http.client.HTTPConnection | None = None


def request(conns: Conn, attr: str, port: int, *, method: str, path: str, body: bytes | None,
            headers: list[tuple[str, str]]) -> int | str:
    """One request on this thread's keep-alive connection (a new one after a close)."""
    for attempt in (1, 2):
        conn = getattr(conns, attr)
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            setattr(conns, attr, conn)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            resp = conn.getresponse()
            resp.read()
            if resp.will_close:
                conn.close()
                setattr(conns, attr, None)
            return int(resp.status)
        except (OSError, http.client.HTTPException):
            conn.close()
            setattr(conns, attr, None)
            if attempt == 2:
                return "closed"
    return "closed"


# -- the slow-body flood ----------------------------------------------------------------------------------


class SlowFlood(threading.Thread):
    """``SLOW_COUNT`` connections from 127.0.0.2, each a head and then a byte a second; reopened when closed."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.opened = 0
        self.replies: Counter[int | str] = Counter()

    def run(self) -> None:
        socks: list[socket.socket] = []
        head = b"POST /v1 HTTP/1.1\r\nHost: p\r\nContent-Length: 100000\r\n\r\n"
        while not self.stop.is_set():
            while len(socks) < SLOW_COUNT:
                s = socket.socket()
                s.bind((SLOW_SOURCE, 0))
                s.settimeout(0.01)
                try:
                    s.connect(("127.0.0.1", self.port))
                    s.sendall(head)
                except OSError:
                    s.close()
                    self.replies["closed"] += 1
                    continue
                self.opened += 1
                socks.append(s)
            alive = []
            for s in socks:
                try:
                    s.sendall(b"x")
                    data = s.recv(64)
                except TimeoutError:
                    alive.append(s)
                    continue
                except OSError:
                    data = b""
                self.replies[int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else "closed"] += 1
                s.close()
            socks = alive
            self.stop.wait(1.0)
        for s in socks:
            s.close()


# -- measuring A --------------------------------------------------------------------------------------------


def log_kinds(text: str) -> tuple[Counter[str], dict[str, str]]:
    """Log lines by level, logger and their first words (addresses and numbers blanked), and one example each."""
    kinds: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(" ", 4)
        if len(parts) == 5:
            words = " ".join(w if not any(c.isdigit() for c in w) else "#" for w in parts[4].split()[:5])
            kind = f"{parts[2]} {parts[3]} {words}"
            kinds[kind] += 1
            examples.setdefault(kind, parts[4])
    return kinds, examples


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Tally:
    tried: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, side: str, kind: str, status: int | str, ok: set[int | str]) -> None:
        with self.lock:
            self.tried[f"{side}: {kind}"] += 1
            self.statuses[f"{side} {status}"] += 1
            if status not in ok:
                self.unexpected[f"{side} {kind} -> {status}"] += 1


def run_inputs(count: int, make: Callable[[int], Callable[[], tuple[str, int | str]]], *, side: str,
               tally: Tally, ok: set[int | str], on_warm: Callable[[], None]) -> None:
    """``count`` inputs over ``WORKERS`` threads; ``on_warm`` once the warm-up share is done."""
    warm_at = max(1, int(count * WARMUP))
    done = 0
    lock = threading.Lock()
    warmed = threading.Event()

    def one(i: int) -> None:
        nonlocal done
        kind, status = make(i)()
        tally.note(side, kind, status, ok)
        with lock:
            done += 1
            if done == warm_at:
                warmed.set()

    with ThreadPoolExecutor(WORKERS) as pool:
        futures = [pool.submit(one, i) for i in range(warm_at)]
        for f in futures:
            f.result()
        on_warm()
        for f in [pool.submit(one, i) for i in range(warm_at, count)]:
            f.result()


# -- the campaign -------------------------------------------------------------------------------------------


@dataclass
class Watch:
    """A's RSS and log, sampled."""

    a: Daemon
    rss_start: int = 0
    rss_peak: int = 0
    log_start: int = 0

    def sample(self) -> int:
        rss = rss_kib(self.a.proc.pid) if self.a.proc is not None else 0
        self.rss_peak = max(self.rss_peak, rss)
        return rss


@contextlib.contextmanager
def sampling(watch: Watch) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.5):
            watch.sample()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def campaign(args: argparse.Namespace, root: Path) -> bool:
    fleet = Fleet(root)
    try:
        a = fleet.add("a")
        b = fleet.add("b", seeds=[a])
        fleet.start()
        for i in range(5):
            a.send("alice", "bob", f"a before the campaign {i}")
            b.send("bob", "alice", f"b before the campaign {i}")
        for role in READERS:  # first seen now, so reading as them during the campaign writes nothing
            a.check(role)
        fleet.wait_converged(timeout=60)
        digest_before = a.digest()
        rep = open_home(a.home)  # A's own ops, to re-send and to flip bits in (a second process on the file)
        a_ops = [raw for _, raw in rep.ops_after(0)]
        a_origin = rep.node_key
        rep.close()
        rng = random.Random(args.seed)
        peer_gen = PeerInputs(random.Random(rng.random()), decode_fleet_key(fleet.key), a_ops, a_origin)
        local_gen = LocalInputs(random.Random(rng.random()), int(a.info["local_port"]), a.token)
        tally = Tally()
        watch = Watch(a, log_start=a.log_path.stat().st_size)
        conns = Conn()
        gen_lock = threading.Lock()

        def peer_input(_i: int) -> Callable[[], tuple[str, int | str]]:
            with gen_lock:
                inp = peer_gen()

            def send() -> tuple[str, int | str]:
                if inp.raw:
                    return inp.kind, raw_exchange(a.port, inp.body)
                return inp.kind, request(conns, "peer", a.port, method="POST", path="/v1", body=inp.body,
                                         headers=[("Host", "peer"), ("Content-Type", "application/octet-stream")])

            return send

        def local_input(_i: int) -> Callable[[], tuple[str, int | str]]:
            with gen_lock:
                pick = local_gen.rng.random()
                headers = local_gen.headers()
                if pick < 0.45:
                    path, fields = local_gen.body()
                    kind, method, body = f"POST {path}", "POST", local_gen.json_text(fields)
                elif pick < 0.75:
                    path, kind, method, body = local_gen.query(), "GET query", "GET", None
                elif pick < 0.95:
                    path, kind, method = "/mcp", "MCP JSON-RPC", "POST"
                    body = local_gen.json_text(local_gen.mcp())
                else:
                    raw = local_gen.rng.choice([b"GARBAGE\r\n\r\n", b"POST /api/send HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                b"Content-Length: 300000000\r\n\r\n", local_gen.rng.randbytes(80)])

                    def send_raw() -> tuple[str, int | str]:
                        return "raw HTTP", raw_exchange(int(a.info["local_port"]), raw)

                    return send_raw

            def send() -> tuple[str, int | str]:
                return kind, request(conns, "local", int(a.info["local_port"]), method=method, path=path, body=body,
                                     headers=headers)

            return send

        def warm() -> None:
            watch.rss_start = max(watch.rss_start, watch.sample())

        section(f"campaign: {args.peer:,} peer-port inputs, {args.local:,} local inputs, seed {args.seed}")
        flood = SlowFlood(a.port)
        started = time.monotonic()
        with sampling(watch):
            flood.start()
            run_inputs(args.local, local_input, side="local", tally=tally, ok=OUTCOMES_OK_LOCAL, on_warm=warm)
            run_inputs(args.peer, peer_input, side="peer", tally=tally, ok=OUTCOMES_OK_PEER, on_warm=warm)
            flood.stop.set()
            flood.join()
        elapsed = time.monotonic() - started
        alive = a.running and b.running
        digest_after = a.digest() if alive else "(gone)"
        rss_end = watch.sample()
        log_text = a.log_text()
        log_growth = a.log_path.stat().st_size - watch.log_start
        tracebacks = log_text.count("Traceback")
        accept_loops = log_text.count("out of system resource")
        sent = b.send("bob", "alice", "after the campaign") if alive else None
        synced = alive and sent is not None and bool(wait_until(lambda: a.has_message(sent["messageId"]), 60, "b to a"))
        sent2 = a.send("alice", "bob", "after the campaign") if alive else None
        synced = synced and sent2 is not None and bool(
            wait_until(lambda: b.has_message(sent2["messageId"]), 60, "a to b"))
        status = a.status() if alive else {}

        section("inputs tried")
        for kind, n in sorted(tally.tried.items()):
            print(f"  {kind}: {n:,}")
        print(f"  slow-body flood from {SLOW_SOURCE}: {flood.opened:,} connections, answers {dict(flood.replies)}")
        section("status codes")
        for k, n in sorted(tally.statuses.items()):
            print(f"  {k}: {n:,}")
        if tally.unexpected:
            print("  unexpected:", dict(tally.unexpected))
        print(f"  A's counters: {status.get('counters')}")
        section("A's log lines written during the campaign, by kind")
        kinds, examples = log_kinds(log_text[watch.log_start:])
        for kind, n in kinds.most_common(15):
            print(f"  {n:6,}  {kind}\n          e.g. {examples[kind][:160]}")
        print(f"  A's peer table: {len(status.get('peers', []))} rows")
        fives = sum(n for k, n in tally.statuses.items() if k.split()[-1].startswith("5"))
        section("figures")
        figures = [
            report(Figure("peer-port inputs", float(sum(n for k, n in tally.tried.items() if k.startswith("peer"))),
                          "")),
            report(Figure("local inputs", float(sum(n for k, n in tally.tried.items() if k.startswith("local"))),
                          "")),
            report(Figure("inputs per second", (args.peer + args.local) / elapsed, "/s")),
            report(Figure("crashes (daemon gone or traceback logged)", float((not alive) + tracebacks), "",
                          at_most(0))),
            report(Figure("5xx answers", float(fives), "", at_most(0))),
            report(Figure("unexpected statuses", float(sum(tally.unexpected.values())), "", at_most(0))),
            report(Figure("state changed (digest before != after)", float(digest_before != digest_after), "",
                          at_most(0))),
            report(Figure("RSS at end / after warm-up", rss_end / max(watch.rss_start, 1), "x", at_most(RSS_FACTOR))),
            report(Figure("RSS peak / after warm-up", watch.rss_peak / max(watch.rss_start, 1), "x",
                          at_most(RSS_FACTOR))),
            report(Figure("RSS after warm-up", watch.rss_start / 1024, "MiB")),
            report(Figure("log growth", log_growth / 1024, "KiB", at_most(LOG_GROWTH_MAX / 1024))),
            report(Figure("log lines", float(len(log_text.splitlines())), "")),
            report(Figure("'out of system resource' lines", float(accept_loops), "", at_most(0))),
            report(Figure("B and A sync both ways afterwards", float(not synced), "", at_most(0))),
        ]
        print(f"  digest before {digest_before}, after {digest_after}; {elapsed:.0f} s")
        print_summary(figures)
        return all(f.verdict != "MISS" for f in figures)
    finally:
        with contextlib.suppress(Exception):
            fleet.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=int, default=100_000, help="peer-port inputs (default 100,000)")
    parser.add_argument("--local", type=int, default=10_000, help="local-port inputs (default 10,000)")
    parser.add_argument("--seed", type=int, default=12, help="seed of the random inputs")
    parser.add_argument("--quick", action="store_true", help="5,000 peer and 1,000 local inputs")
    parser.add_argument("--dir", type=Path, default=None, help="where the daemons' homes go (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.peer, args.local = 5_000, 1_000
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="soak-") as tmp:
        ok = campaign(args, Path(tmp))
    print("PASS" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
