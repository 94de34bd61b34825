"""The peer port's bounds, on a real aiohttp server on 127.0.0.1: connection caps per source and in
total, head and body deadlines, early 413s, and malformed HTTP as one refusal without a traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager

import pytest

from peerd.transport import Answer, HttpTransport, ServeLimits
from tests.waiting import eventually

LIMITS = ServeLimits(max_connections=6, per_source=2, head_timeout=0.5, body_timeout=0.5)


class Recorder:
    """A server that answers 200 with its request body and notes every refusal."""

    def __init__(self) -> None:
        self.answered = 0
        self.refused: list[tuple[str, str]] = []

    async def answer(self, body: bytes, remote: str) -> Answer:
        self.answered += 1
        return Answer(200, body)

    def refuse(self, remote: str, why: str) -> None:
        self.refused.append((remote, why))


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpTransport, Recorder, int]]:
    http = HttpTransport(max_body=1000, total=5, limits=LIMITS)
    rec = Recorder()
    port = await http.listen(rec, "127.0.0.1", 0)
    try:
        yield http, rec, port
    finally:
        await http.close()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the event these tests wait for)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@contextmanager
def held(port: int, sources: list[str]) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        yield [stack.enter_context(connect(port, s)) for s in sources]


def post(port: int, body: bytes, source: str = "127.0.0.1") -> bytes:
    with connect(port, source) as s:
        s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        return read_all(s)


async def admitted(http: HttpTransport, count: int) -> None:
    """Wait until the gate holds exactly ``count`` connections (the server has seen the opens and closes)."""
    assert http.gate is not None
    gate = http.gate
    await eventually(lambda: gate.count == count, 10, f"{count} connections admitted")


async def test_a_source_over_its_cap_is_closed_at_once_while_others_are_served(
        served: tuple[HttpTransport, Recorder, int]) -> None:
    """Two idle connections from 127.0.0.2 fill its share: the third is closed unanswered; 127.0.0.1 still posts."""
    http, rec, port = served
    with held(port, ["127.0.0.2", "127.0.0.2"]):
        await admitted(http, 2)
        with connect(port, "127.0.0.2") as third:
            assert await asyncio.to_thread(read_all, third) == b""
        assert rec.refused == [("127.0.0.2", "too many connections from this address")]
        answer = await asyncio.to_thread(post, port, b"hello")
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    await admitted(http, 0)


async def test_the_port_over_its_total_cap_closes_newcomers(served: tuple[HttpTransport, Recorder, int]) -> None:
    """Six connections from three sources fill the port: a seventh, from a fresh source, is closed at once."""
    http, rec, port = served
    with held(port, [f"127.0.0.{i}" for i in (2, 2, 3, 3, 4, 4)]):
        await admitted(http, 6)
        with connect(port, "127.0.0.5") as late:
            assert await asyncio.to_thread(read_all, late) == b""
        assert rec.refused == [("127.0.0.5", "the peer port is full")]
    await admitted(http, 0)


async def test_a_head_that_never_completes_is_dropped(served: tuple[HttpTransport, Recorder, int]) -> None:
    """Half a request line, then silence: the server closes the connection once the head deadline passes."""
    http, rec, port = served
    with connect(port) as s:
        s.sendall(b"POST /v1 HT")
        assert await asyncio.to_thread(read_all, s) == b""
    await admitted(http, 0)
    assert rec.answered == 0


async def test_a_slow_body_gets_408_and_the_connection_closes(served: tuple[HttpTransport, Recorder, int]) -> None:
    """A head promising 100 bytes, then 10 of them: 408 when the body deadline passes, and the server hears why."""
    http, rec, port = served
    with connect(port) as s:
        s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        reply = await asyncio.to_thread(read_all, s)
    assert reply.startswith(b"HTTP/1.1 408") and rec.answered == 0
    assert rec.refused == [("127.0.0.1", "body not received within 0.5 s")]
    await admitted(http, 0)


async def test_a_declared_body_over_the_limit_is_refused_unread(served: tuple[HttpTransport, Recorder, int]) -> None:
    """Content-Length of 300 MB and no body sent: 413 at once, not after a read or a deadline."""
    _http, rec, port = served
    with connect(port) as s:
        s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 300000000\r\n\r\n")
        reply = await asyncio.to_thread(read_all, s)
    assert reply.startswith(b"HTTP/1.1 413")
    assert rec.refused == [("127.0.0.1", "body of 300000000 bytes is over the 1000-byte limit")]


async def test_a_sender_still_sending_a_refused_body_reads_the_413(served: tuple[HttpTransport, Recorder, int]) -> None:
    """A client that sends a whole 3 MB body past the limit sees the 413 (drained, not reset under it)."""
    _http, rec, port = served
    reply = await asyncio.to_thread(post, port, b"z" * 3_000_000)
    assert reply.startswith(b"HTTP/1.1 413")
    assert rec.refused == [("127.0.0.1", "body of 3000000 bytes is over the 1000-byte limit")]


@pytest.mark.parametrize("path", ["/v1", "/join", "/anything/else"])
async def test_the_body_bounds_hold_on_every_path(served: tuple[HttpTransport, Recorder, int], path: str) -> None:
    """The bounds are the server's, not one route's: a slow body to any path gets 408 before a 404."""
    _http, rec, port = served
    with connect(port) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b"x")
        reply = await asyncio.to_thread(read_all, s)
    assert reply.startswith(b"HTTP/1.1 408") and rec.refused == [("127.0.0.1", "body not received within 0.5 s")]


async def test_a_chunked_body_over_the_limit_is_cut_off(served: tuple[HttpTransport, Recorder, int]) -> None:
    """A chunked body (no length to judge up front) gets 413 once it passes the limit."""
    _http, rec, port = served
    chunk = b"%x\r\n%s\r\n" % (600, b"y" * 600)
    with connect(port) as s:
        s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2 + b"0\r\n\r\n")
        reply = await asyncio.to_thread(read_all, s)
    assert reply.startswith(b"HTTP/1.1 413") and rec.answered == 0
    assert rec.refused == [("127.0.0.1", "body over the 1000-byte limit")]


async def test_a_client_gone_mid_body_is_one_refusal_and_no_traceback(
        served: tuple[HttpTransport, Recorder, int], caplog: pytest.LogCaptureFixture) -> None:
    """Half a body, then a reset: the request is dropped as incomplete, with one refusal and no traceback."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    http, rec, port = served
    s = connect(port)
    s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
    s.close()
    await eventually(lambda: rec.refused, 10, "the refusal")
    assert len(rec.refused) == 1 and rec.refused[0][1].startswith("body incomplete (") and rec.answered == 0
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING]
    await admitted(http, 0)


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /v1 HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"POST /v1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
])
async def test_malformed_http_is_one_refusal_and_no_traceback(
        served: tuple[HttpTransport, Recorder, int], caplog: pytest.LogCaptureFixture, raw: bytes) -> None:
    """A request aiohttp cannot parse gets a 4xx (or a close) and exactly one refusal; nothing is logged with a traceback."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    http, rec, port = served
    with connect(port) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        reply = await asyncio.to_thread(read_all, s)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 4")
    assert rec.answered == 0 and len(rec.refused) == 1
    assert rec.refused[0][1].startswith("malformed HTTP (") and "\n" not in rec.refused[0][1]
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.WARNING]
    await admitted(http, 0)


async def test_a_keep_alive_connection_idle_past_the_head_deadline_is_closed(
        served: tuple[HttpTransport, Recorder, int]) -> None:
    """After a reply, a kept-alive connection must start its next request within the head deadline."""
    http, rec, port = served
    with connect(port) as s:
        s.sendall(b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        reply = await asyncio.to_thread(read_all, s)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"hi") and rec.answered == 1
    await admitted(http, 0)


def test_limits_follow_the_open_file_limit() -> None:
    """At 1,024 open files the peer port holds 256 connections, 32 per address; at 100, 25 and 6."""
    assert ServeLimits.for_open_files(1024) == ServeLimits(256, 32)
    assert ServeLimits.for_open_files(100) == ServeLimits(25, 6)
    # peer_connections_per_address sets the per-address cap, still within a quarter of the total
    assert ServeLimits.for_open_files(1024, per_source=8) == ServeLimits(256, 8)
    assert ServeLimits.for_open_files(1024, per_source=500) == ServeLimits(256, 64)


async def test_the_per_address_cap_comes_from_the_config() -> None:
    """A transport made with per_source=3 (the daemon passes peer_connections_per_address) holds
    three connections from one address and closes the fourth unanswered."""
    http = HttpTransport(max_body=1000, total=5, per_source=3)
    rec = Recorder()
    port = await http.listen(rec, "127.0.0.1", 0)
    try:
        assert http.limits is not None and http.limits.per_source == 3
        with held(port, ["127.0.0.2"] * 3):
            await admitted(http, 3)
            with connect(port, "127.0.0.2") as fourth:
                assert await asyncio.to_thread(read_all, fourth) == b""
            assert rec.refused == [("127.0.0.2", "too many connections from this address")]
    finally:
        await http.close()
