"""The doc-example rules as pure functions: blocks, markers, shown output, client configurations."""

from __future__ import annotations

import shlex

import pytest

from tests import docblocks as db

DOC = """intro

<!-- doc-test: skip (needs a browser) -->
```sh
open http://x
```

<!-- doc-test: on=beta in=clone -->
```console
$ peerd status   # comment
node beta <node-id>
```

```
no language
```
"""


def test_blocks_carry_language_line_and_marker() -> None:
    """A fence's language, line and the marker right before it are read; the body keeps its text."""
    skip, console, bare = db.blocks("d.md", DOC)
    assert (skip.lang, skip.line, skip.skip, skip.body) == ("sh", 4, "needs a browser", "open http://x\n")
    assert (console.machine, console.options["in"], console.skip) == ("beta", "clone", None)
    assert bare.lang == "" and bare.machine == "main"


def test_blocks_without_a_decision_are_refused() -> None:
    """No language, or $ commands outside a console block, is an error naming the place."""
    bare = db.blocks("d.md", DOC)[2]
    with pytest.raises(db.DocError, match=r"d.md:14: fence needs a language"):
        db.check_block(bare)
    with pytest.raises(db.DocError, match="must be console"):
        db.check_block(db.Block("d.md", 1, "sh", "$ peerd status\n"))
    with pytest.raises(db.DocError, match="unknown doc-test marker"):
        db.blocks("d.md", "<!-- doc-test: sometimes -->\n```sh\nx\n```\n")
    with pytest.raises(db.DocError, match="never closed"):
        db.blocks("d.md", "```sh\nx\n")


def test_console_commands_and_their_output() -> None:
    """Each $ line (continuations joined) takes the lines after it as its shown output."""
    block = db.Block("d.md", 1, "console", "$ a \\\n  --flag\none\n$ b\n$ c\ntwo\nthree\n")
    assert db.console_commands(block) == [db.Command("a    --flag", ("one",)), db.Command("b", ()),
                                          db.Command("c", ("two", "three"))]


@pytest.mark.parametrize(("shown", "actual", "bound"), [
    (["node  beta  <id>"], ["node beta   198b0a82"], {"id": "198b0a82"}),        # spaces are any spaces
    (["a", "...", "z"], ["a", "b", "c", "z"], {}),                                # ... line: any lines
    (["a", "...", "z"], ["a", "z"], {}),                                          # ... or none
    (["up ... ago"], ["up 3 min ago"], {}),                                       # ... in a line: any text
    (["sent <m> to x", "id <m>"], ["sent 7-1 to x", "id 7-1"], {"m": "7-1"}),    # one word, both times
])
def test_shown_output_matches(shown: list[str], actual: list[str], bound: dict[str, str]) -> None:
    """Shown output with its conventions matches what was printed, and binds the placeholders."""
    assert db.match_output(shown, actual, {}) == bound


@pytest.mark.parametrize(("shown", "actual", "known"), [
    (["a", "b"], ["a"], {}),                                      # a shown line missing
    (["a"], ["a", "extra"], {}),                                  # a printed line not shown
    (["sent <m>", "id <m>"], ["sent 7-1", "id 7-2"], {}),        # the same placeholder, two words
    (["id <m>"], ["id 7-2"], {"m": "7-1"}),                       # bound earlier to another word
    (["a  b"], ["ab"], {}),                                       # a space is at least one space
])
def test_shown_output_mismatches(shown: list[str], actual: list[str], known: dict[str, str]) -> None:
    """Output that differs from the shown output in a way the conventions do not allow fails."""
    assert db.match_output(shown, actual, known) is None


def test_find_output_looks_among_other_lines() -> None:
    """A long-running command's shown output may sit between its log lines."""
    assert db.find_output(["code: <c>"], ["log", "code: 482", "more"], {}) == {"c": "482"}
    assert db.find_output(["code: <c>"], ["log"], {}) is None


def test_substitute_fills_placeholders_and_paths() -> None:
    """<name> takes its remembered value; the stand-in paths become real ones; an unknown name fails."""
    paths = {db.CLONE: "/src/peerd", db.HOME: "/tmp/h"}
    assert db.substitute("peerd read <r> --home /home/me/x; cd /path/to/peerd", {"r": "ab"}, paths) == \
        "peerd read ab --home /tmp/h/x; cd /src/peerd"
    with pytest.raises(db.DocError, match="<r> is used before"):
        db.substitute("peerd read <r>", {}, paths)


def test_long_running_commands_split_shell_blocks() -> None:
    """peerd run (with or without &) and join --lan are started by the runner, the rest runs as scripts."""
    body = "# start\npeerd init --name a\npeerd run --port 0 &   # background\npeerd status\n"
    assert db.shell_segments(body) == [db.Segment("# start\npeerd init --name a", None),
                                       db.Segment("peerd run --port 0", "daemon"),
                                       db.Segment("peerd status", None)]
    assert db.long_running("uv run peerd run") == "daemon"
    assert db.long_running("peerd join --lan --name beta") == "waits"
    assert db.long_running("peerd join --code k7m3-x9qp") is None
    assert db.strip_comment("peerd send 'a # b' # c") == "peerd send 'a # b'"


def test_mcp_servers_typed_in_a_shell() -> None:
    """A bare peerd mcp serves until its client leaves; one in a pipeline or with || finishes."""
    assert db.long_running("peerd mcp --in-memory --transport stdio   # gone on exit") == "serves"
    assert db.long_running("uv run peerd mcp --home ./h --role r") == "serves"
    assert db.long_running('peerd mcp --home ./nope || echo "exit $?"') is None
    assert db.long_running("peerd mcp --home ./h < /dev/null") is None
    assert db.serves_http("peerd mcp --transport http --db-path x.db")
    assert db.serves_http("peerd mcp --transport=http")
    assert not db.serves_http("peerd mcp --transport stdio --db-path http.db")
    assert db.serving_url(["log line", "peerd mcp: serving MCP at http://127.0.0.1:8000/mcp"]) == \
        "http://127.0.0.1:8000/mcp"
    assert db.serving_url(["peerd mcp: starting"]) is None
    said = "peerd mcp: clients send the header Authorization: Bearer "
    assert db.serving_token([said + "<the content of /t/a b.db.token>", "x"]) == ("file", "/t/a b.db.token")
    assert db.serving_token(["log", said + "abc-_1"]) == ("token", "abc-_1")
    assert db.serving_token(["peerd mcp: serving MCP at http://127.0.0.1:8000/mcp"]) is None


def test_client_configurations() -> None:
    """Claude Code, Codex and JSON configurations give the server's command and args; bad ones fail."""
    claude = db.claude_servers("claude mcp add --scope user peerd -- peerd mcp --home ~/h --role r\n"
                               "claude mcp add --transport http p http://127.0.0.1:1/mcp --header 'X: y'\n", "d")
    assert claude == [db.StdioServer("claude", "peerd", "peerd", ("mcp", "--home", "~/h", "--role", "r")),
                      db.HttpServer("claude", "p", "http://127.0.0.1:1/mcp", (("X", "y"),))]
    assert db.claude_servers("claude --resume\n", "d") is None
    two = db.claude_servers('claude mcp add --transport http p http://h:1/mcp --header "Authorization: Bearer $(cat t)"'
                            ' -H "X-Peerd-Role: r"\n', "d", lambda line: [w.replace("$(cat t)", "T") for w in
                                                                    shlex.split(line)])
    assert two == [db.HttpServer("claude", "p", "http://h:1/mcp", (("Authorization", "Bearer T"),
                                                                   ("X-Peerd-Role", "r")))]
    codex = db.toml_servers('[mcp_servers.peerd]\ncommand = "uv"\nargs = ["run", "peerd"]\n', "d")
    assert codex == [db.StdioServer("codex", "peerd", "uv", ("run", "peerd"))]
    generic = db.json_servers('{"mcpServers": {"p": {"command": "peerd", "args": ["mcp"]}}}', "d")
    assert generic == [db.StdioServer("json", "p", "peerd", ("mcp",))]
    codex_http = db.toml_servers('[mcp_servers.p]\nurl = "http://127.0.0.1:<local-port>/mcp"\n'
                                 'http_headers = { "X-Peerd-Role" = "r" }\n', "d")
    assert codex_http == [db.HttpServer("codex", "p", "http://127.0.0.1:<local-port>/mcp", (("X-Peerd-Role", "r"),))]
    assert codex_http[0].role == "r"
    codex_token = db.toml_servers('[mcp_servers.p]\nurl = "http://h:1/mcp"\nbearer_token_env_var = "PEERD_TOKEN"\n'
                                  'env_http_headers = { "X-Peerd-Role" = "ROLE_VAR" }\n', "d")
    assert codex_token == [db.HttpServer("codex", "p", "http://h:1/mcp", (("X-Peerd-Role", "${ROLE_VAR}"),
                                                                         ("Authorization", "Bearer ${PEERD_TOKEN}")))]
    by_query = db.json_servers('{"mcpServers": {"p": {"type": "http", "url": "http://h:1/mcp?role=q&instance=i"}}}',
                               "d")
    assert by_query == [db.HttpServer("json", "p", "http://h:1/mcp?role=q&instance=i")] and by_query[0].role == "q"
    assert db.HttpServer("json", "p", "http://h:1/mcp").role is None
    with pytest.raises(db.DocError, match="http URL"):
        db.json_servers('{"mcpServers": {"p": {"url": "ftp://x"}}}', "d")
    for bad in ('{"mcpServers": {"p": {"args": []}}}', '{"mcpServers": {"p": {"command": "x", "args": "mcp"}}}',
                "{not json"):
        with pytest.raises(db.DocError):
            db.json_servers(bad, "d")
    with pytest.raises(db.DocError, match="needs command"):
        db.toml_servers('[mcp_servers.peerd]\nargs = ["mcp"]\n', "d")
    with pytest.raises(db.DocError, match="no option"):
        db.claude_servers("claude mcp add --bogus x -- peerd mcp\n", "d")


def test_gemini_and_qwen_configurations() -> None:
    """`gemini mcp add` and `qwen mcp add` lines give the server as their client stores it: options
    (wherever they stand) apart, every other word after the name the command and its arguments."""
    lines = ("gemini mcp add --scope user peerd peerd mcp --home ~/h --role r --no-push\n"
             "qwen mcp add --transport http p http://127.0.0.1:1/mcp --header 'X: y' -H 'Z: w'\n"
             "qwen mcp add q http://127.0.0.1:2/mcp\n")
    assert db.client_servers(lines, "d") == [
        db.StdioServer("gemini", "peerd", "peerd", ("mcp", "--home", "~/h", "--role", "r", "--no-push")),
        db.HttpServer("qwen", "p", "http://127.0.0.1:1/mcp", (("X", "y"), ("Z", "w"))),
        db.HttpServer("qwen", "q", "http://127.0.0.1:2/mcp")]
    assert db.client_servers("gemini mcp list\n", "d") is None
    assert db.client_servers("claude mcp add p -- peerd mcp\ngemini --version\n", "d") is None
    for bad in ("gemini mcp add --bogus p peerd\n", "qwen mcp add p\n",
                "gemini mcp add --transport http p http://h:1/mcp extra\n"):
        with pytest.raises(db.DocError):
            db.client_servers(bad, "d")
    generic = db.json_servers('{"mcpServers": {"p": {"httpUrl": "http://h:1/mcp", "headers": {"X-Peerd-Role": "r"}}}}',
                              "d")
    assert generic == [db.HttpServer("json", "p", "http://h:1/mcp", (("X-Peerd-Role", "r"),))]


def test_codex_wake_runs_beside_the_doc() -> None:
    """`peerd codex-wake` is long-running: started in the background, its shown output awaited."""
    assert db.long_running("peerd codex-wake --home ~/h &") == "follows"
    assert db.long_running("uv run peerd codex-wake") == "follows"
    assert [s.kind for s in db.shell_segments("peerd init\npeerd codex-wake &\n")] == [None, "follows"]
