"""The dashboard in a real headless Chromium against two real daemons: the page opens through a
one-time login link, shows the fleet, streams a message sent on the other node without a reload,
shows receipts change, and searches; plus the local routes behind it (loopback checks, security
headers, the event stream)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright

from peerd import home as homes
from peerd import protocol
from peerd.config import load_config, save_config
from peerd.dashboard import ASSETS, asset
from peerd.pairing import codes
from peerd.protocol import join
from replica import open_home
from tests.daemons import Daemon, Fleet, patience, post_raw, wait_until

pytest_plugins = ["tests.daemons"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
SPREAD = 15.0
BACKLOG = 20_000  # messages a new node must pull: a catch-up of a few seconds
UI_TIMEOUT_MS = 15_000
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon, Daemon]]:
    """Three daemons seeded with each other; the page is opened on ``b``."""
    fleet = Fleet(tmp_path_factory.mktemp("dash"))
    try:
        a, b, c = fleet.add("a"), fleet.add("b"), fleet.add("c")
        fleet.mesh()
        fleet.start()
        wait_until(lambda: all((b.peer(x) or {}).get("reachable") for x in (a, c)), SPREAD, "a and c live at b")
        yield a, b, c
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium driven by Playwright; missing Chromium is a failure, never a skip."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: install it (apt-get install -y chromium); scripts/test does"
    with sync_playwright() as pw:
        b = _launch(pw)
        yield b
        b.close()


def _launch(pw: Playwright) -> Browser:
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def open_dashboard(page: Page, d: Daemon) -> None:
    """Sign the page's browser in to ``d`` with a fresh login link (as ``peerd dashboard`` prints),
    which lands on the dashboard."""
    page.goto(d.api("POST", "/api/login", {})["url"])
    assert page.url == d.info["local_url"] + "/dashboard"


def get(d: Daemon, path: str) -> urllib.request.Request:
    """A GET of ``d``'s local port with its home's token."""
    return urllib.request.Request(d.info["local_url"] + path, headers=d.auth)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    p = context.new_page()
    p.set_default_timeout(UI_TIMEOUT_MS)
    yield p
    context.close()


def test_dashboard_shows_fleet_streams_receipts_and_searches(trio: tuple[Daemon, Daemon, Daemon],
                                                             page: Page) -> None:
    """Open b's page: the other nodes are live; a message sent on a appears without reload, naming the
    node that sent it; its receipt goes pending, delivered, read; search finds it; nothing outside this daemon is requested."""
    a, b, c = trio
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    open_dashboard(page, b)
    page.goto(b.info["local_url"] + "/")  # the root leads to the page, on the session's cookie
    assert page.url == b.info["local_url"] + "/dashboard"
    for other in (a, c):
        row = page.locator(f'#peers tr[data-node="{other.short_id}"]')
        row.wait_for()
        assert other.addr in row.inner_text() and "yes" in row.inner_text() and "seed" in row.inner_text()
    assert page.locator("#map .node.live").count() == 2
    assert page.locator("#node-name").inner_text() == "b"
    page.locator("#conn.on").wait_for()
    page.evaluate("window.__samePage = true")

    sent = a.send("planner", "coder", "ship the flamingo release tonight")
    item = page.locator(f'#stream li[data-id="{sent["messageId"]}"]')
    item.wait_for()
    assert "ship the flamingo release tonight" in item.inner_text() and "planner" in item.inner_text()
    assert item.locator(".node").get_attribute("data-node") == a.node_id  # the machine that sent it
    page.locator(f'#stream li[data-id="{sent["messageId"]}"] .node', has_text="from a").wait_for()
    assert item.locator('.chip[data-role="coder"]').get_attribute("data-state") == "pending"
    receipt = wait_until(lambda: b.check("coder")["messages"], SPREAD, "the message in coder's inbox on b")
    page.locator(f'#stream li[data-id="{sent["messageId"]}"] .chip[data-role="coder"][data-state="delivered"]').wait_for()
    b.mark_read([receipt[0]["receiptId"]])
    page.locator(f'#stream li[data-id="{sent["messageId"]}"] .chip[data-role="coder"][data-state="read"]').wait_for()

    page.fill("#q", "flamingo")
    page.click("#search button[type=submit]")
    hit = page.locator(f'#hits li[data-id="{sent["messageId"]}"]')
    hit.wait_for()
    assert hit.locator("mark").first.inner_text().lower() == "flamingo"
    assert "(1 for" in page.locator("#results-count").inner_text()
    page.fill("#q", "nonexistentword")
    page.click("#search button[type=submit]")
    page.locator("#results-count", has_text="(0 for").wait_for()

    _traffic(a, b, c)
    page.fill("#q", "release")
    page.click("#search button[type=submit]")
    page.locator("#results-count", has_text="(3 for").wait_for()
    page.locator("#totals", has_text="messages").wait_for()
    wait_until(lambda: page.locator("#stream li").count() == 5, SPREAD, "every message in the stream")
    wait_until(lambda: page.evaluate("document.getAnimations().length") == 0, 10, "the highlight to fade")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000

    assert page.evaluate("window.__samePage") is True, "the page reloaded"
    assert all(u.startswith(b.info["local_url"]) or u.startswith("data:") for u in requests), requests
    assert errors == []


def _traffic(a: Daemon, b: Daemon, c: Daemon) -> None:
    """A little realistic traffic for the screenshot: several senders, roles and receipt states."""
    a.update_profile("tester", name="Tester", static="runs the suites")
    msgs = [
        c.send("reviewer", "coder,tester", "release branch looks good; two nits in the changelog"),
        a.send("coder", "reviewer", "nits fixed, thanks"),
        c.send("ops", "broadcast", "deploy window opens at 18:00 UTC"),
        b.send("tester", "planner", "all 412 tests green on the release candidate", fromInstanceId="ci-2"),
    ]
    wait_until(lambda: all(b.has_message(m["messageId"]) for m in msgs), SPREAD, "the traffic on b")
    inbox = wait_until(lambda: b.check("tester")["messages"], SPREAD, "tester's inbox")
    b.mark_read([m["receiptId"] for m in inbox[:1]])
    b.check("reviewer")


def test_the_page_opens_only_through_a_login_link_that_works_once(trio: tuple[Daemon, Daemon, Daemon],
                                                                page: Page) -> None:
    """Without a login link the page is refused (401, saying how to get one); a link signs the browser
    in (an HttpOnly, SameSite=Strict cookie of this port) and works once; the session reads the page
    and its data, and nothing else: no other route, no write."""
    _a, b, _c = trio
    refused = page.goto(b.info["local_url"] + "/dashboard")
    assert refused is not None and refused.status == 401 and "peerd dashboard" in page.content()
    url = b.api("POST", "/api/login", {})["url"]
    page.goto(url)
    assert page.url == b.info["local_url"] + "/dashboard"
    (session,) = page.context.cookies()
    assert session["name"] == f"peerd-session-{b.info['local_port']}" and session["httpOnly"]
    assert session["sameSite"] == "Strict" and session["path"] == "/"
    again = page.goto(url)
    assert again is not None and again.status == 401 and "not valid" in page.content()
    reach = page.evaluate("""async () => {
        const get = async (p) => (await fetch(p)).status;
        const post = await fetch("/api/send", {method: "POST", headers: {"Content-Type": "application/json"},
                                               body: JSON.stringify({from: "x", channel: "y", content: "z"})});
        return [await get("/api/status"), await get("/api/messages?limit=1"), await get("/api/peers"),
                await get("/api/fleet"), post.status];
    }""")
    assert reach == [200, 200, 401, 401, 401]


def test_message_text_is_shown_as_text_never_html(trio: tuple[Daemon, Daemon, Daemon], page: Page) -> None:
    """Markup in a message from another node is displayed literally and never runs."""
    a, b, _c = trio
    open_dashboard(page, b)
    page.locator("#conn.on").wait_for()
    hostile = a.send("mallory", "coder", '<img src=x onerror="window.__pwned=1"><b>bold</b>')
    content = page.locator(f'#stream li[data-id="{hostile["messageId"]}"] .content')
    content.wait_for()
    assert content.inner_text() == '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    assert page.locator("#stream img, #stream b").count() == 0 and page.evaluate("window.__pwned") is None


def test_dashboard_shows_a_peer_going_down(trio: tuple[Daemon, Daemon, Daemon], page: Page) -> None:
    """A peer that stops answering turns from live to not live on the open page (this stops c)."""
    _a, b, c = trio
    open_dashboard(page, b)
    page.locator(f'#peers tr.live[data-node="{c.short_id}"]').wait_for()
    c.stop()
    dead = page.locator(f'#peers tr.dead[data-node="{c.short_id}"]')
    for i in range(60):  # each write is pushed to live peers; failed pushes mark c down
        b.send("pinger", "anyone", f"ping {i}")
        if dead.count():
            break
        page.wait_for_timeout(500)
    dead.wait_for()
    assert "no" in dead.inner_text()
    assert page.locator("#map .node.dead").count() == 1


def test_dashboard_shows_a_catch_up_in_progress(fleet: Fleet, page: Page) -> None:
    """While a new node pulls a large backlog, its page shows a progress bar that goes away when done."""
    a = fleet.add("a")
    b = fleet.add("b", seeds=[a])
    fleet.init([a, b])
    with open_home(a.home) as rep:
        for i in range(BACKLOG):
            rep.send_message("bulk", "archive", f"record {i} " + "x" * 60)
    path = homes.config_path(a.home)
    save_config(path, dataclasses.replace(load_config(path), max_content_bytes=1024, page_bytes=8192))
    fleet.start(a)
    b.spawn()
    b.wait_ready()
    open_dashboard(page, b)
    page.locator("#catchup:not([hidden])").wait_for()
    text = page.locator("#catchup-text").inner_text()
    assert text.startswith(f"Catching up from {a.addr}: ") and "ops/s" in text
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-catchup.png"))
    page.locator("#catchup").wait_for(state="hidden", timeout=patience(60) * 1000)
    assert b.status()["totals"]["messages"] == BACKLOG


def test_dashboard_shows_fleet_news(fleet: Fleet, page: Page) -> None:
    """A join request waiting on a member shows on its page; a removed node's page says it was removed."""
    a = fleet.add("a")
    x = fleet.add("x", seeds=[a])
    fleet.start(a, x)
    wait_until(lambda: (x.peer(a) or {}).get("reachable"), SPREAD, "a live at x")
    joiner, nonce = os.urandom(32), os.urandom(16)
    asked = protocol.decode_map(post_raw(f"http://{a.addr}/v1/join", join.request(
        join.ASK, k=joiner, nm="newcomer", c=codes.commit(joiner, nonce)))[1])
    post_raw(f"http://{a.addr}/v1/join", join.request(join.REVEAL, id=asked["id"], nb=nonce))
    open_dashboard(page, a)
    page.locator("#fleet-news:not([hidden])").wait_for()
    assert "1 join request(s) wait for approval" in page.locator("#fleet-news").inner_text()

    a.api("POST", "/api/fleet/remove", {"node": "x"})
    wait_until(lambda: x.status()["fleet"]["removed_here"], SPREAD, "x to learn it was removed")
    open_dashboard(page, x)
    page.locator("#fleet-news:not([hidden])").wait_for()
    assert "This node was removed from the fleet" in page.locator("#fleet-news").inner_text()


def test_dashboard_shows_who_relays_for_whom(fleet: Fleet, page: Page) -> None:
    """A member nobody can call says which member relays for it; that member's page says for whom it
    relays, and its peer row is marked."""
    s = fleet.add("s")
    lap = fleet.add("lap", seeds=[s], config={"reachable": False})
    fleet.start(s, lap)
    wait_until(lambda: lap.status()["relay"]["via"], SPREAD, "lap linked to s")
    open_dashboard(page, lap)
    page.locator("#fleet-news:not([hidden])").wait_for()
    assert f"relayed by s ({s.addr})" in page.locator("#fleet-news").inner_text()
    open_dashboard(page, s)
    page.locator("#fleet-news:not([hidden])").wait_for()
    assert "Relaying for lap" in page.locator("#fleet-news").inner_text()
    page.locator("#peers .relay").wait_for()
    assert page.locator("#peers .relay").inner_text() == "we relay for it"


# -- the routes behind the page ----------------------------------------------------------------------


def test_page_and_assets_are_served_with_security_headers(trio: tuple[Daemon, Daemon, Daemon]) -> None:
    """/dashboard and its files come with a CSP allowing only this origin, no framing, no sniffing."""
    _a, b, _c = trio
    for path, name in [("/dashboard", "index.html"), ("/dashboard/app.js", "app.js"),
                       ("/dashboard/style.css", "style.css")]:
        with _OPENER.open(get(b, path), timeout=10) as resp:
            body = resp.read()
            headers = resp.headers
        assert body == asset(name)
        assert headers["Content-Type"].startswith(ASSETS[name].split(";")[0])
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    assert b.call("GET", "/dashboard/../config.toml")[0] == 404
    assert b.call("GET", "/dashboard/nothing.js")[0] == 404
    for name in ASSETS:
        text = asset(name).decode()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text


def test_page_refuses_foreign_host_and_origin(trio: tuple[Daemon, Daemon, Daemon]) -> None:
    """A DNS-rebinding Host or a cross-site Origin gets 403 for the page and the event stream."""
    _a, b, _c = trio
    port = b.info["local_port"]
    for path in ("/dashboard", "/api/events", "/api/messages"):
        for headers in ({"Host": f"evil.example:{port}"}, {"Origin": "http://evil.example"}):
            req = urllib.request.Request(f"{b.info['local_url']}{path}", headers={**b.auth, **headers})
            with pytest.raises(urllib.error.HTTPError) as err:
                _OPENER.open(req, timeout=10)
            assert err.value.code == 403
            err.value.close()


def test_event_stream_announces_changes(trio: tuple[Daemon, Daemon, Daemon]) -> None:
    """/api/events sends hello, then a change event when a message lands from the other node."""
    a, b, _c = trio
    got: list[str] = []
    resp = _OPENER.open(get(b, "/api/events"), timeout=30)
    assert resp.headers["Content-Type"].startswith("text/event-stream")

    def read() -> None:
        for raw in resp:
            got.append(raw.decode().rstrip("\n"))
            if got[-1] == "event: change":
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: "event: hello" in got, 10, "hello")
    a.send("x", "y", "wake the stream")
    reader.join(timeout=SPREAD)
    resp.close()
    assert "event: change" in got and got[0] == "retry: 1000"


def test_messages_route_lists_and_long_polls(trio: tuple[Daemon, Daemon, Daemon]) -> None:
    """/api/messages returns the latest messages with receipts, and with after+wait blocks until one lands."""
    a, b, _c = trio
    first = a.send("poller", "target", "one")["messageId"]
    wait_until(lambda: b.has_message(first), SPREAD, "first on b")
    latest = b.api("GET", "/api/messages?limit=1&receipts=1")
    assert [m["messageId"] for m in latest["messages"]] == [first]
    assert latest["messages"][0]["recipients"][0]["role"] == "target"
    cursor = latest["cursor"]
    box: dict[str, object] = {}

    def poll() -> None:
        box["out"] = b.api("GET", f"/api/messages?after={cursor}&wait=20")

    t0 = time.monotonic()
    poller = threading.Thread(target=poll)
    poller.start()
    poller.join(timeout=0.5)  # an observation window for a negative check, not a wait for an event
    assert "out" not in box, "returned before anything new landed"
    second = a.send("poller", "target", "two")["messageId"]
    poller.join(timeout=SPREAD)
    out = box["out"]
    assert isinstance(out, dict) and [m["messageId"] for m in out["messages"]] == [second]
    assert time.monotonic() - t0 < patience(20)
    status, err = b.call("GET", "/api/messages?after=abc")
    assert status == 400 and "after must be an integer" in err["error"]


def test_open_streams_do_not_hold_up_shutdown(fleet: Fleet) -> None:
    """A daemon with an open event stream and a waiting inbox call still stops promptly on SIGTERM."""
    d = fleet.add("solo")
    fleet.start(d)
    stream = _OPENER.open(get(d, "/api/events"), timeout=30)
    waiting = threading.Thread(target=lambda: d.call("POST", "/api/check", {"recipient": "nobody", "wait": 120}),
                               daemon=True)
    waiting.start()
    time.sleep(0.5)  # the check has no signal for reaching its wait: give it the time to get there
    t0 = time.monotonic()
    assert d.stop(timeout=10) == 0
    assert time.monotonic() - t0 < patience(8)
    stream.close()
    waiting.join(timeout=5)
