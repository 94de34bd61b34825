"""The one local server (``peerd.local``): its Host/Origin guard, its bounds on connections, heads and
bodies, MCP mounted on first use, and a local API that answers bad input with 400, never 500.
(Who is admitted, and what bodies are, is ``tests/test_local_auth.py``'s.)

Real servers throughout: a ``peerd run`` daemon (started under ``python -X importtime`` so its log
shows what it imported when), or ``LocalServer`` on 127.0.0.1 port 0 with small limits.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from mcp_server.localauth import LocalAuth
from mcp_server.localguard import LOOPBACK_NAMES, host_allowed, origin_allowed, refusal
from peerd.apiargs import parse_body
from peerd.lazymount import LazyMount, McpBuilder
from peerd.limits import LOCAL_CONNECTIONS, connection_cap
from peerd.local import Limits, LocalServer, build_app, find_local_app
from replica import InvalidArgument
from tests.daemons import Daemon, Fleet, message_ids
from tests.localclient import mcp_client

pytest_plugins = ["tests.daemons"]

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parent.parent
MCP_IMPORT = re.compile(r"^import time:.*\|\s+mcp(\.|$)", re.MULTILINE)


# -- the guard, as a pure rule ----------------------------------------------------------------


def model_host(value: str) -> bool:
    """An independent statement of the Host rule: a loopback name, then nothing or :port (1-65535)."""
    low = value.lower() if value.isascii() else value
    for name in LOOPBACK_NAMES:
        if low == name:
            return True
        if low.startswith(name + ":"):
            port = low[len(name) + 1:]
            return port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535
    return False


def model_origin(value: str, port: int) -> bool:
    """An independent statement of the Origin rule: ``http://``, a loopback name, and this very port
    (none for 80), written as a browser writes it."""
    low = value.lower() if value.isascii() else value
    if not low.startswith("http://"):
        return False
    rest = value[len("http://"):]
    for name in LOOPBACK_NAMES:
        if rest.lower() == name:
            return port == 80
        if rest.lower() == f"{name}:{port}":
            return True
    return False


OWN_PORT = 7734


PIECES = ["127.0.0.1", "localhost", "LocalHost", "[::1]", "[::1", "::1", "[0:0:0:0:0:0:0:1]", "127.0.0.2",
          "evil.example", ".evil.example", "@", ":", "/", "?", "#", "%", ".", "[", "]", "80", "0", "65535", "65536",
          "080", "-1", "+1", " ", "\t", "\x00", "\u017f", "\u212a", "\u0661", "localho\u017ft", "http://", "https://",
          "HTTP://", "file://", "null", "user:pw@", "\xff"]
NAMES = [*LOOPBACK_NAMES, "LOCALHOST", "[::1", "::1", "127.0.0.1.", "localhost.", "127.1", "evil.example", "", "\u017f"]


@st.composite
def authorities(draw: st.DrawFn) -> str:
    """Near misses of a loopback Host (and some hits): a name, maybe a port, maybe a tail."""
    name = draw(st.sampled_from(LOOPBACK_NAMES) | st.sampled_from(NAMES))
    port = draw(st.just("") | st.integers(0, 70_000).map(":{}".format)
                | st.sampled_from([":", ":080", ":-1", ":8o", ":\u0661", ":+1", ":1234567"]))
    tail = draw(st.just("") | st.sampled_from(["/", "@evil.example", ".evil.example", "?", "#", ":1", "]", " "]))
    return name + port + tail


origins = st.tuples(st.sampled_from(["http://", "https://"]) | st.sampled_from(["HTTPS://", "ws://", "file://",
                                                                                 "http:/", "", "null"]),
                    authorities()).map("".join)
header_values = st.one_of(authorities(), origins, st.lists(st.sampled_from(PIECES), max_size=6).map("".join),
                          st.text(max_size=40))


def on_the_wire(value: str) -> bool:
    """What h11 passes through unchanged as a header value (it strips spaces and refuses controls)."""
    return value.isascii() and value.isprintable() and value.strip() == value != ""


@given(header_values)
def test_host_rule_matches_its_model(value: str) -> None:
    """Fuzzed Host values: accepted exactly when they are a loopback name with an optional port 1-65535."""
    assert host_allowed(value) == model_host(value)


@given(header_values | st.integers(0, 70_000).map(lambda p: f"http://localhost:{p}"), st.sampled_from([OWN_PORT, 80]))
def test_origin_rule_matches_its_model(value: str, port: int) -> None:
    """Fuzzed Origin values: accepted exactly when http:// plus a loopback name and the server's own port."""
    assert origin_allowed(value, port) == model_origin(value, port)


@given(st.lists(st.tuples(st.sampled_from([b"host", b"Host", b"origin", b"ORIGIN", b"x-other"]) | st.binary(max_size=8),
                          st.binary(max_size=40)), max_size=6))
def test_refusal_never_raises_and_never_lets_a_foreign_host_through(headers: list[tuple[bytes, bytes]]) -> None:
    """Any header list: refusal() returns a reason or None, and None only for one loopback Host."""
    reason = refusal(headers, OWN_PORT)
    hosts = [v.decode("latin-1") for k, v in headers if k.lower() == b"host"]
    origins = [v.decode("latin-1") for k, v in headers if k.lower() == b"origin"]
    if reason is None:
        assert len(hosts) == 1 and model_host(hosts[0])
        assert len(origins) <= 1 and all(model_origin(o, OWN_PORT) for o in origins)


def test_regressions_of_the_two_old_guards() -> None:
    """Each value that one of the old guards got wrong now gets the one right answer."""
    assert not host_allowed("localhost:80@evil.example")
    assert not origin_allowed("http://[::1].evil.example", 80)
    assert not origin_allowed("http://[::1", 80)
    assert not origin_allowed("null", 80) and not origin_allowed("", 80) and not origin_allowed("http://localhost/", 80)
    assert host_allowed("[::1]") and host_allowed("[::1]:7734") and host_allowed("LOCALHOST:1")
    assert origin_allowed("http://[::1]:3000", 3000) and origin_allowed(None, 3000) and origin_allowed(None, None)
    assert not origin_allowed("http://[::1]:3000", 7734) and not origin_allowed("http://localhost:7734", None)
    assert not origin_allowed("https://localhost:7734", 7734) and not origin_allowed("http://localhost:07734", 7734)
    assert not host_allowed("127.0.0.1:0") and not host_allowed("127.0.0.1:65536") and not host_allowed(None)


def test_connection_cap_stays_under_the_open_file_limit() -> None:
    """A quarter of the soft open-file limit, between 16 and 512; unlimited gives the ceiling."""
    assert connection_cap(1024, LOCAL_CONNECTIONS) == 256
    assert connection_cap(100, LOCAL_CONNECTIONS) == 25
    assert connection_cap(32, LOCAL_CONNECTIONS) == 16
    assert connection_cap(1 << 20, LOCAL_CONNECTIONS) == 512 and connection_cap(-1, LOCAL_CONNECTIONS) == 512


# -- raw HTTP, so that any header can be sent --------------------------------------------------


def raw_request(port: int, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"",
                timeout: float = 30) -> tuple[int, bytes]:
    """One request on its own connection, headers exactly as given; (status, body)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), "Connection: close",
             f"Content-Length: {len(body)}"]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), payload


MCP_INIT = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
MCP_HEADERS = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")]


def authorized(d: Daemon) -> list[tuple[str, str]]:
    """The header that admits a client of ``d`` (its home's token)."""
    return [("Authorization", f"Bearer {d.token}")]


# -- a real daemon --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module, run under ``python -X importtime`` (import lines go to its log)."""
    fleet = Fleet(tmp_path_factory.mktemp("local"))
    try:
        d = fleet.add("d", exec_prefix=[sys.executable, "-X", "importtime"])
        fleet.start()
        yield d
    finally:
        fleet.close()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_daemon_starts_without_the_mcp_sdk_and_loads_it_on_the_first_mcp_request(daemon: Daemon) -> None:
    """Up to `peerd ready` the daemon imports nothing of `mcp`; the first /mcp request loads it and works."""
    started = daemon.log_text().split("peerd ready", 1)[0]
    assert "import time:" in started and "aiohttp" in started
    assert not MCP_IMPORT.search(started), MCP_IMPORT.findall(started)[:5]

    async def whoami() -> dict[str, Any]:
        async with mcp_client(f"{daemon.info['mcp_url']}?role=lazy", daemon.token) as c:
            result = await c.call_tool("whoami", {})
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    assert asyncio.run(whoami())["role"] == "lazy"
    assert MCP_IMPORT.search(daemon.log_text().split("peerd ready", 1)[1])


def test_import_chain_of_daemon_and_cli_has_no_mcp() -> None:
    """`peerd.daemon`, `peerd.cli` and the guard import no module of the MCP SDK (checked in a fresh interpreter)."""
    code = ("import sys, peerd.daemon, peerd.cli, peerd.local, mcp_server.localguard, mcp_server.wiring;"
            "bad = sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.'));"
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


FOREIGN = [
    ("Host", "localhost:80@evil.example"), ("Host", "evil.example"), ("Host", "127.0.0.1.evil.example:1"),
    ("Host", "localhost:0"), ("Host", "localhost:99999"), ("Host", "localhost:8o"), ("Host", "[::1"),
    ("Host", "localhost/x"), ("Host", "user@localhost"), ("Host", "localho\xdft"),
    ("Origin", "http://[::1].evil.example"), ("Origin", "http://[::1"), ("Origin", "null"),
    ("Origin", "http://evil.example"), ("Origin", "http://localhost.evil.example"), ("Origin", "file://localhost"),
    ("Origin", "http://localhost:80@evil.example"), ("Origin", "http://localhost/"), ("Origin", "ws://localhost"),
]


@pytest.mark.parametrize(("name", "value"), FOREIGN, ids=[f"{n}={v}" for n, v in FOREIGN])
@pytest.mark.parametrize("path", ["/api/send", "/mcp"])
def test_foreign_host_or_origin_gets_the_same_403_on_api_and_mcp(daemon: Daemon, path: str, name: str,
                                                                 value: str) -> None:
    """A malformed or foreign Host/Origin gets 403 with one JSON error on /api and /mcp; nothing is written."""
    port = daemon.info["local_port"]
    host = [] if name == "Host" else [("Host", f"127.0.0.1:{port}")]
    before = message_ids(daemon.db)
    body = json.dumps({"from": "x", "channel": "y", "content": "z"}).encode() if path == "/api/send" else MCP_INIT
    status, payload = raw_request(port, "POST", path, [*host, (name, value), *MCP_HEADERS], body)
    assert status == 403
    assert json.loads(payload)["error"].startswith("forbidden: ")
    assert message_ids(daemon.db) == before


@pytest.mark.parametrize("host", ["[::1]", "[::1]:{port}", "LOCALHOST:{port}", "127.0.0.1"])
def test_every_loopback_host_spelling_is_served_on_api_and_mcp(daemon: Daemon, host: str) -> None:
    """Host `[::1]` (with or without a port), `localhost`, `127.0.0.1` reach both the API and MCP."""
    port = daemon.info["local_port"]
    headers = [("Host", host.format(port=port)), ("Origin", f"http://[::1]:{port}"), *authorized(daemon)]
    status, payload = raw_request(port, "GET", "/api/digest", headers)
    assert status == 200 and "digest" in json.loads(payload)
    status, payload = raw_request(port, "POST", "/mcp", [*headers, *MCP_HEADERS], MCP_INIT)
    assert status == 200 and b'"serverInfo"' in payload


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.tuples(st.just("Host"), authorities().filter(on_the_wire))
       | st.tuples(st.just("Origin"), origins.filter(on_the_wire)))
def test_fuzzed_headers_over_the_daemon_get_403_or_service_never_500(daemon: Daemon,
                                                                      header: tuple[str, str]) -> None:
    """Over the real daemon: a fuzzed Host/Origin is refused (403) exactly when the rule says so; never a 500."""
    name, value = header
    port = daemon.info["local_port"]
    host = [] if name == "Host" else [("Host", f"localhost:{port}")]
    allowed = model_host(value) if name == "Host" else model_origin(value, port)
    for method, path in (("GET", "/api/digest"), ("POST", "/mcp")):
        status, _ = raw_request(port, method, path, [*host, (name, value), *MCP_HEADERS, *authorized(daemon)],
                                MCP_INIT * (path == "/mcp"))
        assert status != 500
        assert (status == 403) == (not allowed), (path, status)


def test_a_300_mb_declared_body_is_refused_unread(daemon: Daemon) -> None:
    """Content-Length 300 MB gets 413 before a byte of body is sent, and the daemon's RSS stays put."""
    port, pid = daemon.info["local_port"], daemon.info["pid"]
    before = rss_kib(pid)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"POST /api/send HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                  f"Authorization: Bearer {daemon.token}\r\n"
                  f"Content-Length: {300 * MiB}\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):  # the daemon answers and closes: it will read nothing more
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.endswith(b'{"error":"request body over 6291456 bytes"}')
    # the body may be read up to its 6 MiB limit before the cut (and the allocator keeps what it freed):
    # far below the 300 MB a buffering server would take
    assert rss_kib(pid) - before < 16 * 1024


def test_a_chunked_body_is_cut_off_at_the_limit(daemon: Daemon) -> None:
    """A chunked body with no length is counted while read: 413 once past 6 MiB, not buffered to 300 MB."""
    port, pid = daemon.info["local_port"], daemon.info["pid"]
    before = rss_kib(pid)
    chunk = 64 * 1024
    frame = b"%x\r\n" % chunk + b"x" * chunk + b"\r\n"
    pushed = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"POST /api/send HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nTransfer-Encoding: chunked\r\n"
                  f"Content-Type: application/json\r\nAuthorization: Bearer {daemon.token}\r\n\r\n".encode())
        try:
            while pushed < 300 * MiB:
                pushed += s.send(frame)
        except (ConnectionResetError, BrokenPipeError):
            pass  # the daemon closed the connection on us: what this test wants
    assert pushed < 64 * MiB
    # the body may be read up to its 6 MiB limit before the cut (and the allocator keeps what it freed):
    # far below the 300 MB a buffering server would take
    assert rss_kib(pid) - before < 16 * 1024


# -- bad input on the local API: 400 with a reason, never 500 ------------------------------------

BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("/api/send", b'{"from": "a", "channel": "b", "content": "\\ud800"}', "content is not valid Unicode"),
    ("/api/send", b'{"from": "\\udfff", "channel": "b", "content": "x"}', "from is not valid Unicode"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": "x", "\\ud800": 1}', "field name in body"),
    ("/api/send", b'{"channel": "b", "content": "x"}', "from is required"),
    ("/api/send", b'{"from": 5, "channel": "b", "content": "x"}', "from must be a string"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": "x", "instanceId": []}', "instanceId must be a string"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": NaN}', "NaN is not a JSON number"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": 1e400}', "too large"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests deeper"),
    ("/api/send", b'{"from": "a", "channel": "b", "content": "\xff"}', "not UTF-8"),
    ("/api/send", b"[1]", "must be a JSON object"),
    ("/api/check", b'{"recipient": "b", "since": 9223372036854775808}', "since is out of range"),
    ("/api/check", b'{"recipient": "b", "since": -9223372036854775809}', "since is out of range"),
    ("/api/check", b'{"recipient": "b", "since": 9223372036854775807, "all": "yes"}', "all must be true or false"),
    ("/api/check", b'{"recipient": "b", "limit": 99999999999999999999999}', "limit is out of range"),
    ("/api/check", b'{"recipient": "b", "since": "1"}', "since must be an integer"),
    ("/api/check", b'{"recipient": "\\ud800"}', "recipient is not valid Unicode"),
    ("/api/read", b'{"receiptIds": "abc"}', "receiptIds must be a list of strings"),
    ("/api/read", b'{"receiptIds": ["\\ud800"]}', "receiptIds[0] is not valid Unicode"),
    ("/api/profiles", b'{"orchestratorId": "o", "static": {"a": 1}}', "static must be a string"),
]


@pytest.mark.parametrize(("path", "body", "reason"), BAD_BODIES, ids=[r for _, _, r in BAD_BODIES])
def test_bad_json_bodies_get_400_naming_the_problem(daemon: Daemon, path: str, body: bytes, reason: str) -> None:
    """Lone surrogates, 2^63+ integers, NaN, deep nesting, wrong types: 400 with a reason, nothing written."""
    port = daemon.info["local_port"]
    before = message_ids(daemon.db)
    status, payload = raw_request(port, "POST", path, [("Host", f"127.0.0.1:{port}"),
                                                       ("Content-Type", "application/json"), *authorized(daemon)], body)
    assert (status, reason in json.loads(payload)["error"]) == (400, True), payload
    assert message_ids(daemon.db) == before


BAD_QUERIES: list[tuple[str, int, str]] = [
    ("/api/messages?after=9223372036854775808", 400, "after must be an integer between"),
    ("/api/messages?after=1_000", 400, "after must be an integer"),
    ("/api/messages?after=%D9%A3", 400, "after must be an integer"),
    ("/api/messages?limit=99999999999999999999", 400, "limit must be an integer"),
    ("/api/search?q=x&since=9223372036854775808", 400, "since must be an integer between"),
    ("/api/search?q=x&since=9223372036854775807", 400, "since must be between 0 and 9007199254740991"),
    ("/api/search?q=x&since=9007199254740991", 200, ""),
    ("/api/search?q=%00", 400, "NUL"),
    ("/api/search?q=%ED%A0%80", 200, ""),
    ("/api/messages/0123456789abcdef-9223372036854775808/status", 404, "unknown message id"),
    ("/api/messages/0123456789abcdef-99999999999999999999/status", 404, "unknown message id"),
    ("/api/messages/%ED%A0%80/status", 404, "unknown message id"),
    ("/api/profiles/%ED%A0%80", 200, ""),
]


@pytest.mark.parametrize(("path", "status", "reason"), BAD_QUERIES, ids=[p for p, _, _ in BAD_QUERIES])
def test_bad_query_and_path_parameters_never_get_500(daemon: Daemon, path: str, status: int, reason: str) -> None:
    """Huge integers and encoded surrogates in query and path parameters: a clear 400/404, or a plain answer."""
    got, payload = daemon.call("GET", path)
    assert got == status, payload
    if reason:
        assert reason in payload["error"]


def test_the_api_still_works_for_good_input(daemon: Daemon) -> None:
    """Not everything is refused: a well-formed send and check round-trip through the strict parser."""
    sent = daemon.send("alpha", "beta", "fine \u00e9\U0001f600")
    inbox = daemon.check("beta", since=0, limit=5)
    assert [m["messageId"] for m in inbox["messages"]] == [sent["messageId"]]
    assert sent["messageId"] in message_ids(daemon.db)


def test_parse_body_accepts_json_objects_and_refuses_the_rest() -> None:
    """The pure body parser: {} for empty, the object for JSON; InvalidArgument otherwise."""
    assert parse_body(b"") == {}
    assert parse_body(b'{"a": [1, 2.5, null, {"b": "\\u00e9"}]}') == {"a": [1, 2.5, None, {"b": "\u00e9"}]}
    for bad in (b"{", b"\xef\xbb\xbf{}", b'"x"', b'{"a": Infinity}', b'{"a": -9223372036854775809}'):
        with pytest.raises(InvalidArgument):
            parse_body(bad)


# -- LocalServer with small limits ---------------------------------------------------------------


async def ping(_r: Request) -> Response:
    return PlainTextResponse("pong")


async def echo(r: Request) -> Response:
    return PlainTextResponse(str(len(await r.body())))


ROUTES = [Route("/ping", ping), Route("/echo", echo, methods=["POST"])]
TOKEN = "t" * 43
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AUTH_LINE = f"Authorization: Bearer {TOKEN}\r\n".encode()


@asynccontextmanager
async def small_server(mcp: McpBuilder | None = None, **limits: Any) -> AsyncIterator[LocalServer]:
    bounds = Limits(**{"max_connections": 4, "head_timeout": 0.5, "body_timeout": 0.5, **limits})
    async with LocalServer(build_app(ROUTES, mcp, bounds, auth=LocalAuth(TOKEN)), limits=bounds) as server:
        yield server


async def exchange(port: int, data: bytes) -> bytes:
    """Write ``data`` on a new connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


async def test_a_head_that_never_completes_is_dropped() -> None:
    """A connection that sends nothing, or half a head, is closed after the head timeout."""
    async with small_server() as server:
        assert await exchange(server.port, b"") == b""
        assert await exchange(server.port, b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n") == b""
        answer = await exchange(server.port, b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                                + AUTH_LINE + b"\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"pong")


async def test_a_body_that_stalls_gets_408() -> None:
    """A body that stops arriving gets 408 with the JSON error once the body timeout passes."""
    async with small_server() as server:
        answer = await exchange(server.port, b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                                b"Content-Type: application/json\r\n" + AUTH_LINE + b"\r\n12")
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'{"error":"request body not received within 0.5 s"}' in answer


async def test_connections_over_the_cap_are_closed_at_once() -> None:
    """With the cap held by idle connections a new one is closed unanswered; once one goes, service resumes."""
    async with small_server(head_timeout=60) as server:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
        assert await asyncio.wait_for(exchange(server.port, b""), 10) == b""  # closed unanswered, not timed out
        reader, writer = held.pop()
        writer.write(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + AUTH_LINE + b"\r\n")
        assert (await reader.read()).endswith(b"pong")  # a held connection is served
        writer.close()
        async with httpx2.AsyncClient(timeout=10, headers=AUTH) as client:
            for _ in range(500):  # the server frees the slot when it sees the close
                try:
                    if (await client.get(f"{server.url}/ping")).text == "pong":
                        break
                except httpx2.TransportError:
                    await asyncio.sleep(0.02)
            else:
                pytest.fail("the server never served again after a held connection closed")
        for _, w in held:
            w.close()


# -- MCP built on first use -------------------------------------------------------------------------


class FakeMcp:
    """A builder of a small ASGI app with a lifespan, recording what happened where."""

    def __init__(self, fail_first: bool = False) -> None:
        self.events: list[str] = []
        self.threads: list[bool] = []
        self.release = threading.Event()
        self.building = threading.Event()
        self.fail_first = fail_first

    def __call__(self) -> ASGIApp:
        self.threads.append(threading.current_thread() is threading.main_thread())
        self.building.set()
        assert self.release.wait(30)
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("no SDK here")

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            self.events.append("start")
            yield
            self.events.append("stop")

        async def mcp(_r: Request) -> Response:
            return PlainTextResponse("mcp")

        return Starlette(routes=[Route("/mcp", mcp, methods=["GET", "POST"])], lifespan=lifespan)


async def test_mcp_is_built_once_off_the_loop_and_stopped_with_the_server() -> None:
    """The first /mcp request builds in a worker thread while the loop keeps serving; concurrent first
    requests share that one build; its lifespan starts then and stops when the server stops."""
    fake = FakeMcp()
    async with small_server(fake, max_connections=16) as server, httpx2.AsyncClient(timeout=30, headers=AUTH) as client:
        first = [asyncio.create_task(client.post(server.mcp_url)) for _ in range(3)]
        assert await asyncio.to_thread(fake.building.wait, 30)
        assert (await client.get(f"{server.url}/ping")).text == "pong"  # the loop is free during the build
        fake.release.set()
        assert [r.text for r in await asyncio.gather(*first)] == ["mcp"] * 3
        assert (await client.get(server.mcp_url)).text == "mcp"
        mount = find_local_app(server.app)
        assert mount is not None and mount.mcp is not None and mount.mcp.builds == 1
        assert fake.threads == [False] and fake.events == ["start"]
    assert fake.events == ["start", "stop"]


async def test_concurrent_first_callers_wait_for_one_build() -> None:
    """Eight callers of ready() at once: one build, one app, one lifespan start."""
    fake = FakeMcp()
    fake.release.set()
    mount = LazyMount(fake)
    apps = await asyncio.gather(*(mount.ready() for _ in range(8)))
    assert len({id(a) for a in apps}) == 1 and mount.builds == 1 and fake.events == ["start"]
    await mount.close()
    assert fake.events == ["start", "stop"]


async def test_a_failed_mcp_build_gets_503_and_the_next_request_retries() -> None:
    """If building MCP fails the request gets 503 with the JSON error; the next request builds again."""
    fake = FakeMcp(fail_first=True)
    fake.release.set()
    async with small_server(fake) as server, httpx2.AsyncClient(timeout=30, headers=AUTH) as client:
        failed = await client.post(server.mcp_url)
        assert failed.status_code == 503 and "no SDK here" in failed.json()["error"]
        assert (await client.post(server.mcp_url)).text == "mcp"


def test_the_daemon_log_has_no_traceback_from_all_of_this(daemon: Daemon) -> None:
    """After every refused and malformed request above, the daemon logged no traceback and still answers."""
    assert daemon.status()["pid"] == daemon.info["pid"]
    assert "Traceback" not in daemon.log_text()
