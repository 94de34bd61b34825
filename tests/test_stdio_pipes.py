"""stdin and stdout on the event loop (``mcp_server.pipes``): the wire as the SDK's own transport
gives it, over real pipes, a pseudo-terminal and a regular file, in real subprocesses."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest

from replica import open_home

REPO = Path(__file__).resolve().parent.parent

ECHO = """
import asyncio, os, sys
from mcp_server.pipes import loop_stdio

async def main():
    async with loop_stdio() as pipes:
        if pipes is None:
            print("sdk transport", file=sys.stderr, flush=True)
            return
        lines, out = pipes
        os.write(1, b"stray\\n")  # fd 1 goes to stderr while the wire is claimed
        async for line in lines:
            await out.write("echo " + line)
            await out.flush()
    os.write(1, f"restored {os.get_blocking(0)} {os.get_blocking(1)}\\n".encode())

asyncio.run(main())
"""


def _echo(**kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", ECHO], cwd=REPO, stderr=subprocess.PIPE, **kw)


def test_lines_of_a_pipe_come_whole_and_decoded_and_fd_1_is_not_the_wire_meanwhile() -> None:
    """Lines split across writes, several in one write, invalid UTF-8 (replaced) and a last line
    without its newline each come out whole; a stray write to fd 1 lands on stderr; at the end fd 0
    and 1 are the wire again, blocking."""
    with _echo(stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b"a\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"echo a\n"
        proc.stdin.write(b"half ")
        proc.stdin.flush()
        proc.stdin.write(b"and half\nx\ny\n\xff\xfe caf\xc3\xa9\nlast")
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()
        assert proc.wait(timeout=60) == 0
    assert out.decode() == ("echo half and half\necho x\necho y\necho \ufffd\ufffd café\necho last"
                            "restored True True\n")
    assert err == b"stray\n"


def test_a_terminal_on_stdin_is_left_to_the_sdk_transport() -> None:
    """A terminal is never made non-blocking: ``loop_stdio`` steps aside."""
    leader, follower = pty.openpty()
    try:
        proc = _echo(stdin=follower, stdout=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert proc.returncode == 0 and out == b"" and err == b"sdk transport\n"


INIT = {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "pipes", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _line(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg).encode() + b"\n"


def _server(home: Path, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "mcp_server", "--home", str(home), "--role", "pipes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_a_request_line_of_megabytes_is_read_whole_and_answered(home: Path) -> None:
    """No line length limit, as through the SDK's transport: a ping carrying 8 MB is answered,
    and so is the request after it."""
    with _server(home, stdin=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_line(INIT))
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == "init"
        proc.stdin.write(_line(INITIALIZED))
        proc.stdin.write(_line({"jsonrpc": "2.0", "id": "big", "method": "ping", "params": {"pad": "x" * 8_000_000}}))
        proc.stdin.write(_line({"jsonrpc": "2.0", "id": "after", "method": "tools/list"}))
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    assert [a["id"] for a in answers] == ["big", "after"] and "result" in answers[0]
    assert any(t["name"] == "send_message" for t in answers[1]["result"]["tools"])


@pytest.mark.parametrize("stdin_kind", ["pipe", "terminal"])
def test_requests_are_answered_on_a_pipe_and_on_a_terminal(home: Path, stdin_kind: str) -> None:
    """Through peerd's transport (a pipe) and the SDK's (``peerd mcp`` typed at in a terminal) the
    same requests get the same answers, and end of input ends the server cleanly."""
    if stdin_kind == "terminal":
        leader, follower = pty.openpty()
        attrs = termios.tcgetattr(follower)
        attrs[3] &= ~termios.ECHO  # the terminal would echo what is typed back to the leader
        termios.tcsetattr(follower, termios.TCSANOW, attrs)
        proc = _server(home, stdin=follower)
        os.close(follower)

        def type_(data: bytes) -> None:
            os.write(leader, data)

        def end() -> None:
            os.write(leader, b"\x04")  # ^D at the start of a line: end of input
    else:
        proc = _server(home, stdin=subprocess.PIPE)
        assert proc.stdin is not None
        pipe = proc.stdin

        def type_(data: bytes) -> None:
            pipe.write(data)
            pipe.flush()

        def end() -> None:
            pipe.close()
    assert proc.stdout is not None and proc.stderr is not None
    with proc:
        try:
            answers = []
            for msg in (INIT, INITIALIZED, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": "send_message", "arguments": {"from": "pipes", "channel": "peer",
                                                          "content": "over a " + stdin_kind}}},
                        {"jsonrpc": "2.0", "id": 2, "method": "ping"}):
                type_(_line(msg))
                if "id" in msg:
                    answers.append(json.loads(proc.stdout.readline()))
            end()
            assert proc.wait(timeout=60) == 0, proc.stderr.read().decode(errors="replace")
        finally:
            if stdin_kind == "terminal":
                os.close(leader)
    assert [a["id"] for a in answers] == ["init", 1, 2]
    sent = answers[1]["result"]["structuredContent"]
    assert sent["from"] == "pipes" and sent["unknownRecipients"] == ["peer"]
    with open_home(home) as rep:
        assert [m.content for m in rep.message_log().messages] == ["over a " + stdin_kind]
