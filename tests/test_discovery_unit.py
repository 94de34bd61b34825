"""Discovery logic without the network: seeds, backoff, adverts, interface choice, SeedSource."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from discovery import (
    Advert,
    AdvertError,
    Backoff,
    MdnsSource,
    PeerCandidate,
    SeedError,
    SeedSource,
    decode_txt,
    encode_txt,
    judge_advert,
    parse_seed,
    parse_seeds,
)
from discovery.advert import instance_label, instance_name, pick_host
from discovery.lanview import LanView
from discovery.netif import LocalAddress, check_interfaces, one_per_device, select_addresses
from discovery.seeds import Seed, format_seed, loop_resolver
from tests.waiting import eventually

# -- seed parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("peer.example.com:7400", Seed("peer.example.com", 7400, literal=False)),
        ("  10.0.0.5:7400 ", Seed("10.0.0.5", 7400, literal=True)),
        ("[2001:db8::1]:7400", Seed("2001:db8::1", 7400, literal=True)),
        ("[fe80::1%eth0]:1", Seed("fe80::1%eth0", 1, literal=True)),
        ("my-host.local.:65535", Seed("my-host.local.", 65535, literal=False)),
        ("localhost:80", Seed("localhost", 80, literal=False)),
    ],
)
def test_parse_seed_accepts_host_ipv4_and_bracketed_ipv6(text: str, expected: Seed) -> None:
    """Valid seed spellings parse to host (no brackets), port and whether the host is an IP."""
    assert parse_seed(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty seed"),
        ("   ", "empty seed"),
        ("peer.example.com", "has no port"),
        ("peer.example.com:", "empty port"),
        (":7400", "has no host"),
        ("peer:0", "outside 1..65535"),
        ("peer:65536", "outside 1..65535"),
        ("peer:http", "not a number"),
        ("peer:-1", "not a number"),
        ("2001:db8::1:7400", "need brackets"),
        ("[2001:db8::1", "missing ']'"),
        ("[2001:db8::1]7400", "expected ':PORT'"),
        ("[not-an-ip]:7400", "not a valid IPv6"),
        ("[10.0.0.1]:7400", "not a valid IPv6"),
        ("999.1.1.1:7400", "not a valid IPv4"),
        ("bad_host!:7400", "not a valid host name"),
        ("-dash.example:7400", "not a valid host name"),
        ("a..b:7400", "not a valid host name"),
        (f"{'x' * 64}.com:7400", "not a valid host name"),
    ],
)
def test_parse_seed_rejects_bad_entries_with_a_clear_message(text: str, message: str) -> None:
    """A malformed seed raises SeedError (a ValueError) saying what is wrong."""
    with pytest.raises(ValueError, match=message) as info:
        parse_seed(text)
    assert isinstance(info.value, SeedError)


def test_parse_seed_uses_default_port_only_when_port_is_missing() -> None:
    """default_port fills a missing port but never overrides a given one."""
    assert parse_seed("peer", default_port=7400) == Seed("peer", 7400, literal=False)
    assert parse_seed("[::1]", default_port=7400) == Seed("::1", 7400, literal=True)
    assert parse_seed("peer:9", default_port=7400).port == 9


def test_parse_seeds_drops_duplicates_case_insensitively() -> None:
    """Repeated seeds (host names compare case-insensitively) are kept once, first wins."""
    seeds = parse_seeds(["Peer.example:1", "peer.EXAMPLE:1", "peer.example:2", "10.0.0.1:1"])
    assert [str(s) for s in seeds] == ["Peer.example:1", "peer.example:2", "10.0.0.1:1"]


def test_parse_seeds_rejects_a_single_string() -> None:
    """A bare string (a common config mistake) is refused instead of parsed per character."""
    with pytest.raises(SeedError, match="list"):
        parse_seeds("peer:1")


@given(
    address=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    port=st.integers(min_value=1, max_value=65535),
)
def test_format_and_parse_seed_round_trip(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int
) -> None:
    """format_seed output always parses back to the same literal host and port."""
    seed = parse_seed(format_seed(str(address), port))
    assert (ipaddress.ip_address(seed.host), seed.port, seed.literal) == (address, port, True)


# -- backoff --------------------------------------------------------------------


def test_backoff_ceiling_doubles_from_base_up_to_cap() -> None:
    """Un-jittered delays: 0 before any failure, then base * factor^(n-1), capped."""
    backoff = Backoff(base=1.0, factor=2.0, cap=10.0, jitter=0.5)
    assert [backoff.ceiling(n) for n in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_backoff_survives_huge_failure_counts() -> None:
    """A failure count far beyond float range returns the cap instead of overflowing."""
    backoff = Backoff(base=0.5, factor=10.0, cap=300.0)
    assert backoff.ceiling(10**6) == 300.0
    assert Backoff(factor=1.0, cap=5.0).ceiling(10**6) == 1.0


@given(
    failures=st.integers(min_value=0, max_value=10_000),
    u=st.floats(min_value=0, max_value=1, exclude_max=True),
    jitter=st.floats(min_value=0, max_value=1),
)
def test_backoff_delay_stays_within_jitter_band_and_cap(
    failures: int, u: float, jitter: float
) -> None:
    """Jitter only shortens: (1 - jitter) * ceiling <= delay <= ceiling <= cap."""
    backoff = Backoff(base=0.25, factor=2.0, cap=60.0, jitter=jitter)
    ceiling = backoff.ceiling(failures)
    delay = backoff.delay(failures, u)
    assert (1 - jitter) * ceiling - 1e-9 <= delay <= ceiling <= 60.0
    assert backoff.ceiling(failures) <= backoff.ceiling(failures + 1)


def test_backoff_next_delay_draws_from_the_given_rng() -> None:
    """next_delay is delay() with the rng's sample."""
    backoff = Backoff(base=2.0, factor=2.0, cap=100.0, jitter=0.5)
    assert backoff.next_delay(3, lambda: 0.5) == backoff.delay(3, 0.5) == 6.0


@pytest.mark.parametrize(
    "kwargs",
    [{"base": 0}, {"factor": 0.5}, {"base": 5.0, "cap": 1.0}, {"jitter": 1.5}, {"jitter": -0.1}],
)
def test_backoff_rejects_nonsense_parameters(kwargs: dict[str, float]) -> None:
    """Parameters that would make delays negative, shrinking or uncapped raise ValueError."""
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kwargs)


def test_backoff_rejects_samples_outside_unit_interval() -> None:
    """The jitter sample must be in [0, 1)."""
    with pytest.raises(ValueError, match="sample"):
        Backoff().delay(1, 1.0)


# -- adverts --------------------------------------------------------------------

ADVERT = Advert(node_id="n-self", fleet_id="fleet-a", protocol_version=3, port=7400)
_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S")), min_size=1, max_size=60
)


def _raw(txt: dict[str, str]) -> dict[bytes, bytes | None]:
    return {k.encode(): v.encode() for k, v in txt.items()}


def test_encode_txt_has_exactly_the_four_documented_keys() -> None:
    """The advert's TXT record carries node, fleet, proto and port, all as text."""
    assert encode_txt(ADVERT) == {
        "node": "n-self",
        "fleet": "fleet-a",
        "proto": "3",
        "port": "7400",
    }


@given(
    node_id=_TEXT,
    fleet_id=_TEXT,
    version=st.integers(min_value=0, max_value=2**31),
    port=st.integers(min_value=1, max_value=65535),
    protocols=st.lists(st.integers(min_value=0, max_value=30), unique=True).map(lambda v: tuple(sorted(v))),
)
def test_txt_round_trips(node_id: str, fleet_id: str, version: int, port: int, protocols: tuple[int, ...]) -> None:
    """decode_txt(encode_txt(a)) == a for every advertisable value."""
    advert = Advert(node_id, fleet_id, version, port, protocols=protocols)
    assert decode_txt(_raw(encode_txt(advert))) == advert


def test_a_malformed_protos_entry_reads_as_none() -> None:
    """``protos`` that is not a list of small numbers is ignored: the advert stands on ``proto``."""
    for raw in (b"2,x", b"99", b"\xff", b""):
        props = {b"node": b"n", b"fleet": b"f", b"proto": b"2", b"port": b"1", b"protos": raw}
        assert decode_txt(props).spoken() == {2}


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({b"fleet": b"f", b"proto": b"1", b"port": b"1"}, "lacks 'node'"),
        ({b"node": b"n", b"fleet": b"f", b"proto": b"1", b"port": None}, "lacks 'port'"),
        ({b"node": b"", b"fleet": b"f", b"proto": b"1", b"port": b"1"}, "'node' is empty"),
        ({b"node": b"\xff", b"fleet": b"f", b"proto": b"1", b"port": b"1"}, "not UTF-8"),
        ({b"node": b"n", b"fleet": b"f", b"proto": b"x", b"port": b"1"}, "'proto'"),
        ({b"node": b"n", b"fleet": b"f", b"proto": b"1", b"port": b"70000"}, "'port'"),
        ({b"node": b"n", b"fleet": b"f", b"proto": b"1", b"port": b"0"}, "'port'"),
    ],
)
def test_decode_txt_rejects_malformed_adverts(
    props: dict[bytes, bytes | None], message: str
) -> None:
    """Missing, empty, non-UTF-8 or out-of-range TXT values raise AdvertError."""
    with pytest.raises(AdvertError, match=message):
        decode_txt(props)


@pytest.mark.parametrize(
    "advert",
    [
        Advert("", "f", 1, 1),
        Advert("n", " f", 1, 1),
        Advert("n\n", "f", 1, 1),
        Advert("n", "f", -1, 1),
        Advert("n", "f", 1, 0),
        Advert("n" * 260, "f", 1, 1),
    ],
)
def test_encode_txt_refuses_values_that_cannot_be_advertised(advert: Advert) -> None:
    """Empty/unprintable ids, bad numbers and entries over 255 bytes raise AdvertError."""
    with pytest.raises(AdvertError):
        encode_txt(advert)


@pytest.mark.parametrize(
    ("advert", "verdict"),
    [
        (Advert("n-other", "fleet-a", 3, 7401), "accept"),
        (Advert("n-self", "fleet-a", 3, 7401), "self"),
        (Advert("n-self", "fleet-b", 2, 7401), "self"),
        (Advert("n-other", "fleet-b", 3, 7401), "other-fleet"),
        (Advert("n-other", "fleet-a", 4, 7401), "other-version"),
        (Advert("n-other", "fleet-b", 4, 7401), "other-fleet"),
        (Advert("n-other", "fleet-a", 2, 7401), "accept"),  # the first release: proto=2 and no protos
        (Advert("n-other", "fleet-a", 3, 7401, protocols=(3, 4)), "accept"),
        (Advert("n-other", "fleet-a", 4, 7401, protocols=(4, 5)), "other-version"),
        (Advert("n-other", "fleet-a", 1, 7401, protocols=(1,)), "other-version"),
    ],
)
def test_judge_advert_ignores_self_other_fleets_and_other_versions(
    advert: Advert, verdict: str
) -> None:
    """Only adverts of another node with our fleet id and a protocol version in common are accepted."""
    assert judge_advert(advert, own_node_id="n-self", fleet_id="fleet-a", protocol_versions=(2, 3)) == (
        verdict
    )


@given(node_id=_TEXT)
def test_instance_label_is_dns_safe_short_and_stable(node_id: str) -> None:
    """Instance labels are peerd-<id>, only [A-Za-z0-9-], at most 63 bytes, deterministic."""
    label = instance_label(node_id)
    assert label.startswith("peerd-")
    assert len(label.encode()) <= 63
    assert all(c.isascii() and (c.isalnum() or c == "-") for c in label)
    assert label == instance_label(node_id)
    assert instance_name(node_id) == f"{label}._peerd._tcp.local."


def test_instance_label_keeps_distinct_node_ids_distinct() -> None:
    """Typical node ids (hex / base32 digests) map to distinct labels."""
    ids = [f"{i:064x}"[::-1] for i in range(100)]
    assert len({instance_label(i) for i in ids}) == 100


def test_pick_host_prefers_an_address_on_our_own_networks() -> None:
    """The address inside a local subnet wins; otherwise the first is used."""
    addresses = ["192.168.9.4", "10.77.2.12", "10.77.1.12"]
    assert pick_host(addresses, ["10.77.1.11/24"]) == "10.77.1.12"
    assert pick_host(addresses, ["172.16.0.1/16"]) == "192.168.9.4"
    with pytest.raises(ValueError, match="at least one"):
        pick_host([], ["10.0.0.1/8"])


# -- interface choice -----------------------------------------------------------

LOCAL = (
    LocalAddress("lo", "127.0.0.1", 8, loopback=True),
    LocalAddress("eth0", "10.77.1.11", 24),
    LocalAddress("eth0:1", "10.77.1.50", 24),
    LocalAddress("wg0", "10.9.0.2", 24, multicast=False),
    LocalAddress("eth1", "192.168.5.2", 24, up=False),
    LocalAddress("eth2", "192.168.6.2", 24),
)


def test_select_all_takes_up_multicast_non_loopback_addresses() -> None:
    """'all' skips loopback, down interfaces and interfaces without multicast."""
    chosen, unmatched = select_addresses("all", LOCAL)
    assert [a.address for a in chosen] == ["10.77.1.11", "10.77.1.50", "192.168.6.2"]
    assert unmatched == ()


def test_select_list_matches_names_and_addresses_and_reports_unknown_entries() -> None:
    """A list picks interfaces by name (all their labels) or address; unknown entries come back."""
    chosen, unmatched = select_addresses(["eth0", "192.168.5.2", "wg0", "eth9"], LOCAL)
    assert [a.address for a in chosen] == ["10.77.1.11", "10.77.1.50", "10.9.0.2"]
    assert unmatched == ("eth9",)


def test_one_socket_address_per_device() -> None:
    """Address labels of one link share one mDNS socket (the first address)."""
    chosen, _ = select_addresses("all", LOCAL)
    assert one_per_device(chosen) == ("10.77.1.11", "192.168.6.2")


# -- candidates and constructors ------------------------------------------------


@pytest.mark.parametrize(("host", "port"), [("", 1), ("h", 0), ("h", 65536)])
def test_peer_candidate_rejects_empty_host_and_bad_port(host: str, port: int) -> None:
    """A candidate always has a host and a port in 1..65535."""
    with pytest.raises(ValueError, match="peer"):
        PeerCandidate(host=host, port=port, source="seed")


@pytest.mark.parametrize("interfaces", ["eth0", [], [""], "everything"])
def test_mdns_source_rejects_bad_interface_choice(interfaces: str | list[str]) -> None:
    """interfaces must be 'all', 'default' or a non-empty list of names/addresses."""
    with pytest.raises(ValueError, match="interfaces"):
        MdnsSource("n", "f", 7400, (1,), interfaces)


def test_mdns_source_rejects_values_it_could_not_advertise() -> None:
    """Bad node id or port fail at construction, before any socket is opened."""
    with pytest.raises(AdvertError):
        MdnsSource("", "f", 7400, (1,))
    with pytest.raises(AdvertError):
        MdnsSource("n", "f", 0, (1,))


def test_mdns_source_is_inactive_before_start() -> None:
    """A fresh source reports inactive with a reason, and its per-node instance name."""
    source = MdnsSource("node-1", "f", 7400, (1,))
    assert (source.active, source.announced, source.problem) == (False, False, "not started")
    assert source.instance_name == "peerd-node-1._peerd._tcp.local."


# -- SeedSource -----------------------------------------------------------------


class Recorder:
    """Collects found candidates and lets a test await the next one."""

    def __init__(self) -> None:
        self.found: list[PeerCandidate] = []
        self.gone: list[str] = []
        self._changed = asyncio.Event()

    def on_found(self, candidate: PeerCandidate) -> None:
        self.found.append(candidate)
        self._changed.set()

    def on_gone(self, node_id: str) -> None:
        self.gone.append(node_id)

    async def wait_count(self, count: int, within: float = 2.0) -> None:
        async with asyncio.timeout(within):
            while len(self.found) < count:
                self._changed.clear()
                await self._changed.wait()


class FakeDns:
    """A resolver whose answers the test scripts; counts look-ups."""

    def __init__(self, answers: Sequence[Sequence[str] | OSError]) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, OSError):
            raise answer
        return answer


FAST = Backoff(base=0.05, factor=2.0, cap=0.2, jitter=0.0)


async def test_seed_source_hands_over_literal_and_resolved_seeds() -> None:
    """Each seed yields one 'seed' candidate: host as written plus its resolved addresses."""
    dns = FakeDns([["10.1.1.1", "10.1.1.2", "10.1.1.1"]])
    source = SeedSource(["[::1]:7400", "peer.example:7401"], resolver=dns)
    rec = Recorder()
    await source.start(rec.on_found, rec.on_gone)
    try:
        await rec.wait_count(2)
    finally:
        await source.stop()
    by_host = {c.host: c for c in rec.found}
    assert by_host["::1"] == PeerCandidate("::1", 7400, "seed", None, ("::1",))
    assert by_host["peer.example"] == PeerCandidate(
        "peer.example", 7401, "seed", None, ("10.1.1.1", "10.1.1.2")
    )
    assert rec.gone == []


async def test_seed_source_real_resolver_resolves_localhost() -> None:
    """The default resolver uses the loop's getaddrinfo and returns loopback for localhost."""
    addresses = await loop_resolver("localhost", 7400)
    assert addresses
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses)


async def test_seed_source_retries_failed_seed_with_backoff_until_success() -> None:
    """report_failure re-offers the seed after the backoff delay; report_success stops that."""
    source = SeedSource(["10.0.0.9:7400"], backoff=FAST)
    rec = Recorder()
    loop = asyncio.get_running_loop()
    await source.start(rec.on_found, rec.on_gone)
    try:
        await rec.wait_count(1)
        times = [loop.time()]
        for expected in (1, 2, 3):
            source.report_failure("10.0.0.9", 7400)
            assert source.failures("10.0.0.9", 7400) == expected
            await rec.wait_count(1 + expected)
            times.append(loop.time())
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps[0] >= 0.045 and gaps[1] >= 0.095 and gaps[2] >= 0.195
        source.report_failure("10.0.0.9", 7400)
        source.report_success("10.0.0.9", 7400)
        await asyncio.sleep(0.4)  # an observation window: the cancelled retry (due in 0.2 s) must not fire
    finally:
        await source.stop()
    assert len(rec.found) == 4
    assert source.failures("10.0.0.9", 7400) == 0


async def test_seed_source_matches_reports_by_resolved_address_and_ignores_strangers() -> None:
    """A report naming one of the resolved addresses counts; unknown host/port pairs are ignored."""
    source = SeedSource(["peer.example:7400"], resolver=FakeDns([["10.2.0.1"]]), backoff=FAST)
    rec = Recorder()
    await source.start(rec.on_found, rec.on_gone)
    try:
        await rec.wait_count(1)
        source.report_failure("10.2.0.1", 7400)
        source.report_failure("10.2.0.1", 9999)
        source.report_failure("elsewhere", 7400)
        assert source.failures("peer.example", 7400) == 1
        await rec.wait_count(2)
    finally:
        await source.stop()


async def test_seed_source_re_resolves_and_re_offers_on_address_change() -> None:
    """Names are re-resolved every resolve_interval; a new address set is offered at once."""
    dns = FakeDns([["10.3.0.1"], ["10.3.0.1"], ["10.3.0.2"]])
    source = SeedSource(["peer.example:7400"], resolve_interval=0.05, resolver=dns)
    rec = Recorder()
    await source.start(rec.on_found, rec.on_gone)
    try:
        await rec.wait_count(2)
        await eventually(lambda: dns.calls >= 5, 5, "two more look-ups of the unchanged address")
    finally:
        await source.stop()
    assert [c.addresses for c in rec.found] == [("10.3.0.1",), ("10.3.0.2",)]  # unchanged: not offered again


async def test_seed_source_logs_one_warning_per_failed_lookup_streak(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing DNS look-up is retried with backoff, logged once, and recovers."""
    dns = FakeDns([OSError("no such host"), OSError("no such host"), OSError("x"), ["10.4.0.1"]])
    source = SeedSource(["peer.example:7400"], resolver=dns, backoff=FAST)
    rec = Recorder()
    with caplog.at_level(logging.INFO, logger="discovery.seeds"):
        await source.start(rec.on_found, rec.on_gone)
        try:
            await rec.wait_count(1)
        finally:
            await source.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot resolve 'peer.example'" in warnings[0].getMessage()
    assert rec.found[0].addresses == ("10.4.0.1",)
    assert dns.calls == 4


async def test_seed_source_survives_a_raising_callback(caplog: pytest.LogCaptureFixture) -> None:
    """A consumer callback that raises is logged; the other seeds are still handed over."""
    seen: list[str] = []

    def found(candidate: PeerCandidate) -> None:
        seen.append(candidate.host)
        if candidate.host == "10.5.0.1":
            raise RuntimeError("consumer bug")

    source = SeedSource(["10.5.0.1:1", "10.5.0.2:1"])
    with caplog.at_level(logging.ERROR, logger="discovery.seeds"):
        await source.start(found, lambda _: None)
        await eventually(lambda: len(seen) == 2, 5, "both seeds handed over")
        await source.stop()
    assert sorted(seen) == ["10.5.0.1", "10.5.0.2"]
    assert any("consumer bug" in (r.exc_text or "") for r in caplog.records)


async def test_seed_source_stop_silences_pending_retries() -> None:
    """After stop() no retry fires, even one that was already scheduled."""
    source = SeedSource(["10.6.0.1:1"], backoff=FAST)
    rec = Recorder()
    await source.start(rec.on_found, rec.on_gone)
    await rec.wait_count(1)
    source.report_failure("10.6.0.1", 1)
    await source.stop()
    await asyncio.sleep(0.15)  # an observation window: the retry was due in 0.05 s and must not fire
    assert len(rec.found) == 1


def test_seed_source_validates_entries_at_construction() -> None:
    """A bad seed or interval fails when the source is built, not later in the background."""
    with pytest.raises(SeedError, match="need brackets"):
        SeedSource(["ok.example:1", "::1:7400"])
    with pytest.raises(ValueError, match="resolve_interval"):
        SeedSource(["ok.example:1"], resolve_interval=0)


# -- what the adverts in view mean (no sockets) ------------------------------------------------


def _txt(node: str, fleet: str = "fleet-1", protocols: tuple[int, ...] = (2, 3)) -> dict[bytes, bytes | None]:
    txt = encode_txt(Advert(node, fleet, min(protocols), 7733, None, protocols))
    return {k.encode(): v.encode() for k, v in txt.items()}


def test_lan_view_finds_fleet_peers_and_tells_other_fleets_and_versions_apart() -> None:
    """A fleet peer is found once (again only when it changes) and gone when its last advert leaves;
    another fleet is a sighting, a peer with no version in common is told once; neither is found."""
    found: list[PeerCandidate] = []
    gone: list[str] = []
    others: list[str] = []
    left: list[str] = []
    versions: list[str | None] = []
    view = LanView(Advert("me", "fleet-1", 2, 7733, None, (2, 3)), other=lambda s: others.append(s.fleet_id),
                   other_gone=left.append, other_version=lambda c: versions.append(c.node_id))
    view.found, view.gone = found.append, gone.append
    local = ("10.0.0.9/24",)
    view.saw("a1", _txt("peer"), ["192.168.1.5", "10.0.0.5"], local)
    view.saw("a1", _txt("peer"), ["10.0.0.5", "192.168.1.5"], local)  # same advert, addresses reordered
    view.saw("a2", _txt("peer"), ["10.0.0.6"], local)  # the same node under a second advert
    view.saw("b", _txt("stranger", fleet="fleet-2"), ["10.0.0.7"], local)
    view.saw("c", _txt("future", protocols=(7,)), ["10.0.0.8"], local)
    view.saw("c", _txt("future", protocols=(7,)), ["10.0.0.8"], local)
    view.saw("me", _txt("me"), ["10.0.0.9"], local)
    assert [(c.node_id, c.host) for c in found] == [("peer", "10.0.0.5"), ("peer", "10.0.0.6")]
    assert others == ["fleet-2"] and versions == ["future"]
    view.removed("a1")
    assert gone == []  # the node still has an advert in view
    view.removed("a2")
    view.removed("b")
    assert gone == ["peer"] and left == ["stranger"] and view.names(everyone=True) == []


def test_interface_choices_are_checked() -> None:
    """'all', 'default' or a list of names; names are stripped; anything else is a ValueError."""
    assert check_interfaces("all") == "all" and check_interfaces([" eth0 "]) == ("eth0",)
    for bad in ("eth0", [], ["", "eth0"]):
        with pytest.raises(ValueError, match="mdns interfaces"):
            check_interfaces(bad)
