"""The return path's bounds and settings on real daemons (loopback): a relaying member over its
cap refuses a link cleanly and the member asking links elsewhere; ``reachable`` decides, "auto"
asks a peer."""

from __future__ import annotations

from tests.daemons import Fleet, wait_until

pytest_plugins = ["tests.daemons"]

LINKED = 30.0


def via(d: object) -> set[str]:
    return {v["node_id"] for v in d.status()["relay"]["via"]}  # type: ignore[attr-defined]


def test_a_full_relay_refuses_cleanly_and_the_member_links_to_another(fleet: Fleet) -> None:
    """S holds one link per address: of two members behind "one address" (loopback) that cannot
    be called, one links to S, the other is refused with the reason, links to P only, and still
    gets S's mail; members left on "auto" learn they can be called and link to nobody."""
    s = fleet.add("s", config={"relay_links_per_address": 1})
    p = fleet.add("p", seeds=[s])
    laptops = [fleet.add(f"l{i}", seeds=[s, p], config={"reachable": False}) for i in (1, 2)]
    fleet.start()
    for d in laptops:
        wait_until(lambda d=d: p.short_id in via(d), LINKED, f"{d.name} linked to p")
    wait_until(lambda: len(s.status()["relay"]["relaying_for"]) == 1, LINKED, "s relaying for one member")
    refused = next(d for d in laptops if s.short_id not in via(d))
    wait_until(lambda: any("relay full" in (w["last_error"] or "") for w in refused.status()["relay"]["waiting"]),
               LINKED, f"{refused.name} to say s is full")
    assert "link refused: this member relays for 1 members at 127.0.0.1 already" in s.log_text()
    sent = s.send("alice", "bob", "through p")
    wait_until(lambda: refused.has_message(sent["messageId"]), 10, "s's mail on the refused member")
    for d in (s, p):
        wait_until(lambda d=d: d.status()["relay"]["reachable"] is True, LINKED, f"{d.name} to learn it can be called")
        assert d.status()["relay"]["via"] == []
    assert all(d.status()["relay"]["reachable"] is False for d in laptops)


def test_reachable_true_keeps_no_links(fleet: Fleet) -> None:
    """``reachable = true``: the member is reachable from the start, keeps no link, and gets mail
    by ordinary pushes."""
    s = fleet.add("s")
    m = fleet.add("m", seeds=[s], config={"reachable": True})
    fleet.start()
    wait_until(lambda: m.peer(s) is not None and m.peer(s)["reachable"], LINKED, "m to reach s")  # type: ignore[index]
    sent = s.send("alice", "bob", "hi")
    wait_until(lambda: m.has_message(sent["messageId"]), 10, "s's mail on m")
    assert m.status()["relay"] == {**m.status()["relay"], "reachable": True, "via": []}
    assert s.status()["relay"]["relaying_for"] == []
