"""The transports carry bodies and name every failure: real aiohttp on 127.0.0.1, and in memory."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from peerd.errors import DaemonError, TransportError
from peerd.transport import Answer, HttpTransport, MemoryNetwork
from tests.daemons import free_ports


class Echo:
    """A server that answers with its request body (or a 403 for b"deny"), and notes refusals."""

    def __init__(self, reply_size: int = 0) -> None:
        self.reply_size = reply_size
        self.seen: list[tuple[bytes, str]] = []
        self.refused: list[tuple[str, str]] = []

    async def answer(self, body: bytes, remote: str) -> Answer:
        self.seen.append((body, remote))
        if body == b"deny":
            return Answer(403, b"not sealed with this fleet's key")
        return Answer(200, b"x" * self.reply_size if self.reply_size else body)

    def refuse(self, remote: str, why: str) -> None:
        self.refused.append((remote, why))


@pytest.fixture
async def http() -> AsyncIterator[HttpTransport]:
    transport = HttpTransport(max_body=1000, total=5)
    try:
        yield transport
    finally:
        await transport.close()


async def test_a_body_goes_there_and_back_over_http(http: HttpTransport) -> None:
    """post carries the body to the server's answer and brings back status, body and the Date header."""
    server = Echo()
    port = await http.listen(server, "127.0.0.1", 0)
    answer = await http.post(f"127.0.0.1:{port}", b"hello")
    assert (answer.status, answer.body) == (200, b"hello") and answer.date
    assert server.seen == [(b"hello", "127.0.0.1")]


async def test_a_refusal_is_plain_text_and_everything_else_is_binary(http: HttpTransport) -> None:
    """A 403 goes out as text/plain (the one unsealed reply); a 200 as application/octet-stream."""
    port = await http.listen(Echo(), "127.0.0.1", 0)
    async with aiohttp.ClientSession() as plain:
        async with plain.post(f"http://127.0.0.1:{port}/v1", data=b"deny") as resp:
            assert resp.status == 403 and resp.content_type == "text/plain"
            assert await resp.text() == "not sealed with this fleet's key"
        async with plain.post(f"http://127.0.0.1:{port}/v1", data=b"ok") as resp:
            assert resp.content_type == "application/octet-stream"


async def test_an_oversized_request_is_refused_with_413_and_reported(http: HttpTransport) -> None:
    """A request over max_body never reaches answer: 413 (on its Content-Length, unread), and the server hears why."""
    server = Echo()
    port = await http.listen(server, "127.0.0.1", 0)
    answer = await http.post(f"127.0.0.1:{port}", b"y" * 1001)
    assert answer.status == 413 and server.seen == []
    assert server.refused == [("127.0.0.1", "body of 1001 bytes is over the 1000-byte limit")]


async def test_an_oversized_reply_fails_the_request(http: HttpTransport) -> None:
    """A reply over max_body is a TransportError of kind too-large."""
    port = await http.listen(Echo(reply_size=5000), "127.0.0.1", 0)
    with pytest.raises(TransportError, match="over the 1000-byte limit") as caught:
        await http.post(f"127.0.0.1:{port}", b"small")
    assert caught.value.kind == "too-large" and caught.value.peer == f"127.0.0.1:{port}"


async def test_nothing_listening_and_silence_are_named(http: HttpTransport) -> None:
    """A closed port is 'refused'; a port that accepts and never answers is 'timeout'."""
    (closed,) = free_ports(1)
    with pytest.raises(TransportError, match="cannot reach") as refused:
        await http.post(f"127.0.0.1:{closed}", b"x")
    assert refused.value.kind == "refused"
    quick = HttpTransport(max_body=1000, total=0.3)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        try:
            with pytest.raises(TransportError, match="no answer in time") as slow:
                await quick.post(f"127.0.0.1:{silent.getsockname()[1]}", b"x")
        finally:
            await quick.close()
    assert slow.value.kind == "timeout"


async def test_a_taken_port_is_a_clear_error(http: HttpTransport) -> None:
    """listen on a port in use raises DaemonError naming it and the way out."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(DaemonError, match=rf"cannot listen for peers on 127.0.0.1:{port}: .*--port"):
            await http.listen(Echo(), "127.0.0.1", port)


async def test_the_memory_network_routes_by_address_until_closed() -> None:
    """In memory: a post reaches the server listening at that address, with the caller's host; once
    the server's transport closes, the address refuses."""
    net = MemoryNetwork()
    a, b = net.transport("10.0.0.1"), net.transport("10.0.0.2")
    server = Echo()
    port = await b.listen(server, "0.0.0.0", 0)
    await a.listen(Echo(), "0.0.0.0", 0)
    assert (await a.post(f"10.0.0.2:{port}", b"hi")).body == b"hi"
    assert server.seen == [(b"hi", "10.0.0.1")] and [p.dst for p in net.posts] == [f"10.0.0.2:{port}"]
    with pytest.raises(DaemonError, match="already in use"):
        await net.transport("10.0.0.2").listen(Echo(), "0.0.0.0", port)
    await b.close()
    with pytest.raises(TransportError) as caught:
        await a.post(f"10.0.0.2:{port}", b"hi")
    assert caught.value.kind == "refused"
