"""The fenced code blocks of peerd's docs, and what the doc-example runner does with each: pure functions.

Rules every block of README.md and docs/*.md keeps (``tests/test_docs_examples.py`` enforces them):

- Every fence names its language. ``sh``/``bash`` blocks run as shell scripts, ``console`` blocks
  run command by command with their shown output checked, ``python`` blocks run in one Python
  session per doc; ``json``, ``toml`` and ``ini`` blocks must parse, and the MCP client
  configurations among them are also started as MCP servers (stdio) or connected to (HTTP, with
  ``<name>`` values such as ``<local-port>`` filled in, and the role they bind checked); ``text``
  blocks are shown, never run. A bare ``peerd mcp`` command is a server: the runner connects to it.
  A block of ``claude mcp add``, ``gemini mcp add`` and ``qwen mcp add`` lines is a client
  configuration too: the runner starts or connects to each server they add, as their client would.
  ``peerd codex-wake`` runs beside the rest of the doc until it ends (its shown output awaited).
  A block whose first line starts with ``$ `` must be ``console`` (shown output is always checked).
- A marker on the line right before the fence changes that: ``<!-- doc-test: skip (reason) -->``
  leaves the block out (the reason is listed), ``<!-- doc-test: on=NAME -->`` runs it on machine
  NAME (each machine is a network namespace with its own home; the first block's machine is
  ``main`` unless named), ``in=clone`` runs it in the checkout instead of the machine's scratch
  folder. Options combine: ``<!-- doc-test: on=beta in=clone -->``.
- Shown output (``console``): each ``$ command`` line is followed by what it prints (stderr and
  stdout as a terminal shows them). In the shown output ``...`` alone on a line stands for any
  lines (or none), ``...`` inside a line for any text; a run of spaces matches any run of spaces
  (tables line up differently with other values); ``<name>`` (lower case, digits, ``-``) stands for
  one word that varies (an id, a port, a time) and remembers it: a later ``<name>`` in shown output
  must be the same word, and ``<name>`` in a later command is replaced by it. Commands must exit 0.
- In commands and configurations, ``/path/to/peerd`` stands for the clone and ``/home/me`` for the
  user's home folder.
- HTTP configurations carry the local port's token as their client does: ``mcp add`` lines are
  read as the shell reads them (``--header "Authorization: Bearer $(cat ...)"`` runs the ``cat``);
  a Codex ``bearer_token_env_var`` (or ``env_http_headers``) names a variable the reader sets before
  starting Codex, as the doc says: the runner gives ``PEERD_TOKEN``, the one the docs name, the
  content of the machine's default home's ``local.token``; JSON configurations show ``<local-token>``,
  which shown output binds like any ``<name>``.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

RUN_LANGS = frozenset({"sh", "bash", "console", "python"})
PARSED_LANGS = frozenset({"json", "toml", "ini"})
SHOWN_LANGS = frozenset({"text"})
LANGS = RUN_LANGS | PARSED_LANGS | SHOWN_LANGS

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
_SKIP = re.compile(r"^skip\s*\((.+)\)$")
_OPTION = re.compile(r"^(on|in)=([\w-]+)$")
PLACEHOLDER = re.compile(r"<([a-z][a-z0-9-]*)>")
_LINE_TOKEN = re.compile(r"(<[a-z][a-z0-9-]*>|\.\.\.|\s+)")
CLONE, HOME = "/path/to/peerd", "/home/me"


class DocError(ValueError):
    """A doc block breaks one of the rules above (the message names file and line)."""


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text and the marker before it (if any)."""

    path: str
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    skip: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def machine(self) -> str:
        return self.options.get("on", "main")


def parse_marker(text: str, where: str) -> tuple[str | None, dict[str, str]]:
    """``skip (reason)`` or ``on=NAME in=clone`` -> (skip reason, options)."""
    skip = _SKIP.match(text)
    if skip:
        return skip.group(1).strip(), {}
    options: dict[str, str] = {}
    for word in text.split():
        option = _OPTION.match(word)
        if option is None:
            raise DocError(f"{where}: unknown doc-test marker {word!r} (skip (reason), on=NAME, in=clone)")
        options[option.group(1)] = option.group(2)
    if options.get("in", "clone") != "clone":
        raise DocError(f"{where}: in= takes only 'clone'")
    return None, options


def blocks(path: str, text: str) -> list[Block]:
    """Every fenced block of a markdown text, with the marker on the line before its fence."""
    lines = text.split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        indent, mark, lang = fence.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(mark)), None)
        if end is None:
            raise DocError(f"{path}:{i + 1}: fence never closed")
        body = "\n".join(line.removeprefix(indent) for line in lines[i + 1:end])
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        skip, options = parse_marker(marker.group(1), f"{path}:{i}") if marker else (None, {})
        found.append(Block(path, i + 1, lang, body + "\n", skip, options))
        i = end + 1
    return found


def check_block(block: Block) -> None:
    """Raise ``DocError`` when a block has no decision the runner can honour."""
    if block.lang not in LANGS:
        raise DocError(f"{block.where}: fence needs a language, one of {', '.join(sorted(LANGS))} "
                       f"(got {block.lang!r}); use text for what is only shown")
    if block.body.startswith("$ ") and block.lang != "console":
        raise DocError(f"{block.where}: a block of $ commands must be console, so its output is checked")
    if block.skip is None and block.options and block.lang not in RUN_LANGS:
        raise DocError(f"{block.where}: on=/in= only apply to blocks that run")


# -- shell ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command of a console block and the output shown after it."""

    text: str
    shown: tuple[str, ...]


def logical_lines(body: str) -> list[str]:
    """Lines with backslash continuations joined."""
    out: list[str] = []
    pending = ""
    for line in body.split("\n"):
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def console_commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, each with the lines shown after it."""
    commands: list[Command] = []
    text: str | None = None
    shown: list[str] = []
    for line in logical_lines(block.body.rstrip("\n")):
        if line.startswith("$ "):
            if text is not None:
                commands.append(Command(text, tuple(shown)))
            text, shown = line[2:], []
        elif text is None:
            raise DocError(f"{block.where}: a console block starts with a $ command")
        else:
            shown.append(line)
    if text is not None:
        commands.append(Command(text, tuple(shown)))
    return commands


def strip_comment(line: str) -> str:
    """A shell line without its trailing ``# comment`` (quotes respected)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


_DAEMON = re.compile(r"^(uv run (--directory \S+ )?)?peerd run\b")
_WAITS = re.compile(r"^(uv run (--directory \S+ )?)?peerd join\b.*--lan\b")
_SERVES = re.compile(r"^(uv run (--directory \S+ )?)?peerd mcp\b")
_FOLLOWS = re.compile(r"^(uv run (--directory \S+ )?)?peerd codex-wake\b")
_SHELL_OPERATORS = re.compile(r"[|;<>]|&&")


def long_running(command: str) -> str | None:
    """``daemon`` for ``peerd run`` (with or without ``&``), ``waits`` for ``peerd join --lan``
    (it waits for another machine's approval), ``serves`` for a bare ``peerd mcp`` (an MCP server
    that runs until its client leaves), ``follows`` for ``peerd codex-wake`` (it runs beside the
    reader's agents until stopped), None for a command that finishes by itself."""
    bare = strip_comment(command).removesuffix("&").strip()
    if _DAEMON.match(bare):
        return "daemon"
    if _FOLLOWS.match(bare):
        return "follows"
    if _WAITS.match(bare):
        return "waits"
    if _SERVES.match(bare) and not _SHELL_OPERATORS.search(bare):
        return "serves"
    return None


_HTTP_FLAG = re.compile(r"--transport(\s+|=)http\b")


def serves_http(command: str) -> bool:
    """Whether a ``serves`` command is an MCP server over HTTP (else stdio)."""
    return _HTTP_FLAG.search(command) is not None


_SERVING = re.compile(r"^peerd mcp: serving MCP at (http://\S+)$")
_TOKEN_LINE = re.compile(r"^peerd mcp: clients send the header Authorization: Bearer (<the content of (.+)>|\S+)$")


def serving_url(lines: Sequence[str]) -> str | None:
    """The URL an HTTP ``peerd mcp`` announces once it listens, or None before then."""
    return next((m.group(1) for m in map(_SERVING.match, lines) if m), None)


def serving_token(lines: Sequence[str]) -> tuple[str, str] | None:
    """What an HTTP ``peerd mcp`` says its clients send (the line before its URL): ``("file", PATH)``
    for a token kept in a file, ``("token", TOKEN)`` for one in memory only; None if it said nothing."""
    for m in map(_TOKEN_LINE.match, lines):
        if m:
            return ("file", m.group(2)) if m.group(2) is not None else ("token", m.group(1))
    return None


@dataclass(frozen=True)
class Segment:
    """A piece of a sh block: a script run to its end, or one long-running command."""

    script: str
    kind: str | None  # None, or what ``long_running`` says


def shell_segments(body: str) -> list[Segment]:
    """A sh block cut at its long-running commands, which the runner starts and waits on itself."""
    segments: list[Segment] = []
    script: list[str] = []
    for line in logical_lines(body.rstrip("\n")):
        kind = long_running(line)
        if kind is None:
            script.append(line)
            continue
        if any(s.strip() and not s.strip().startswith("#") for s in script):
            segments.append(Segment("\n".join(script), None))
        script = []
        segments.append(Segment(strip_comment(line).removesuffix("&").strip(), kind))
    if any(s.strip() and not s.strip().startswith("#") for s in script):
        segments.append(Segment("\n".join(script), None))
    return segments


def substitute(text: str, bound: Mapping[str, str], paths: Mapping[str, str]) -> str:
    """``<name>`` replaced by what shown output bound it to; the stand-in paths by real ones."""
    for stand_in, real in paths.items():
        text = text.replace(stand_in, real)

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in bound:
            raise DocError(f"<{name}> is used before any shown output gave it a value")
        return bound[name]

    return PLACEHOLDER.sub(value, text)


# -- shown output -----------------------------------------------------------------------------------


def _line_pattern(line: str, bound: Mapping[str, str], fresh: list[str]) -> re.Pattern[str]:
    parts: list[str] = []
    for token in _LINE_TOKEN.split(line.strip()):
        if not token:
            continue
        if token == "...":
            parts.append(".*?")
        elif token.isspace():
            parts.append(r"\s+")
        elif PLACEHOLDER.fullmatch(token):
            name = token[1:-1]
            if name in bound:
                parts.append(re.escape(bound[name]))
            elif name in fresh:
                parts.append(f"(?P={_group(name)})")
            else:
                fresh.append(name)
                parts.append(f"(?P<{_group(name)}>[^\\s]+?)")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts))


def _group(name: str) -> str:
    return "p_" + name.replace("-", "_")


def _trim(lines: Iterable[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    while out and not out[0]:
        out.pop(0)
    return out


def match_output(shown: Sequence[str], actual: Sequence[str], bound: Mapping[str, str]) -> dict[str, str] | None:
    """The placeholders ``shown`` binds when it matches ``actual`` line by line, or None.

    A placeholder that appears on several shown lines must be the same word on each."""
    want, have = _trim(shown), _trim(actual)
    return _match_from(want, have, dict(bound))


def _match_from(want: list[str], have: list[str], bound: dict[str, str]) -> dict[str, str] | None:
    if not want:
        return bound if not have else None
    head, rest = want[0], want[1:]
    if head.strip() == "...":
        for skip in range(len(have) + 1):
            found = _match_from(rest, have[skip:], bound)
            if found is not None:
                return found
        return None
    if not have:
        return None
    fresh: list[str] = []
    matched = _line_pattern(head, bound, fresh).fullmatch(have[0].strip())
    if matched is None:
        return None
    more = {name: matched.group(_group(name)) for name in fresh}
    return _match_from(rest, have[1:], {**bound, **more})


def find_output(shown: Sequence[str], actual: Sequence[str], bound: Mapping[str, str]) -> dict[str, str] | None:
    """Like ``match_output`` but ``shown`` may sit anywhere in ``actual`` (a long-running command's
    output so far, among its log lines)."""
    return match_output(["...", *_trim(shown), "..."], actual, bound)


# -- MCP client configurations ----------------------------------------------------------------------


@dataclass(frozen=True)
class StdioServer:
    """An MCP server a client configuration starts: its name, command and arguments."""

    client: str
    name: str
    command: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class HttpServer:
    """An MCP server a client configuration reaches over HTTP: its URL and the headers it sends."""

    client: str
    name: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def role(self) -> str | None:
        """The role the session binds to: the X-Peerd-Role header, else the URL's ``role=``."""
        for key, value in self.headers:
            if key.lower() == "x-peerd-role":
                return value
        query = parse_qs(urlsplit(self.url).query)
        return query["role"][0] if "role" in query else None


Server = StdioServer | HttpServer


def _http_server(client: str, name: str, url: Any, headers: Any, where: str) -> HttpServer:
    if not str(url).startswith("http://"):
        raise DocError(f"{where}: {client} server {name}: url must be an http URL")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise DocError(f"{where}: {client} server {name}: headers must map names to strings")
    return HttpServer(client, name, str(url), tuple(headers.items()))


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise DocError(f"{where}: args must be a list of strings")
    return tuple(value)


def json_servers(text: str, where: str) -> list[Server]:
    """The servers of a JSON block (``mcpServers.<name>.command/args``, or ``url`` and ``headers``
    for HTTP); [] if it configures none."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocError(f"{where}: not JSON: {exc}") from None
    servers: list[Server] = []
    for name, spec in (data.get("mcpServers") or {}).items() if isinstance(data, dict) else ():
        if not isinstance(spec, dict):
            raise DocError(f"{where}: mcpServers.{name} must be an object")
        if "url" in spec or "httpUrl" in spec:  # httpUrl: Gemini CLI's and Qwen Code's streamable HTTP
            servers.append(_http_server("json", name, spec.get("httpUrl", spec.get("url")), spec.get("headers", {}),
                                        where))
            continue
        if not isinstance(spec.get("command"), str):
            raise DocError(f"{where}: mcpServers.{name} needs a command (and args)")
        servers.append(StdioServer("json", name, spec["command"], _str_list(spec.get("args", []), where)))
    return servers


def toml_servers(text: str, where: str) -> list[Server]:
    """The servers of a Codex ``config.toml`` block (``[mcp_servers.<name>]`` command/args, or
    ``url`` and ``http_headers``; ``bearer_token_env_var`` and ``env_http_headers`` become headers whose
    value names the variable as ``${NAME}``, as Codex fills them in from its environment)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DocError(f"{where}: not TOML: {exc}") from None
    servers: list[Server] = []
    for name, spec in (data.get("mcp_servers") or {}).items():
        if "url" in spec:
            headers = {**spec.get("http_headers", {}),
                       **{k: f"${{{v}}}" for k, v in spec.get("env_http_headers", {}).items()}}
            if "bearer_token_env_var" in spec:
                headers["Authorization"] = f"Bearer ${{{spec['bearer_token_env_var']}}}"
            servers.append(_http_server("codex", name, spec["url"], headers, where))
            continue
        if not isinstance(spec.get("command"), str):
            raise DocError(f"{where}: [mcp_servers.{name}] needs command (and args)")
        servers.append(StdioServer("codex", name, spec["command"], _str_list(spec.get("args", []), where)))
    return servers


def check_ini(text: str, where: str) -> None:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise DocError(f"{where}: not an INI file: {exc}") from None


_CLIENT_ADD = re.compile(r"^(claude|gemini|qwen) mcp add\b")


def client_servers(body: str, where: str,
                   words_of: Callable[[str], list[str]] = shlex.split) -> list[Server] | None:
    """The servers of a block of ``claude mcp add``, ``gemini mcp add`` and ``qwen mcp add`` lines,
    or None if it has other commands.

    ``claude mcp add [--scope S] [--transport http NAME URL --header H...] NAME -- COMMAND ARGS...``;
    ``gemini|qwen mcp add [--scope S] [--transport http] NAME COMMAND|URL [ARGS...] [--header H...]``
    (their own options may come anywhere; any other word after NAME is the command or one of its
    arguments, in order). ``words_of`` splits a line into words (the runner's expands them as the
    user's shell would)."""
    servers: list[Server] = []
    lines = [strip_comment(line) for line in logical_lines(body)]
    commands = [line for line in lines if line]
    if not commands or not all(_CLIENT_ADD.match(line) for line in commands):
        return None
    for line in commands:
        words = words_of(line)
        client, words = words[0], words[3:]
        if client != "claude":
            servers.append(_yargs_server(client, words, where))
            continue
        if "--" not in words:
            options, positional = _claude_options(words, where)
            if options.get("--transport") != "http" or len(positional) != 2 or not positional[1].startswith("http://"):
                raise DocError(f"{where}: claude mcp add without -- must be --transport http NAME URL")
            servers.append(_http_server("claude", positional[0], positional[1], _claude_headers(options, where), where))
            continue
        cut = words.index("--")
        options, positional = _claude_options(words[:cut], where)
        if len(positional) != 1 or len(words) <= cut + 1:
            raise DocError(f"{where}: claude mcp add [options] NAME -- COMMAND ARGS...")
        servers.append(StdioServer("claude", positional[0], words[cut + 1], tuple(words[cut + 2:])))
    return servers


claude_servers = client_servers  # the name the runner first knew it by

_CLAUDE_VALUED = frozenset({"--scope", "-s", "--transport", "-t", "--header", "-H", "--env", "-e"})
_CLAUDE_REPEATED = frozenset({"--header", "-H", "--env", "-e"})
# Gemini CLI's and Qwen Code's own options of ``mcp add`` (yargs; they may come anywhere in the line).
_YARGS_VALUED = frozenset({"--scope", "-s", "--transport", "-t", "--type", "--header", "-H", "--env", "-e",
                           "--timeout", "--description", "--include-tools", "--exclude-tools"})
_YARGS_FLAGS = frozenset({"--trust", "--debug", "-d"})


def _claude_options(words: list[str], where: str) -> tuple[dict[str, str], list[str]]:
    """Options (a repeated one's values joined by newlines) and positional words."""
    options: dict[str, str] = {}
    positional: list[str] = []
    it = iter(words)
    for word in it:
        if word.startswith("-"):
            if word not in _CLAUDE_VALUED:
                raise DocError(f"{where}: claude mcp add has no option {word}")
            value = next(it, "")
            options[word] = options[word] + "\n" + value if word in _CLAUDE_REPEATED and word in options else value
        else:
            positional.append(word)
    return options, positional


def _yargs_server(client: str, words: list[str], where: str) -> Server:
    """A ``gemini mcp add`` or ``qwen mcp add`` line's server (its words after ``mcp add``)."""
    options: dict[str, str] = {}
    rest: list[str] = []
    it = iter(words)
    for word in it:
        if word in _YARGS_VALUED:
            value = next(it, "")
            options[word] = options[word] + "\n" + value if word in ("--header", "-H") and word in options else value
        elif word.startswith("-") and not rest and word not in _YARGS_FLAGS:
            raise DocError(f"{where}: {client} mcp add has no option {word}")
        elif word not in _YARGS_FLAGS:
            rest.append(word)
    if len(rest) < 2:
        raise DocError(f"{where}: {client} mcp add [options] NAME COMMAND|URL [ARGS...]")
    transport = options.get("--transport") or options.get("-t") or options.get("--type")
    if transport == "http" or (transport is None and rest[1].startswith("http://")):
        if len(rest) != 2 or not rest[1].startswith("http://"):
            raise DocError(f"{where}: {client} mcp add --transport http NAME URL [--header H...]")
        return _http_server(client, rest[0], rest[1], _claude_headers(options, where), where)
    return StdioServer(client, rest[0], rest[1], tuple(rest[2:]))


def _claude_headers(options: Mapping[str, str], where: str) -> dict[str, str]:
    """The ``--header 'Name: value'`` options (``-H`` too), in order."""
    headers: dict[str, str] = {}
    for flag in ("--header", "-H"):
        for header in options[flag].split("\n") if flag in options else ():
            key, sep, value = header.partition(":")
            if not sep:
                raise DocError(f"{where}: mcp add --header takes 'Name: value'")
            headers[key.strip()] = value.strip()
    return headers
