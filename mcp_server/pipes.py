"""stdin and stdout as pipes on the event loop, for the SDK's stdio server to read and write.

The SDK's own stdio transport reads each line and writes each answer through a worker thread
(``anyio.wrap_file``): two thread hand-offs per call, about a quarter of a bare SDK server's
stdio call. ``loop_stdio`` gives the SDK's ``stdio_server`` a line reader and a
writer on the event loop instead; the SDK still parses every line and writes every message, so
what a client sees on the wire is unchanged.

Invariants:
* Used only when fd 0 and fd 1 are both pipes or sockets (how an MCP client spawns a server).
  A terminal or a file gets ``None`` and the SDK's own transport: making a terminal
  non-blocking would leak to the shell that shares it.
* While serving, fd 0 reads the null device and fd 1 writes to stderr, as the SDK's transport
  arranges: stray output of this process or of its children cannot tear the wire. The pipes
  themselves are non-blocking meanwhile (an MCP client gives each server pipes of its own); at
  the end fd 0 and 1 are the wire again, blocking.
* A line is everything up to ``\\n``, of any length (the last one may lack it), decoded as
  UTF-8 with invalid bytes replaced, as the SDK decodes: a line it cannot parse reaches
  ``stdioguard`` exactly as through the SDK's transport. End of input ends the lines.
* ``flush`` returns once the pipe has taken what was written (or the client went away, which
  raises as a write to a closed pipe does through the SDK's transport).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

CHUNK = 1 << 16  # bytes read from stdin at a time


class Lines:
    """The lines of a pipe, as ``async for line in ...`` gives them (``str``, each with its ``\\n``)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buf = bytearray()
        self._scanned = 0  # bytes of ``_buf`` known to hold no newline

    def __aiter__(self) -> Lines:
        return self

    async def __anext__(self) -> str:
        while (end := self._buf.find(b"\n", self._scanned)) < 0:
            self._scanned = len(self._buf)
            chunk = await self._reader.read(CHUNK)
            if not chunk:
                if not self._buf:
                    raise StopAsyncIteration
                end = len(self._buf) - 1  # the last line, without its newline
                break
            self._buf += chunk
        line = bytes(self._buf[:end + 1])
        del self._buf[:end + 1]
        self._scanned = 0
        return line.decode("utf-8", "replace")


class Output:
    """What the SDK's stdio writer needs of stdout: ``write`` a message, then ``flush``."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _writer_protocol() -> asyncio.StreamReaderProtocol:
    """A protocol with the flow control ``StreamWriter.drain`` needs (nothing is read back)."""
    return asyncio.StreamReaderProtocol(asyncio.StreamReader())


def _divert(fd: int, to: int) -> None:
    """Point ``fd`` where ``to`` points, and close ``to``."""
    try:
        os.dup2(to, fd)
    finally:
        os.close(to)


def _dup(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)  # never in the standard range


@asynccontextmanager
async def loop_stdio() -> AsyncIterator[tuple[Lines, Output] | None]:
    """stdin's lines and stdout on the event loop while the block runs, or ``None`` when either
    is not a pipe or a socket (then the caller uses the SDK's transport)."""
    if not (_is_pipe(0) and _is_pipe(1)):
        yield None
        return
    keep_in, keep_out = _dup(0), _dup(1)  # the wire, to put back at the end
    read_file = os.fdopen(_dup(0), "rb", buffering=0)  # the wire, for the transports (they close these)
    write_file = os.fdopen(_dup(1), "wb", buffering=0)
    _divert(0, os.open(os.devnull, os.O_RDONLY))
    try:
        _divert(1, os.dup(2))
    except OSError:  # no stderr to send stray output to
        _divert(1, os.open(os.devnull, os.O_WRONLY))
    loop = asyncio.get_running_loop()
    read_transport: asyncio.BaseTransport | None = None
    output: Output | None = None
    try:
        reader = asyncio.StreamReader(limit=CHUNK)
        read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), read_file)
        transport, protocol = await loop.connect_write_pipe(_writer_protocol, write_file)
        output = Output(asyncio.StreamWriter(transport, protocol, None, loop))
        yield Lines(reader), output
    finally:
        if output is not None:
            output.close()
        else:
            write_file.close()  # no transport took it
        if read_transport is not None:
            read_transport.close()
        else:
            read_file.close()
        for fd, kept in ((0, keep_in), (1, keep_out)):
            with contextlib.suppress(OSError):
                os.set_blocking(kept, True)  # the transports made the shared description non-blocking
                os.dup2(kept, fd)
            os.close(kept)
