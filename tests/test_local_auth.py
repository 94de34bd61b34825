"""Who the local port answers (issue 35, items 4 and 5): only a caller that proves it can read the
home, only the daemon's own origin, only JSON bodies; and homes that are owner-only.

The rules as pure functions with an injected clock; a ``LocalServer`` on port 0 whose clock the test
moves (login links and sessions expire without a sleep); real daemons (``tests.daemons``) reached
by peerd's own clients and, through ``setpriv``, by another Unix user. Dropping privileges needs
root (CI runs as root): without it these tests fail, never skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mcp_server.localauth import LOGIN_TTL, SESSION_TTL, LocalAuth, bearer, cookie, cookie_name
from mcp_server.localguard import gather, media_refusal
from peerd import doctor
from peerd import home as homes
from peerd.dashboard import browser_path, page_routes
from peerd.feedlink import DaemonLink
from peerd.local import LocalServer, build_app
from replica import open_home
from replica.feed import ChangeFeed
from tests.daemons import PEERD, Daemon, Fleet, message_ids, wait_until
from tests.localclient import mcp_client

pytest_plugins = ["tests.daemons"]

NOBODY = 65534
ENV = {k: v for k, v in os.environ.items() if k != "PEERD_HOME"}
TOKEN = "k" * 43
MCP_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the rules ------------------------------------------------------------------------------------


def test_bearer_takes_exactly_one_bearer_header() -> None:
    """``Authorization: Bearer T`` (any case of the scheme) gives T; none, two, or another scheme give nothing."""
    assert bearer(["Bearer abc"]) == "abc" and bearer(["bearer  abc "]) == "abc"
    assert bearer([]) is None and bearer(["Bearer a", "Bearer a"]) is None
    assert bearer(["Basic abc"]) is None and bearer(["Bearer "]) is None and bearer(["abc"]) is None


def test_cookie_finds_this_ports_session_among_others() -> None:
    """The session cookie is read by its port's name from any Cookie header; other ports' are not it."""
    headers = ["a=1; peerd-session-7734=s1", "peerd-session-80=s2"]
    assert cookie(headers, cookie_name(7734)) == "s1" and cookie(headers, cookie_name(80)) == "s2"
    assert cookie(headers, cookie_name(9)) is None and cookie([], cookie_name(7734)) is None


def test_the_token_admits_and_nothing_close_to_it_does() -> None:
    """The token itself admits; none, a prefix, a longer one, another case or a lone surrogate do not,
    and the auth's repr never shows it."""
    auth = LocalAuth(TOKEN)
    assert auth.token_ok(TOKEN)
    assert not any(auth.token_ok(t) for t in (None, "", TOKEN[:-1], TOKEN + "k", TOKEN.upper(), "\ud800"))
    assert TOKEN not in repr(auth)


def test_a_login_code_opens_one_session_and_only_before_it_expires() -> None:
    """A code is good once; a second redemption, a made-up code, or one past its lifetime open nothing."""
    clock = Clock()
    auth = LocalAuth(TOKEN, clock=clock)
    code = auth.new_login()
    session = auth.redeem(code)
    assert session is not None and auth.session_ok(session.value) and session.max_age == SESSION_TTL
    assert auth.redeem(code) is None and auth.redeem("made-up") is None and auth.redeem(None) is None
    late = auth.new_login()
    clock.now += LOGIN_TTL
    assert auth.redeem(late) is None


def test_a_session_ends_after_its_lifetime() -> None:
    """A session is good until SESSION_TTL seconds after the login, not a moment later."""
    clock = Clock()
    auth = LocalAuth(TOKEN, clock=clock)
    session = auth.redeem(auth.new_login())
    assert session is not None
    clock.now += SESSION_TTL - 1
    assert auth.session_ok(session.value)
    clock.now += 1
    assert not auth.session_ok(session.value) and not auth.session_ok("made-up")


def test_a_session_may_only_read_the_dashboards_paths_from_its_own_site() -> None:
    """GET/HEAD of the page and its data, from this origin or typed in; never a write, another route,
    or a request another site started."""
    auth = LocalAuth(TOKEN, browser=browser_path)
    for path in ("/", "/dashboard", "/dashboard/app.js", "/api/status", "/api/messages", "/api/search",
                 "/api/events"):
        assert auth.browser_ok("GET", path, None) and auth.browser_ok("GET", path, "same-origin")
    assert auth.browser_ok("GET", "/dashboard", "none") and auth.browser_ok("HEAD", "/api/status", None)
    for path in ("/api/send", "/api/peers", "/api/fleet", "/api/pair/code", "/api/feed", "/mcp", "/api/login"):
        assert not auth.browser_ok("GET", path, None), path
    assert not auth.browser_ok("POST", "/api/messages", None)
    assert not auth.browser_ok("GET", "/api/status", "same-site") and not auth.browser_ok("GET", "/", "cross-site")


MEDIA = [
    ("POST", {"content-type": "application/json"}, True, None),
    ("POST", {"content-type": "Application/JSON; charset=utf-8"}, True, None),
    ("POST", {"content-type": "text/plain"}, True, "not 'text/plain'"),
    ("POST", {"content-type": "text/plain;charset=UTF-8"}, True, "not"),
    ("POST", {"content-type": "application/x-www-form-urlencoded"}, True, "not"),
    ("POST", {"content-type": "multipart/form-data; boundary=x"}, True, "not"),
    ("POST", {"content-type": "application/json-seq"}, True, "not"),
    ("PUT", {}, True, "needs Content-Type: application/json"),
    ("POST", {}, False, None),
    ("DELETE", {}, False, None),
    ("GET", {"content-type": "text/plain"}, True, None),
]


@pytest.mark.parametrize(("method", "headers", "body", "refused"), MEDIA)
def test_only_json_bodies_pass(method: str, headers: dict[str, str], body: bool, refused: str | None) -> None:
    """What a web form can send (urlencoded, multipart, text/plain, or a body with no type) is refused."""
    raw = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"content-length", b"5" if body else b"0")]
    reason = media_refusal(method, gather(raw))
    assert (reason is None) == (refused is None) and (refused is None or refused in (reason or "")), reason


# -- a local server whose clock the test moves -------------------------------------------------------


async def status(_r: Request) -> Response:
    return JSONResponse({"ok": True})


async def write(r: Request) -> Response:
    return JSONResponse({"read": len(await r.body())})


ROUTES = [Route("/api/status", status), Route("/api/send", write, methods=["POST"]),
          Route("/api/peers", status), *page_routes()]


@asynccontextmanager
async def server(clock: Clock) -> AsyncIterator[tuple[LocalServer, LocalAuth, httpx2.AsyncClient]]:
    auth = LocalAuth(TOKEN, how="the token is in T", relogin="run peerd dashboard", browser=browser_path,
                     clock=clock)
    async with LocalServer(build_app(ROUTES, auth=auth)) as srv, httpx2.AsyncClient(base_url=srv.url,
                                                                                    timeout=30) as client:
        yield srv, auth, client


async def test_login_link_sets_a_strict_session_cookie_and_leads_to_the_dashboard() -> None:
    """A live code: 303 to /dashboard with an HttpOnly, SameSite=Strict, Path=/ cookie for this port;
    the cookie then opens the page and its data."""
    async with server(Clock()) as (srv, auth, client):
        answer = await client.get(f"/login?code={auth.new_login()}")
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard"
        name, _, attributes = answer.headers["set-cookie"].partition(";")
        assert name.startswith(f"peerd-session-{srv.port}=")
        assert {a.strip() for a in attributes.split(";")} >= {"Path=/", "HttpOnly", "SameSite=Strict"}
        for path in ("/dashboard", "/api/status"):
            assert (await client.get(path)).status_code == 200


async def test_a_login_link_works_once_and_not_after_it_expires() -> None:
    """Over HTTP: a second use, a code past LOGIN_TTL, no code at all get 401; a POST gets 405."""
    clock = Clock()
    async with server(clock) as (_srv, auth, client):
        code = auth.new_login()
        assert (await client.get(f"/login?code={code}")).status_code == 303
        again = await client.get(f"/login?code={code}")
        assert again.status_code == 401 and "run peerd dashboard" in again.json()["error"]
        late = auth.new_login()
        clock.now += LOGIN_TTL
        assert (await client.get(f"/login?code={late}")).status_code == 401
        assert (await client.get("/login")).status_code == 401
        assert (await client.post("/login", params={"code": auth.new_login()})).status_code == 405


async def test_a_session_reads_the_page_but_writes_nothing_and_ends() -> None:
    """The cookie admits the dashboard's reads; a POST, another route or a cross-site request gets 401;
    once the session is over the page says how to sign in again."""
    clock = Clock()
    async with server(clock) as (_srv, auth, client):
        await client.get(f"/login?code={auth.new_login()}")
        assert (await client.get("/api/status", headers={"Sec-Fetch-Site": "same-origin"})).status_code == 200
        json_body = {"Content-Type": "application/json"}
        assert (await client.post("/api/send", content=b"{}", headers=json_body)).status_code == 401
        assert (await client.get("/api/peers")).status_code == 401
        assert (await client.get("/api/status", headers={"Sec-Fetch-Site": "same-site"})).status_code == 401
        clock.now += SESSION_TTL
        ended = await client.get("/dashboard")
        assert ended.status_code == 401 and "session has ended" in ended.json()["error"]


async def test_a_refused_caller_learns_where_the_token_is_before_its_body_is_read() -> None:
    """401 with WWW-Authenticate: Bearer and the way to authenticate, though the body never comes."""
    async with server(Clock()) as (srv, _auth, _client):
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"POST /api/send HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 ") and b"www-authenticate: bearer" in head.lower()
    assert json.loads(body)["error"] == "unauthorized: the token is in T"


# -- a real daemon, its owner and another user --------------------------------------------------------


def as_other_user(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """``argv`` run as uid/gid 65534 with no supplementary groups (``setpriv``, as root)."""
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
                          capture_output=True, text=True, timeout=120, check=False, **kw)


@pytest.fixture(scope="module")
def other_user() -> None:
    """Fails (never skips) when this test run cannot act as another Unix user."""
    try:
        probe = as_other_user([sys.executable, "-c", "import os; print(os.geteuid(), os.getegid(), os.getgroups())"])
    except FileNotFoundError:
        pytest.fail("setpriv is missing: these tests must run as another Unix user (apt-get install util-linux)")
    if probe.returncode != 0 or probe.stdout.split() != [str(NOBODY), str(NOBODY), "[]"]:
        pytest.fail(f"cannot run a process as uid {NOBODY} (run the tests as root, as CI does): "
                    f"{probe.stdout}{probe.stderr}")


@pytest.fixture(scope="module")
def open_root() -> Iterator[Path]:
    """A folder every user may enter (pytest's own tmp folders are closed to others): the homes
    below it are then kept private by peerd alone."""
    root = Path(tempfile.mkdtemp(prefix="peerd-auth-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def owner(open_root: Path) -> Iterator[Daemon]:
    """One daemon, started on a home an older peerd left open (0755, its files 0644)."""
    fleet = Fleet(open_root / "fleet")
    try:
        d = fleet.add("d")
        fleet.init([d])
        d.home.chmod(0o755)
        for f in d.home.iterdir():
            f.chmod(0o644)
        fleet.start(d)
        d.send("alice", "bob", "for bob only")
        yield d
    finally:
        fleet.close()


PROBE = textwrap.dedent('''
    import json, sys, urllib.error, urllib.request
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    out = []
    for method, url, body, headers in json.loads(sys.argv[1]):
        req = urllib.request.Request(url, data=None if body is None else body.encode(), method=method, headers=headers)
        try:
            with opener.open(req, timeout=30) as resp:
                out.append(resp.status)
        except urllib.error.HTTPError as exc:
            out.append(exc.code)
            exc.close()
    print(json.dumps(out))
''')


def other_user_routes(d: Daemon) -> list[tuple[str, str, str | None, dict[str, str]]]:
    """A sample of every kind of local route, as another user would try them (with a guessed token too)."""
    base = d.info["local_url"]
    js = {"Content-Type": "application/json"}
    mcp = {**js, "Accept": "application/json, text/event-stream"}
    return [
        ("GET", f"{base}/api/messages", None, {}),
        ("GET", f"{base}/api/status", None, {}),
        ("POST", f"{base}/api/send", json.dumps({"from": "eve", "channel": "bob", "content": "hi"}), js),
        ("POST", f"{base}/api/check", json.dumps({"recipient": "bob"}), js),
        ("POST", f"{base}/api/pair/code", "{}", js),
        ("POST", f"{base}/api/fleet/remove", json.dumps({"node": d.short_id}), js),
        ("POST", f"{base}/api/login", "{}", js),
        ("POST", f"{base}/mcp", json.dumps(MCP_INIT), mcp),
        ("GET", f"{base}/dashboard", None, {}),
        ("GET", f"{base}/", None, {}),
        ("GET", f"{base}/api/events", None, {}),
        ("GET", f"{base}/api/feed", None, {}),
        ("GET", f"{base}/login?code=guessed", None, {}),
        ("GET", f"{base}/api/messages", None, {"Authorization": "Bearer " + "A" * 43}),
        ("GET", f"{base}/api/messages", None, {"Cookie": f"peerd-session-{d.info['local_port']}=guessed"}),
    ]


def test_another_user_gets_401_or_403_everywhere_and_can_read_no_file(other_user: None, owner: Daemon) -> None:
    """Uid 65534 on the same machine: every kind of route refuses it, nothing is written, and no file of
    the home opens for it, even with the home folder opened up for it to enter."""
    before = message_ids(owner.db)
    probe = as_other_user([sys.executable, "-c", PROBE, json.dumps(other_user_routes(owner))])
    assert probe.returncode == 0, probe.stderr
    statuses = json.loads(probe.stdout)
    assert set(statuses) <= {401, 403} and statuses, statuses
    assert message_ids(owner.db) == before
    assert owner.api("GET", "/api/fleet")["nodes"][0]["removed"] is False
    cli = as_other_user([str(PEERD), "--home", str(owner.home), "inbox", "bob"], env=ENV)
    assert cli.returncode != 0 and "for bob only" not in cli.stdout

    files = [p for p in owner.home.iterdir() if p.is_file()]
    assert {"replica.db", "replica.db-wal", "replica.db-shm", "local.token", "daemon.json", "config.toml",
            "node.key"} <= {p.name for p in files}
    assert stat.S_IMODE(owner.home.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in files), {p.name: oct(p.stat().st_mode)
                                                                            for p in files}
    owner.home.chmod(0o711)  # as if its owner let others through the folder: the files still hold
    try:
        reads = as_other_user([sys.executable, "-c", "import sys\nfor p in sys.argv[1:]:\n"
                               "    try: open(p, 'rb').read(1); print('READ', p)\n    except OSError: pass",
                               *map(str, files)])
    finally:
        owner.home.chmod(0o700)
    assert reads.returncode == 0 and reads.stdout == "", reads.stdout + reads.stderr


def cli(d: Daemon, *argv: str, stdin: str | None = None) -> str:
    """``peerd --home HOME ARGV`` as the home's owner; its stdout (it must succeed)."""
    done = subprocess.run([str(PEERD), "--home", str(d.home), *argv], capture_output=True, text=True, input=stdin,
                          timeout=120, env=ENV, check=False)
    assert done.returncode == 0, f"peerd {' '.join(argv)}: {done.stderr}"
    return done.stdout


async def stdio_whoami(home: Path, role: str) -> dict[str, Any]:
    """``whoami`` through ``peerd mcp --home HOME --role ROLE`` over stdio, as an MCP client starts it."""
    params = StdioServerParameters(command=str(PEERD), args=["mcp", "--home", str(home), "--role", role], env=ENV)
    async with Client(params) as c:
        result = await c.call_tool("whoami", {})
        assert isinstance(result.structured_content, dict)
        return result.structured_content


def test_the_owners_clients_find_the_token_themselves(owner: Daemon) -> None:
    """The owner's CLI, ``peerd hook``, ``peerd mcp`` over stdio and an MCP SDK client with the documented
    header all work against the guarded daemon."""
    sent = json.loads(cli(owner, "send", "--from", "carol", "--to", "dave", "deploy at noon", "--json"))
    assert "deploy at noon" in cli(owner, "inbox", "dave")
    assert sent["messageId"] in cli(owner, "status", sent["messageId"])
    assert owner.name in cli(owner, "status")
    hook = cli(owner, "hook", "--role", "erin", stdin=json.dumps({"hook_event_name": "UserPromptSubmit"}))
    assert hook == ""  # nothing for erin yet
    owner.send("carol", "erin", "a hook's mail")
    hook = cli(owner, "hook", "--role", "erin", stdin=json.dumps({"hook_event_name": "UserPromptSubmit"}))
    assert "a hook's mail" in json.loads(hook)["hookSpecificOutput"]["additionalContext"]
    assert asyncio.run(stdio_whoami(owner.home, "frank"))["role"] == "frank"

    async def over_http() -> Any:
        token = (owner.home / "local.token").read_text().strip()
        async with mcp_client(owner.info["mcp_url"], token, headers={"X-Peerd-Role": "grace"}) as c:
            return (await c.call_tool("whoami", {})).structured_content

    assert asyncio.run(over_http())["role"] == "grace"


def test_peerd_mcp_follows_the_daemons_change_stream_with_the_token(owner: Daemon) -> None:
    """``peerd mcp`` beside a daemon hears of changes from the daemon's /api/feed (it sends the home's
    token; without it the daemon would refuse the stream and it would fall back on a file watch)."""
    with open_home(owner.home) as rep:
        link = DaemonLink(owner.home)
        feed = ChangeFeed(rep, link)
        try:
            wait_until(lambda: link.following, 30, "the daemon's change stream followed")
            mark = feed.mark
            owner.send("heidi", "ivan", "through the feed")
            wait_until(lambda: feed.mark > mark, 30, "the feed to move")
            assert link.following
        finally:
            feed.close()


def raw(d: Daemon, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, Any]:
    """One request with exactly these headers (plus Host and the length), on its own connection."""
    port = d.info["local_port"]
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items()),
             f"Content-Length: {len(body)}", "Connection: close"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload) if payload.startswith(b"{") else payload


def test_only_the_daemons_own_origin_is_served(owner: Daemon) -> None:
    """Origin http://127.0.0.1|localhost|[::1]:PORT passes; the same names on another port, https, or
    no port get 403 (a page of a dev server on this machine is another origin)."""
    port = owner.info["local_port"]
    other = port + 1 if port < 65535 else port - 1
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"):
        assert raw(owner, "GET", "/api/digest", {**owner.auth, "Origin": origin})[0] == 200, origin
    for origin in (f"http://localhost:{other}", f"http://127.0.0.1:{other}", f"https://localhost:{port}",
                   "http://localhost", "http://127.0.0.1:3000"):
        status, body = raw(owner, "GET", "/api/digest", {**owner.auth, "Origin": origin})
        assert status == 403 and "this server's own" in body["error"], origin


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=b",
                                          None])
def test_a_post_a_web_form_could_send_gets_415_and_changes_nothing(owner: Daemon, content_type: str | None) -> None:
    """Even with the token, the API takes only application/json bodies: a form's types get 415."""
    before = message_ids(owner.db)
    body = json.dumps({"from": "mallory", "channel": "bob", "content": "posted by a web page"}).encode()
    headers = owner.auth | ({} if content_type is None else {"Content-Type": content_type})
    status, answer = raw(owner, "POST", "/api/send", headers, body)
    assert status == 415 and "application/json" in answer["error"]
    assert message_ids(owner.db) == before


def test_a_login_link_from_peerd_dashboard_works_once(owner: Daemon) -> None:
    """``peerd dashboard`` prints a fresh link; it opens a session once and is refused the second time."""
    url = json.loads(cli(owner, "dashboard", "--json"))["url"]
    assert url.startswith(owner.info["local_url"] + "/login?code=")
    path = url.removeprefix(owner.info["local_url"])
    status, _ = raw(owner, "GET", path, {})
    assert status == 303
    status, body = raw(owner, "GET", path, {})
    assert status == 401 and "peerd dashboard" in body["error"]


# -- homes that are owner-only ------------------------------------------------------------------------


def modes(home: Path) -> dict[str, int]:
    """The permission bits of the home and of everything in it, by name."""
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [home, *home.iterdir()]}


def test_a_fresh_home_is_owner_only_from_the_start(fleet: Fleet) -> None:
    """``peerd init`` then a running daemon: the home 0700, every file in it 0600, the replica's -wal and
    -shm and local.token included."""
    d = fleet.add("fresh")
    fleet.start(d)
    d.send("a", "b", "written")
    found = modes(d.home)
    assert found.pop(d.home.name) == 0o700
    assert {"replica.db-wal", "replica.db-shm", "local.token", "daemon.json", "daemon.lock"} <= set(found)
    assert all(m == 0o600 for m in found.values()), found


def loosen(home: Path) -> None:
    """What an older peerd left: a 0755 home, 0644 files."""
    home.chmod(0o755)
    for f in home.iterdir():
        f.chmod(0o644)


@pytest.mark.parametrize("opener", ["daemon", "cli", "mcp"])
def test_a_loose_home_is_made_owner_only_when_peerd_opens_it(fleet: Fleet, opener: str) -> None:
    """A 0755 home with 0644 files, opened by the daemon, a CLI command or ``peerd mcp``, ends owner-only."""
    d = fleet.add("old")
    fleet.init([d])
    with open_home(d.home) as rep:
        rep.send_message("a", "b", "before")  # a -wal beside the replica
    loosen(d.home)
    assert modes(d.home)["replica.db"] == 0o644
    if opener == "daemon":
        fleet.start(d)
    elif opener == "cli":
        subprocess.run([str(PEERD), "--home", str(d.home), "inbox", "b"], env=ENV, check=True, capture_output=True)
    else:
        assert asyncio.run(stdio_whoami(d.home, "r"))["role"] == "r"
    assert all(m & 0o077 == 0 for m in modes(d.home).values()), modes(d.home)


def test_doctor_reports_a_home_it_cannot_make_private(tmp_path: Path) -> None:
    """Files another user owns and left open (peerd leaves them as they are) are a failure with a chown
    fix; a loose file of our own is a warning that says peerd fixes it; doctor itself changes nothing."""
    home = tmp_path / "home"
    subprocess.run([str(PEERD), "--home", str(home), "init"], env=ENV, check=True, capture_output=True)
    theirs = home / "replica.db"
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o644)
    homes.local_token_path(home).chmod(0o640)
    assert homes.tighten(home) == [homes.Loose(theirs, 0o644, NOBODY, ours=False)]
    homes.local_token_path(home).chmod(0o640)
    report = doctor.run_checks(home, timeout=1)
    (files,) = [f for f in report.findings if f.check == "files"]
    assert files.status == "fail" and "replica.db" in files.detail and "not by this user" in files.detail
    assert "local.token" in files.detail and (files.fix or "").startswith("as root: chown")
    assert stat.S_IMODE(homes.local_token_path(home).stat().st_mode) == 0o640  # doctor changed nothing
    os.chown(home, NOBODY, NOBODY)
    home.chmod(0o755)
    (folder,) = [f for f in doctor.run_checks(home, timeout=1).findings if f.check == "home"]
    assert folder.status == "fail" and "chown" in (folder.fix or "")
