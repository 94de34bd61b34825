"""The peer table's rules (pure): who to contact, backoff, reachability, sources."""

from __future__ import annotations

from peerd.peers import FAIL_THRESHOLD, PeerTable, backoff

ME = b"me------"


def test_backoff_doubles_and_is_capped() -> None:
    """No failures, no wait; then the wait doubles per failure up to a cap."""
    assert backoff(0) == 0.0
    assert backoff(1) < backoff(2) < backoff(3)
    assert backoff(100) == backoff(101)


def test_never_adds_itself_and_dedupes_by_address() -> None:
    """Our own node id is never added; the same address is one peer."""
    t = PeerTable(ME)
    assert t.add("10.0.0.1", 7733, "seed", node=ME) is None
    assert t.add("10.0.0.2", 7733, "seed") is not None
    assert t.add("10.0.0.2", 7733, "exchange") is None
    assert len(t.peers) == 1


def test_new_candidates_are_tried_first_and_failing_ones_retried() -> None:
    """A never-tried peer is always picked; one failing peer rides along once its backoff passed."""
    t = PeerTable(ME)
    live = [t.add(f"10.0.0.{i}", 1, "seed") for i in range(4)]
    for p in live:
        assert p is not None
        t.succeeded(p, 0.0, None)
        p.last_sync = 0.0
    fresh = t.add("10.0.1.1", 1, "exchange")
    failing = t.add("10.0.1.2", 1, "seed")
    assert fresh is not None and failing is not None
    failing.last_sync = 0.0
    for _ in range(FAIL_THRESHOLD):
        t.failed(failing, 0.0, "down")
    picked = t.pick(2, now=1000.0)
    assert picked[0] is fresh and failing in picked and len(picked) == 3
    assert not failing.reachable
    assert failing not in t.push_targets(10)


def test_busy_and_excluded_peers_are_skipped() -> None:
    """A peer already in a round, or the one a push came from, is not picked again."""
    t = PeerTable(ME)
    a = t.add("10.0.0.1", 1, "seed", node=b"a-------")
    b = t.add("10.0.0.2", 1, "seed", node=b"b-------")
    assert a is not None and b is not None
    assert t.pick(5, 0.0, busy=frozenset({a.addr})) == [b]
    t.succeeded(a, 0.0, None)
    t.succeeded(b, 0.0, None)
    assert t.push_targets(5, exclude=b"a-------") == [b]


def test_better_source_wins_and_goodbye_marks_gone() -> None:
    """An inbound peer later seen by mDNS is reported as mdns; a goodbye makes it not live."""
    t = PeerTable(ME)
    p = t.add("10.0.0.5", 1, "inbound", node=b"\x01" * 8)
    assert p is not None
    t.add("10.0.0.5", 1, "mdns")
    assert p.source == "mdns"
    t.succeeded(p, 0.0, None)
    assert p.reachable
    t.mark_gone((b"\x01" * 32).hex())
    assert not p.reachable and p not in t.push_targets(5)
