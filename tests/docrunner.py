"""Running a doc's blocks as a reader would type them: the I/O shell around ``tests.docblocks``.

Each doc runs on fresh machines: every machine is a network namespace of one ``NetnsLab`` LAN
(so the default ports 7733/7734 and mDNS are the doc's own), with its own home folder as ``HOME``
(so the default peerd home, ``~/.local/share/peerd``, is new) and a scratch working folder.
``peerd`` on PATH is this checkout's (the virtual environment's script, as an installed peerd);
``uv run peerd`` works in the clone. Python blocks run in one ``tests/docsession.py`` process per
machine. Long-running commands never block the doc: ``peerd run`` starts in the background and the
runner waits for its ready lines; ``peerd join --lan`` starts in the background, the runner waits
for the output the doc shows, and the next command on that machine first waits for it to finish.
A bare ``peerd mcp`` is an MCP server: over stdio the runner connects to it as a client and lists
its tools; over HTTP it waits for the line naming its URL, connects from inside the machine with
the token it names, and stops it. MCP client configurations are started (stdio) or connected to
(HTTP, on the doc's daemon, with the headers the client would send: ``claude``/``gemini``/``qwen
mcp add`` lines expanded by the machine's shell, Codex's token variable set as the doc tells the
reader) the same way. ``peerd codex-wake`` starts in the background like ``peerd run``; the runner
waits for the output the doc shows. Everything started is stopped when the doc ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from mcp import Client, StdioServerParameters

from tests import docblocks as db
from tests.netns import Lan, NetnsLab, Node
from tests.waiting import end_group, patience

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SESSION = Path(__file__).resolve().parent / "docsession.py"
PROBE = Path(__file__).resolve().parent / "docmcp.py"
CLIENT_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")  # what MCP clients pass a server by default
READY = "  stop "  # the last line of `peerd run`'s ready block
DEFAULT_TOKEN = ".local/share/peerd/local.token"  # in a machine's HOME: the default home's local secret
TOKEN_VARIABLE = "PEERD_TOKEN"  # the variable the docs tell a reader to hold that secret in
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class DocFailure(AssertionError):
    """A doc block did not do what the doc says."""


def _uv_dirs() -> dict[str, str]:
    """uv's cache and Python folders, kept when a machine gets a HOME of its own."""
    out: dict[str, str] = {}
    for var, args in (("UV_CACHE_DIR", ["cache", "dir"]), ("UV_PYTHON_INSTALL_DIR", ["python", "dir"])):
        done = subprocess.run(["uv", *args], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            out[var] = done.stdout.strip()
    return out


class Background:
    """A long-running command in a machine; a thread gathers its output lines."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, kind: str, text: str) -> None:
        self.kind, self.text = kind, text
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        with stream:
            for line in stream:
                with self.changed:
                    self.lines.append(line.rstrip("\n"))
                    self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, found: Any, what: str, seconds: float = 60) -> Any:
        """Block until ``found(lines)`` is not None; fail if the command ends first or patience runs out."""
        deadline = time.monotonic() + patience(seconds)
        with self.changed:
            while True:
                value = found(list(self.lines))
                if value is not None:
                    return value
                if self.proc.poll() is not None and not self.reader.is_alive():
                    raise DocFailure(f"{self.text!r} ended ({self.proc.returncode}) before {what}:\n" + self.out())
                if time.monotonic() >= deadline:
                    raise DocFailure(f"{self.text!r}: no {what} after {patience(seconds):.0f} s:\n" + self.out())
                self.changed.wait(0.5)

    def finish(self) -> None:
        """Wait for the command to end by itself; it must succeed."""
        try:
            self.proc.wait(timeout=patience(120))
        except subprocess.TimeoutExpired:
            raise DocFailure(f"{self.text!r} did not finish:\n{self.out()}") from None
        self.reader.join()
        if self.proc.returncode != 0:
            raise DocFailure(f"{self.text!r} failed ({self.proc.returncode}):\n{self.out()}")

    def stop(self) -> None:
        end_group(self.proc)
        self.reader.join(timeout=5)

    def out(self) -> str:
        return "\n".join(self.lines[-60:])


@dataclass
class Machine:
    """One simulated machine: a namespace, a HOME, a scratch folder, what runs there."""

    name: str
    node: Node
    root: Path
    env: dict[str, str]
    background: list[Background] = field(default_factory=list)
    python: subprocess.Popen[str] | None = None

    @property
    def work(self) -> Path:
        return self.root / "work"

    def settle(self) -> None:
        """What the reader waits for before typing on this machine again: a `join --lan` finishing."""
        for bg in self.background:
            if bg.kind == "waits" and bg.proc.returncode is None:
                bg.finish()


class DocRun:
    """The machines and remembered values of one doc while its blocks run in order."""

    def __init__(self, lab: NetnsLab, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.lan: Lan = lab.lan("docs")
        self.machines: dict[str, Machine] = {}
        self.bound: dict[str, str] = {}
        self.shims = tmp / "bin"
        self.shims.mkdir()
        (self.shims / "peerd").symlink_to(VENV_BIN / "peerd")
        self.uv = _uv_dirs()

    # -- machines ---------------------------------------------------------------------------------

    def machine(self, name: str) -> Machine:
        if name not in self.machines:
            root = self.tmp / name
            (root / "work").mkdir(parents=True)
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PEERD_", "XDG_", "VIRTUAL_ENV", "PYTEST", "COV_"))}
            env.update(self.uv)
            env.update(HOME=str(root), PATH=f"{self.shims}{os.pathsep}{env.get('PATH', '')}",
                       PYTHONUNBUFFERED="1", UV_OFFLINE="1", UV_PYTHON_DOWNLOADS="never", COLUMNS="200")
            self.machines[name] = Machine(name, self.lab.node(name, self.lan), root, env)
        return self.machines[name]

    def paths(self, m: Machine) -> dict[str, str]:
        return {db.CLONE: str(REPO), db.HOME: str(m.root)}

    def close(self) -> None:
        for m in self.machines.values():
            for bg in reversed(m.background):
                bg.stop()
            if m.python is not None:
                m.python.kill()
                m.python.wait()
                for stream in (m.python.stdin, m.python.stdout):
                    if stream is not None:
                        stream.close()

    # -- blocks -----------------------------------------------------------------------------------

    def run(self, block: db.Block) -> None:
        """Do what the doc says a block does; raise ``DocFailure`` naming the block if it does not."""
        try:
            self._run(block)
        except (DocFailure, db.DocError) as exc:
            raise DocFailure(f"{block.where} ({block.lang}): {exc}") from None

    def _run(self, block: db.Block) -> None:
        if block.skip is not None:
            return
        if block.lang in ("json", "toml"):
            self._config(block)
        elif block.lang == "ini":
            db.check_ini(block.body, block.where)
        elif block.lang == "python":
            self._python(self.machine(block.machine), block)
        elif block.lang == "console":
            m = self.machine(block.machine)
            for command in db.console_commands(block):
                self._command(m, block, command)
        elif block.lang in ("sh", "bash"):
            self._shell(block)

    def _cwd(self, m: Machine, block: db.Block) -> Path:
        return REPO if block.options.get("in") == "clone" else m.work

    def _argv(self, m: Machine, script: str) -> list[str]:
        return [*m.node.exec_prefix(), "bash", "-e", "-o", "pipefail", "-c", script]

    def _command(self, m: Machine, block: db.Block, command: db.Command, *, shows: bool = True) -> None:
        """Run one command (a console line, or a piece of a sh block, which shows no output)."""
        m.settle()
        text = db.substitute(command.text, self.bound, self.paths(m))
        kind = db.long_running(text)
        if kind is not None:
            self._start(m, block, db.strip_comment(text).removesuffix("&").strip(), kind, command.shown)
            return
        done = subprocess.run(self._argv(m, text), env=m.env, cwd=self._cwd(m, block), capture_output=False,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, timeout=patience(120), check=False)
        if done.returncode != 0:
            raise DocFailure(f"$ {text}\nexited {done.returncode}:\n{done.stdout}")
        if not shows:
            return
        found = db.match_output(command.shown, done.stdout.splitlines(), self.bound)
        if found is None:
            raise DocFailure(f"$ {text}\nshows:\n" + "\n".join(command.shown) + f"\nbut printed:\n{done.stdout}")
        self.bound.update(found)

    def _start(self, m: Machine, block: db.Block, text: str, kind: str, shown: tuple[str, ...]) -> None:
        if kind == "serves":
            self._mcp_command(m, block, text)
            return
        bg = Background(self._argv(m, f"exec {text}"), m.env, self._cwd(m, block), kind, text)
        m.background.append(bg)
        if shown:
            found = bg.wait_for(lambda lines: db.find_output(shown, lines, self.bound), "output the doc shows")
            self.bound.update(found)
        elif kind == "daemon":
            bg.wait_for(lambda lines: True if any(line.startswith(READY) for line in lines) else None,
                        "ready lines")
        else:
            raise db.DocError(f"{text!r} waits for another machine: show its output in a console block")

    def _shell(self, block: db.Block) -> None:
        m = self.machine(block.machine)
        servers = db.client_servers(block.body, block.where, lambda line: self._shell_words(m, line))
        if servers is not None:
            for server in servers:
                self._serve(m, server, block.where)
            return
        for segment in db.shell_segments(block.body):
            self._command(m, block, db.Command(segment.script, ()), shows=False)

    def _shell_words(self, m: Machine, line: str) -> list[str]:
        """The words of a command line as the machine's shell makes them (quotes, ``~``, ``$(...)``),
        with the doc's ``<name>`` values and stand-in paths filled in first."""
        text = db.substitute(line, self.bound, self.paths(m))
        done = subprocess.run(self._argv(m, f"printf '%s\\0' {text}"), env=m.env, cwd=m.work, capture_output=True,
                              text=True, timeout=patience(60), check=False)
        if done.returncode != 0:
            raise DocFailure(f"the shell cannot read {text!r}: {done.stderr}")
        return done.stdout.split("\0")[:-1]

    def _client_variable(self, m: Machine, name: str) -> str:
        """What a client's environment holds in ``name`` when the reader did as the doc says."""
        if name != TOKEN_VARIABLE:
            raise db.DocError(f"${{{name}}}: the docs name no such variable (only {TOKEN_VARIABLE})")
        return (m.root / DEFAULT_TOKEN).read_text().strip()

    def _python(self, m: Machine, block: db.Block) -> None:
        if m.python is None:
            log = open(m.root / "python.log", "w")  # noqa: SIM115 - the session outlives this call
            m.python = subprocess.Popen([*m.node.exec_prefix(), sys.executable, str(SESSION)], env=m.env,
                                        cwd=m.work, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        text=True)
            log.close()
        assert m.python.stdin is not None and m.python.stdout is not None
        code = db.substitute(block.body, {}, self.paths(m)) if db.CLONE in block.body else block.body
        m.python.stdin.write(json.dumps({"code": code, "where": block.where}) + "\n")
        m.python.stdin.flush()
        answer = m.python.stdout.readline()
        if not answer:
            raise DocFailure(f"the Python session ended:\n{(m.root / 'python.log').read_text()}")
        result = json.loads(answer)
        if not result["ok"]:
            raise DocFailure(result["error"])

    def _config(self, block: db.Block) -> None:
        parse = db.json_servers if block.lang == "json" else db.toml_servers
        for server in parse(block.body, block.where):
            self._serve(self.machine(block.machine), server, block.where)

    def _serve(self, m: Machine, server: db.Server, where: str) -> None:
        """Start a configuration's server as its client would (its command, its args, the client's
        usual environment), or connect to its URL with its headers, and ask it for its tools."""
        paths = self.paths(m)
        if isinstance(server, db.HttpServer):
            url = db.substitute(server.url, self.bound, paths)
            headers = {k: _VARIABLE.sub(lambda v: self._client_variable(m, v.group(1)),
                                        db.substitute(v, self.bound, paths)) for k, v in server.headers}
            self._probe(m, url, headers, server.role, f"{server.client} server {server.name} ({url})")
            return
        command = db.substitute(server.command, {}, paths)
        args = [db.substitute(a, {}, paths) for a in server.args]
        if server.client in ("claude", "gemini", "qwen"):  # `mcp add` is typed in a shell, which expands ~
            args = [str(m.root) + a[1:] if a == "~" or a.startswith("~/") else a for a in args]
        if command in ("peerd", "uv") and "mcp" in args and "--home" not in args:
            raise db.DocError(f"{where}: {server.client} config for {server.name} must pass --home "
                              "(MCP clients need not pass PEERD_HOME on)")
        env = {k: v for k, v in m.env.items() if k in CLIENT_ENV or k.startswith("UV_")}
        self._stdio(m, [command, *args], env, m.work, f"{server.client} server {server.name}")

    def _stdio(self, m: Machine, argv: list[str], env: dict[str, str], cwd: Path, what: str) -> None:
        """Connect to a stdio MCP server started in the machine as ``argv``; it must list peerd's tools."""
        prefix = m.node.exec_prefix()
        params = StdioServerParameters(command=prefix[0], args=[*prefix[1:], *argv], env=env, cwd=str(cwd))
        names = asyncio.run(asyncio.wait_for(_list_tools(params), patience(60)))
        if "send_message" not in names:
            raise DocFailure(f"{what} ({' '.join(argv)}) lists {names}")

    def _probe(self, m: Machine, url: str, headers: dict[str, str], role: str | None, what: str) -> None:
        """Connect to an MCP URL from inside the machine; it must list peerd's tools and, when the
        configuration binds a role, answer ``whoami`` with that role."""
        argv = [*m.node.exec_prefix(), sys.executable, str(PROBE), url,
                *(word for pair in headers.items() for word in pair)]
        done = subprocess.run(argv, env=m.env, cwd=m.work, capture_output=True, text=True,
                              timeout=patience(60), check=False)
        if done.returncode != 0:
            raise DocFailure(f"{what}: no MCP session:\n{done.stderr[-3000:]}")
        answer = json.loads(done.stdout)
        if "send_message" not in answer["tools"]:
            raise DocFailure(f"{what} lists {answer['tools']}")
        bound = (answer["whoami"] or {}).get("role")
        if role is not None and bound != role:
            raise DocFailure(f"{what}: the session is bound to {bound!r}, not {role!r}: {answer['whoami']}")

    def _mcp_command(self, m: Machine, block: db.Block, text: str) -> None:
        """A ``peerd mcp`` typed in a shell: connect to it as its client would."""
        if not db.serves_http(text):  # through the shell, which expands ~ and the like as typed
            self._stdio(m, ["bash", "-c", f"exec {text}"], m.env, self._cwd(m, block), text)
            return
        bg = Background(self._argv(m, f"exec {text}"), m.env, self._cwd(m, block), "serves", text)
        try:
            url = bg.wait_for(db.serving_url, "the line naming its URL")
            with bg.changed:
                said = db.serving_token(list(bg.lines))
            if said is None:
                raise DocFailure(f"{text}: it did not say what its clients send")
            kind, value = said
            token = Path(value).read_text().strip() if kind == "file" else value
            self._probe(m, url, {"Authorization": f"Bearer {token}"}, None, text)
        finally:
            bg.stop()


async def _list_tools(params: StdioServerParameters) -> list[str]:
    async with Client(params) as client:
        return [tool.name for tool in (await client.list_tools()).tools]
