"""In-memory sync harness for the sync benchmarks: signed workloads, a metered link, a fleet simulation.

* ``workload`` signs realistic message ops for a few foreign origins (in worker processes).
* ``Link`` runs the sans-io protocol (``peerd.protocol``) between two real replicas
  exactly as the daemon frames it, with the protocol's own functions: each request
  gets the caller's envelope (``protocol.stamp``), each is answered by
  ``protocol.dispatch`` (which signs the reply); bodies are encoded with
  ``protocol.encode`` and, given a fleet key, really sealed and opened.
* ``SimFleet`` drives many in-memory replicas through that link in rounds, with
  the daemon's push-on-write flood modelled on top.

Invariants:
* Every byte count is the size of a sealed body as it would cross the wire:
  ``len(msgpack) + SEAL_OVERHEAD`` (equal to ``len(seal(...))``, which is checked
  whenever a key is given). HTTP framing is not included here.
* Simulated rounds are synchronous: news learnt during round r is passed on only
  in round r + 1 (exchanges are ordered so that it cannot hop twice in a round).
* Whether a node holds the message is read from its replica's vector, never assumed.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from peerd import protocol
from peerd.protocol import Msg, RoundResult
from peerd.seal import SEAL_OVERHEAD, open_sealed, seal
from replica import Replica, hlc, identity, ops

DAEMON_PORT = 7733  # the default peer port: what the ``p`` field of a request costs
SIGN_CHUNK = 5_000
_WORDS = (
    "build", "deploy", "review", "the", "branch", "is", "green", "again", "after", "fixing", "flaky",
    "tests", "in", "module", "sync", "please", "rerun", "benchmarks", "on", "main", "and", "report",
    "numbers", "latency", "looks", "fine", "ship", "it", "tomorrow", "morning", "ok", "with", "you",
)


# -- workload ------------------------------------------------------------------------------------


def content_for(i: int) -> str:
    """Message i's content: plain words, 100 to 200 bytes, deterministic."""
    rng = random.Random(i)
    size = 100 + (i * 37) % 101
    words: list[str] = [f"#{i}"]
    while sum(len(w) + 1 for w in words) < size:
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:size]


def message_body(i: int) -> dict[str, Any]:
    return {"f": f"agent-{i % 7}", "fi": None, "c": ("tau", "phi", "tau,phi", "broadcast")[i % 4],
            "ti": None, "t": None, "x": content_for(i)}


def signed_ops(seed: bytes, first: int, count: int, base_ms: int) -> list[bytes]:
    """Signed msg ops with seq first+1 .. first+count of the origin whose key seed is ``seed``."""
    ident = identity.from_seed(seed)
    key = ident.public_key
    return [
        ops.encode(key, i + 1, hlc.pack(base_ms + i), ops.KIND_MSG, message_body(i), sign=ident.sign)
        for i in range(first, first + count)
    ]


def workload(origins: int, per_origin: int, *, workers: int = 2) -> list[list[bytes]]:
    """``per_origin`` signed message ops for each of ``origins`` fresh foreign origins, in seq order."""
    seeds = [os.urandom(identity.SEED_BYTES) for _ in range(origins)]
    base_ms = int(time.time() * 1000) - per_origin - 60_000
    jobs = [(k, start, min(SIGN_CHUNK, per_origin - start))
            for k in range(origins) for start in range(0, per_origin, SIGN_CHUNK)]
    out: list[list[bytes]] = [[] for _ in range(origins)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [(k, pool.submit(signed_ops, seeds[k], start, count, base_ms)) for k, start, count in jobs]
        for k, fut in futures:
            out[k].extend(fut.result())
    return out


def apply_in_batches(rep: Replica, raws: Sequence[bytes], batch: int = 1_000) -> None:
    for i in range(0, len(raws), batch):
        rep.apply(raws[i : i + batch])


# -- a metered in-memory link ---------------------------------------------------------------------


pack = protocol.encode
unpack = protocol.decode


@dataclass
class Tally:
    """Requests and sealed body bytes in each direction (up: client to server)."""

    requests: int = 0
    up: int = 0
    down: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return self.up + self.down


class Link:
    """The daemon's transport, in memory: frames, packs and (with a key) seals every body."""

    def __init__(self, fleet_key: bytes | None = None, *, port: int = DAEMON_PORT) -> None:
        self.key = fleet_key
        self.port = port
        self.trace: list[Msg] | None = None  # set to a list to keep every message carried

    def carry_plain(self, msg: Msg) -> tuple[int, bytes]:
        """The wire size of ``msg`` sealed, and the plaintext the other side opens."""
        packed = pack(msg)
        if self.trace is not None:
            self.trace.append(msg)
        if self.key is None:
            return len(packed) + SEAL_OVERHEAD, packed
        sealed = seal(self.key, packed)
        assert len(sealed) == len(packed) + SEAL_OVERHEAD
        return len(sealed), open_sealed(self.key, sealed)

    def carry(self, msg: Msg) -> tuple[int, Msg]:
        """The wire size of ``msg`` sealed, and the message as the other side decodes it."""
        size, plain = self.carry_plain(msg)
        return size, unpack(plain)

    def exchange(self, server: Replica, req: Msg, me: bytes, tally: Tally, budget: int) -> protocol.Outcome:
        """One request/response as the daemon frames it (``Node.call`` and ``Node.answer``)."""
        req = protocol.stamp(req, me=me, port=self.port)
        up, plain = self.carry_plain(req)
        here = protocol.Here(protocol.short(server.node_key), "sim", budget, time.time_ns() // 1_000_000)
        out = protocol.dispatch(server, protocol.decode_request(plain), here)
        down, wire_reply = self.carry(out.reply)
        tally.requests += 1
        tally.up += up
        tally.down += down
        tally.kinds[str(req["t"])] += 1
        return protocol.Outcome(wire_reply, out.new, out.forward, out.learnt)

    def round(self, client: Replica, server: Replica, budget: int, tally: Tally) -> RoundResult:
        """One push-pull round started by ``client``."""
        gen = protocol.client_round(client, budget=budget)
        return protocol.drive(gen, lambda req: self.exchange(server, req, client.node_key, tally, budget).reply)

    def push(self, sender: Replica, receiver: Replica, raws: list[bytes], tally: Tally, budget: int) -> int:
        """A push of ``raws`` as ``Node._drain`` sends it; how many ops were new to the receiver."""
        return self.exchange(receiver, {"t": protocol.PUSH, "o": raws}, sender.node_key, tally, budget).new


# -- fleet simulation ------------------------------------------------------------------------------


@dataclass
class Spread:
    """How one new message reached every node of a simulated fleet."""

    rounds: int  # gossip rounds after the write until every node held it (push flood counts as round 0)
    after_push: int  # nodes holding it once the push flood ended (1 without push)
    push_hops: int  # longest chain of forwards in the flood
    push_requests: int
    round_requests: int  # requests of the rounds up to and including the converging one
    bytes: int  # sealed body bytes, both directions, push and rounds
    coverage: list[int]  # nodes holding it after the flood, then after each round
    converged: bool

    @property
    def requests(self) -> int:
        return self.push_requests + self.round_requests


class SimFleet:
    """``n`` in-memory replicas in one fleet; each round every node syncs with one random peer.

    Every node knows every other (a settled peer table). Push is modelled as the
    daemon does it: the writer pushes the new op to ``fanout`` random peers; a peer
    for which it is new forwards it to ``fanout`` random peers other than the sender.
    """

    def __init__(self, n: int, *, budget: int, rng: random.Random, link: Link | None = None) -> None:
        self.reps = [Replica.open() for _ in range(n)]
        self.budget = budget
        self.rng = rng
        self.link = link or Link()

    def close(self) -> None:
        for rep in self.reps:
            rep.close()

    def _has(self, i: int, origin: bytes, seq: int) -> bool:
        return self.reps[i].vector().get(origin, 0) >= seq

    def _peer_of(self, i: int, avoid: int | None = None) -> int:
        n = len(self.reps)
        while True:
            j = self.rng.randrange(n)
            if j not in (i, avoid):
                return j

    def _peers_of(self, i: int, k: int, avoid: int | None) -> list[int]:
        pool = [j for j in range(len(self.reps)) if j not in (i, avoid)]
        return self.rng.sample(pool, min(k, len(pool)))

    def _flood(self, writer: int, raw: bytes, fanout: int, held: set[int], tally: Tally) -> int:
        """The push flood of one new op; returns its depth in hops."""
        queue: list[tuple[int, int | None, int]] = [(writer, None, 0)]
        hops = 0
        while queue:
            node, sender, depth = queue.pop(0)
            for j in self._peers_of(node, fanout, sender):
                if self.link.push(self.reps[node], self.reps[j], [raw], tally, self.budget):
                    held.add(j)
                    hops = max(hops, depth + 1)
                    queue.append((j, node, depth + 1))
        return hops

    def _round(self, held: set[int], origin: bytes, seq: int, tally: Tally) -> None:
        pairs = [(i, self._peer_of(i)) for i in range(len(self.reps))]
        before = set(held)
        quiet = [p for p in pairs if p[0] not in before and p[1] not in before]
        hot = [p for p in pairs if p[0] in before or p[1] in before]
        for i, j in quiet + hot:  # quiet pairs first: news never hops twice in one round
            self.link.round(self.reps[i], self.reps[j], self.budget, tally)
            for k in (i, j):
                if k not in held and self._has(k, origin, seq):
                    held.add(k)

    def spread(self, writer: int, *, fanout: int, max_rounds: int = 100) -> Spread:
        """Write one message on ``writer`` and run rounds until every node holds it."""
        rep = self.reps[writer]
        sent = rep.send_message("bench-writer", "bench", content_for(self.rng.randrange(1 << 30)))
        (lseq, raw), = rep.local_ops_after(sent.seq - 1, 1)
        assert lseq == sent.seq
        origin, seq = rep.node_key, rep.vector()[rep.node_key]
        held = {writer}
        push_tally, round_tally = Tally(), Tally()
        hops = self._flood(writer, raw, fanout, held, push_tally) if fanout else 0
        coverage = [len(held)]
        rounds = 0
        while len(held) < len(self.reps) and rounds < max_rounds:
            rounds += 1
            self._round(held, origin, seq, round_tally)
            coverage.append(len(held))
        return Spread(
            rounds=rounds, after_push=coverage[0], push_hops=hops, push_requests=push_tally.requests,
            round_requests=round_tally.requests, bytes=push_tally.total + round_tally.total,
            coverage=coverage, converged=len(held) == len(self.reps),
        )
