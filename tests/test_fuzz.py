"""Fuzzing every boundary (Hypothesis, bounded in examples): the peer port (sealed and unsealed bodies)
and the local API of a real daemon, op decoding, sync messages, MCP arguments over the in-process client,
stdio lines over a real ``peerd mcp``-style subprocess, and the command line.

What must hold everywhere: a clear refusal (a 4xx, ``invalid_argument`` / ``not_found``, a JSON-RPC
error, exit code 1 or 2), never a 500, an ``internal_error``, a traceback, a hang or a dead process;
and input that is refused changes nothing.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_server import Wiring, build_server
from mcp_server.tools import TOOLS
from peerd import protocol
from peerd.cli import main as cli_main
from peerd.config import decode_fleet_key
from peerd.seal import seal
from replica import InvalidOp, RemoteError, Replica, identity, open_home
from replica.ops import encode
from tests.daemons import Daemon, Fleet
from tests.fuzzwire import packed, wire

pytest_plugins = ["tests.daemons"]

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

# -- strategies ----------------------------------------------------------------------------------

EDGE_INTS = st.sampled_from([0, 1, -1, 2**31, 2**32, 2**47, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
INTS = st.one_of(EDGE_INTS, st.integers(min_value=-(2**63), max_value=2**64 - 1))
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "\x00", "a" * 300, "broadcast", "\u00e9\u0301",
                                                       "a" * 64 + ".example", "::1", "127.0.0.1"]))
SHORT_IDS = st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=12))
LEAVES = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True), TEXT, st.binary(max_size=40))
# msgpack values: maps with str, bytes or int keys, lists, leaves
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=5),
    st.dictionaries(st.one_of(TEXT, st.binary(max_size=9), INTS), inner, max_size=5)), max_leaves=20)


@st.composite
def peer_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Messages shaped like the protocol's, with every field drawn from odd values."""
    kind = draw(st.sampled_from(["sync", "pull", "push", "peers", "same", "nope", None]))
    msg: dict[str, Any] = {} if kind is None else {"t": kind}
    vector = st.dictionaries(SHORT_IDS, INTS, max_size=4)
    fields = {
        "v": vector, "d": st.binary(max_size=10), "w": vector,
        "o": st.lists(st.one_of(st.binary(max_size=80), st.builds(_odd_op)), max_size=4),
        "r": INTS, "k": st.lists(st.one_of(VALUES, st.fixed_dictionaries(
            {"a": TEXT, "p": st.one_of(INTS, st.booleans(), TEXT), "n": SHORT_IDS, "nm": TEXT})), max_size=5),
        "nm": TEXT, "n": SHORT_IDS, "p": st.one_of(INTS, TEXT),
    }
    for key in draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=4)):
        msg[key] = draw(fields[key] | VALUES)
    return msg


def _odd_op(seq: int = 2**63, stamp: int = 1) -> bytes:
    """A correctly signed op from a fresh key with an out-of-range seq: always refused."""
    ident = identity.generate()
    return encode(ident.public_key, seq, stamp, "msg", {"f": "a", "fi": None, "c": "b", "ti": None, "t": None,
                                                         "x": "y"}, sign=ident.sign)


# -- a real daemon -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    fleet = Fleet(tmp_path_factory.mktemp("fuzz"))
    try:
        d = fleet.add("d")
        fleet.start()
        d.send("alice", "bob", "already here")
        yield d
    finally:
        fleet.close()  # fails the module if the daemon logged a traceback


@contextlib.contextmanager
def peer_connection(d: Daemon) -> Iterator[http.client.HTTPConnection]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        yield conn
    finally:
        conn.close()


def post_peer(conn: http.client.HTTPConnection, body: bytes) -> int:
    conn.request("POST", "/v1", body=body, headers={"Content-Type": "application/octet-stream"})
    resp = conn.getresponse()
    resp.read()
    if resp.getheader("Connection", "").lower() == "close":
        conn.close()
    return int(resp.status)


@FUZZ
@given(body=st.one_of(st.binary(max_size=300), peer_messages().map(wire), VALUES.map(packed), VALUES.map(wire)),
       sealed=st.booleans())
def test_the_peer_port_answers_any_body_with_200_400_or_403(daemon: Daemon, body: bytes, sealed: bool) -> None:
    """Raw or sealed with the fleet key, any body gets 200 (a valid request), 400 or 403; never a 500."""
    data = seal(decode_fleet_key(daemon.fleet_key), body) if sealed else body
    with peer_connection(daemon) as conn:
        status = post_peer(conn, data)
    assert status in (200, 400) if sealed else status == 403


def test_the_daemon_is_unchanged_by_the_peer_port_fuzz(daemon: Daemon) -> None:
    """After the fuzz: the same single message, the daemon still answering, its log free of tracebacks."""
    assert daemon.running
    assert daemon.status()["totals"]["messages"] == 1
    assert "Traceback" not in daemon.log_text()


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
API_FIELDS = ["from", "channel", "content", "instanceId", "fromInstanceId", "recipient", "recipientInstanceId",
              "since", "limit", "wait", "all", "receiptIds", "orchestratorId", "name", "static", "dynamic"]


@st.composite
def api_bodies(draw: st.DrawFn) -> bytes:
    """A JSON object of the API's own field names with odd values, or odd JSON, or not JSON at all."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=100))
    if choice == 1:
        return json.dumps(draw(JSON_VALUES)).encode()
    fields = draw(st.dictionaries(st.sampled_from(API_FIELDS), JSON_VALUES, max_size=6))
    if "wait" in fields:
        fields["wait"] = draw(st.sampled_from([0, 0.01, -1, "x", None]))
    text = json.dumps(fields)
    if choice == 3:  # a lone surrogate escape, or a huge number, in place of one value
        text = text.replace("null", draw(st.sampled_from(['"\\ud800"', "1e400", "18446744073709551616", "NaN"])), 1)
    return text.encode()


QUERY_VALUES = st.one_of(TEXT, INTS.map(str), st.sampled_from(["%00", "%ED%A0%80", "1e9", "-0", "99999999999999999999"]))


@FUZZ
@given(path=st.sampled_from(["/api/send", "/api/check", "/api/read", "/api/profiles"]), body=api_bodies())
def test_the_local_api_answers_any_body_without_a_500(daemon: Daemon, path: str, body: bytes) -> None:
    """Any POST body to the JSON API: 200, 400 or 404 (with a JSON error), never a 500."""
    status, _ = daemon.transport("POST", f"{daemon.info['local_url']}{path}", body, 30, daemon.token)
    assert status in (200, 400, 404)


@FUZZ
@given(path=st.sampled_from(["/api/messages", "/api/search", "/api/messages/{v}/status", "/api/profiles/{v}"]),
       params=st.dictionaries(st.sampled_from(["after", "limit", "since", "q", "from", "channel", "wait", "receipts"]),
                              QUERY_VALUES, max_size=4), value=QUERY_VALUES)
def test_the_local_api_answers_any_query_without_a_500(daemon: Daemon, path: str, params: dict[str, str],
                                                       value: str) -> None:
    """Any query string or path value: 200, 400 or 404, never a 500."""
    query = "&".join(f"{k}={quote(v, safe='%', errors='surrogatepass')}" for k, v in params.items())
    if "wait" in params:
        query = query.replace(f"wait={quote(params['wait'], safe='%', errors='surrogatepass')}", "wait=0")
    url = daemon.info["local_url"] + path.format(v=quote(value, safe="%", errors="surrogatepass")) + "?" + query
    status, _ = daemon.transport("GET", url, None, 30, daemon.token)
    assert status in (200, 400, 404)


# -- ops and sync messages, pure -------------------------------------------------------------------


@FUZZ
@given(version=st.one_of(st.just(1), INTS), seq=INTS, stamp=INTS, kind=st.one_of(st.sampled_from(["msg", "set"]), TEXT),
       body=st.one_of(VALUES, st.fixed_dictionaries({"w": st.lists(st.lists(VALUES, max_size=4), max_size=3)})))
def test_a_signed_op_of_any_shape_is_an_op_or_invalid_op(version: int, seq: int, stamp: int, kind: str,
                                                          body: Any) -> None:
    """Signed correctly whatever it holds: apply stores it only if every field is in bounds, else InvalidOp."""
    ident = identity.generate()
    unsigned = packed([version, ident.public_key, seq, stamp, kind, body])
    raw = packed([unsigned, ident.sign(unsigned)])
    rep = Replica.open()
    try:
        rep.apply([raw])
    except InvalidOp:
        assert rep.stats()["ops"] == 0
    else:
        assert 1 <= seq < 2**63 and 0 <= stamp < 2**63
    finally:
        rep.close()


@FUZZ
@given(msg=peer_messages())
def test_any_request_is_answered_or_refused_as_a_remote_error(msg: dict[str, Any]) -> None:
    """decode_request and dispatch on any message: an Outcome, or a RemoteError (a 400); nothing else."""
    rep = Replica.open()
    rep.send_message("alice", "bob", "held")
    before = rep.state_digest()
    try:
        req = protocol.decode_request(wire(msg))
        protocol.dispatch(rep, req, protocol.Here(b"me------", "me", 4096, 0))
    except RemoteError:
        pass
    assert rep.state_digest() == before, "only valid, correctly signed ops change state"
    rep.close()


# -- MCP arguments, in process ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    rep = open_home(tmp_path_factory.mktemp("mcp") / "home")
    yield rep
    rep.close()


TOOL_ARGS = {spec.name: [f.alias or n for n, f in spec.args.model_fields.items()] for spec in TOOLS}


@st.composite
def tool_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(TOOL_ARGS)))
    keys = st.one_of(st.sampled_from(TOOL_ARGS[name] or ["x"]), TEXT)
    odd = st.one_of(JSON_VALUES, st.sampled_from(["\ud800", "a\x00b", 2**63, 2**64, float("inf"), float("nan"), -1]))
    return name, draw(st.dictionaries(keys, odd, max_size=5))


@FUZZ
@given(call=tool_calls())
async def test_any_tool_call_is_a_result_or_a_clear_error(mcp_home: Replica, call: tuple[str, dict[str, Any]]) -> None:
    """Over the SDK's in-process client, any arguments to any tool: a result, or invalid_argument / not_found."""
    from mcp import Client  # noqa: PLC0415

    name, args = call
    if "wait" in args:
        args["wait"] = 0
    wiring = Wiring.over(mcp_home)
    try:
        async with Client(build_server(mcp_home, waiter=wiring.waiter)) as client:
            result = await client.call_tool(name, args)
    finally:
        wiring.close()
    if result.is_error:
        text = result.content[0].text  # type: ignore[union-attr]
        assert text.split(":", 1)[0] in ("invalid_argument", "not_found"), text


# -- stdio lines, over a real subprocess ---------------------------------------------------------------


class StdioServer:
    """``python -m mcp_server`` on a home of its own, spoken to line by line."""

    def __init__(self, home: Path) -> None:
        open_home(home).close()  # the server serves an existing node's home only
        self.proc = subprocess.Popen([sys.executable, "-m", "mcp_server", "--home", str(home), "--role", "fuzz"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.pings = 0
        self.send(json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}}).encode())
        assert json.loads(self.readline())["id"] == "init"
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def readline(self) -> bytes:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the server closed its output; stderr:\n{self.stderr()}"
        return line

    def stderr(self) -> str:
        self.proc.kill()
        assert self.proc.stderr is not None
        with self.proc.stderr:
            return self.proc.stderr.read().decode(errors="replace")

    def answers_until_ping(self) -> list[dict[str, Any]]:
        """Send a ping; every line the server writes up to the ping's answer, decoded."""
        self.pings += 1
        pid = f"ping-{self.pings}"
        self.send(json.dumps({"jsonrpc": "2.0", "id": pid, "method": "ping"}).encode())
        out: list[dict[str, Any]] = []
        while True:
            msg = json.loads(self.readline())
            if msg.get("id") == pid:
                return out
            out.append(msg)

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture(scope="module")
def stdio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    server = StdioServer(tmp_path_factory.mktemp("stdio") / "home")
    yield server
    server.close()
    assert server.proc.returncode == 0


LINES = st.one_of(
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" ")),
    st.text(max_size=60).map(lambda t: t.replace("\n", " ").replace("\r", " ").encode("utf-8", "surrogatepass")),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":"\\ud800"}}',
                     b'{"jsonrpc":"2.0","id":8,"method":5}', b'{"jsonrpc":"2.0","id":9', b"[]", b"null",
                     b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"search_messages",'
                     b'"arguments":{"query":"\\u0000"}}}']),
)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(line=LINES)
def test_any_stdio_line_gets_an_answer_and_the_server_goes_on(stdio: StdioServer, line: bytes) -> None:
    """A line that is not JSON-RPC gets a JSON-RPC error (-32700 or -32600); the next ping is answered."""
    stdio.send(line)
    for msg in stdio.answers_until_ping():
        assert msg.get("jsonrpc") == "2.0"
        if "error" in msg:
            assert msg["error"]["code"] in (-32700, -32600, -32601, -32602, -32603), msg
        else:
            assert "result" in msg or "method" in msg, msg


@pytest.mark.parametrize(("line", "code", "rid"), [
    (b"this is not json", -32700, None),
    (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\\ud800"}}', -32700, None),  # a lone surrogate
    (b'{"jsonrpc":"2.0","id":2,"method":5}', -32600, 2),
    (b'{"jsonrpc":"2.0","id":3,"method":"tools/list"', -32700, None),
    (b"\xed\xa0\x80", -32700, None),
])
def test_the_issue_lines_get_exactly_one_json_rpc_error(stdio: StdioServer, line: bytes, code: int,
                                                         rid: int | None) -> None:
    """The lines the SDK dropped silently: one error each (with the request's id when it can be read)."""
    stdio.send(line)
    assert [(m.get("id"), m["error"]["code"]) for m in stdio.answers_until_ping()] == [(rid, code)]


# -- the command line -------------------------------------------------------------------------------------

CLI_TEXT = st.one_of(TEXT.filter(lambda t: "\x00" not in t), st.sampled_from(["\udcff", "-1", "99999999999999999999",
                                                                              "--json", "-"]))


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(["send", "inbox", "read", "log", "search", "threads", "profile", "status", "peers"]))
    flags = {"send": ["--from", "--to", "--instance", "--from-instance"], "inbox": ["--instance", "--since", "--limit",
             "--all"], "log": ["--after", "--limit"], "search": ["--from", "--channel", "--since", "--limit"],
             "profile": ["--name", "--static", "--dynamic"]}.get(command, [])
    argv = [command]
    for _ in range(draw(st.integers(0, 4))):
        argv += draw(st.one_of(st.tuples(st.sampled_from(flags or ["--json"]), CLI_TEXT).map(list),
                               CLI_TEXT.map(lambda t: [t])))
    return argv


@FUZZ
@given(argv=command_lines())
def test_any_command_line_ends_with_a_documented_exit_code(tmp_path_factory: pytest.TempPathFactory,
                                                           argv: list[str]) -> None:
    """Offline (no daemon), any arguments: exit 0, 1, 2, 3 or 4 and a one-line message; never a traceback."""
    home = tmp_path_factory.getbasetemp() / "cli-home"
    if not home.exists():
        open_home(home).close()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as ended:
        cli_main([argv[0], "--home", str(home), *argv[1:]])
    assert ended.value.code in (0, 1, 2, 3, 4), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue()

