"""The file reservation tools through the in-process SDK client, on a real replica file: the names,
arguments and result shapes of mcp_agent_mail's, and what peerd adds (lost leases listed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import TextContent

from mcp_server import SessionBinding, Wiring, build_server
from replica import Replica, open_home
from tests.conftest import sync_all


@pytest.fixture
def homes(tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    a, b = open_home(tmp_path / "a"), open_home(tmp_path / "b")
    yield a, b
    a.close()
    b.close()


@asynccontextmanager
async def connect(replica: Replica, role: str | None = None) -> AsyncIterator[Client]:
    wiring = Wiring.over(replica)
    server = build_server(replica, waiter=wiring.waiter, bind=SessionBinding(role=role))
    try:
        async with Client(server) as c:
            yield c
    finally:
        wiring.close()


async def call(client: Client, tool: str, **args: Any) -> tuple[bool, Any]:
    result = await client.call_tool(tool, args)
    block = result.content[0]
    assert isinstance(block, TextContent)
    return result.is_error, result.structured_content if not result.is_error else block.text


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    error, out = await call(client, tool, **args)
    assert not error, out
    assert isinstance(out, dict)
    return out


async def test_the_argument_names_are_mcp_agent_mails(homes: tuple[Replica, Replica]) -> None:
    async with connect(homes[0]) as c:
        schemas = {t.name: t.input_schema for t in (await c.list_tools()).tools}
    assert set(schemas["file_reservation_paths"]["properties"]) == {
        "project_key", "agent_name", "paths", "ttl_seconds", "exclusive", "reason", "registration_token", "format"}
    assert set(schemas["file_reservation_paths"]["required"]) == {"project_key", "paths"}
    assert set(schemas["renew_file_reservations"]["properties"]) >= {
        "project_key", "agent_name", "extend_seconds", "paths", "file_reservation_ids"}
    assert set(schemas["release_file_reservations"]["properties"]) >= {
        "project_key", "agent_name", "paths", "file_reservation_ids"}
    assert set(schemas["force_release_file_reservation"]["required"]) == {"project_key", "file_reservation_id"}
    assert set(schemas["force_release_file_reservation"]["properties"]) >= {"notify_previous", "note"}


async def test_the_reservation_workflow_across_two_replicas(homes: tuple[Replica, Replica]) -> None:
    """alice reserves, bob meets the conflict with alice named, alice renews and releases, bob then
    gets it; results shaped like mcp_agent_mail's."""
    a, b = homes
    async with connect(a, "alice") as alice, connect(b) as bob:
        got = await ok(alice, "file_reservation_paths", project_key="/home/alice/src/backend",
                       paths=["app/api/*.py"], ttl_seconds=600, exclusive=True, reason="migrations")
        (g,) = got["granted"]
        assert set(g) == {"id", "path_pattern", "exclusive", "reason", "expires_ts"} and got["conflicts"] == []
        sync_all([a, b])
        refused = await ok(bob, "file_reservation_paths", project_key="backend", agent_name="bob",
                           paths=["app/api/users.py"])
        assert refused["granted"] == []
        (conflict,) = refused["conflicts"]
        assert conflict["path"] == "app/api/users.py"
        assert [(h["agent"], h["reason"], h["expires_ts"]) for h in conflict["holders"]] == \
            [("alice", "migrations", g["expires_ts"])]
        renewed = await ok(alice, "renew_file_reservations", project_key="backend", extend_seconds=600)
        assert renewed["renewed"] == 1 and renewed["file_reservations"][0]["new_expires_ts"] > g["expires_ts"]
        error, text = await call(bob, "release_file_reservations", project_key="backend", agent_name="bob",
                                 file_reservation_ids=[g["id"]])
        assert error and "held by alice" in text
        released = await ok(alice, "release_file_reservations", project_key="backend")
        assert released["released"] == 1 and released["released_at"]
        sync_all([a, b])
        assert (await ok(bob, "file_reservation_paths", project_key="backend", agent_name="bob",
                         paths=["app/api/users.py"]))["granted"]


async def test_force_release_tells_the_holder(homes: tuple[Replica, Replica]) -> None:
    a, b = homes
    async with connect(a, "alice") as alice, connect(b, "bob") as bob:
        lid = (await ok(alice, "file_reservation_paths", project_key="p", paths=["x.py"]))["granted"][0]["id"]
        sync_all([a, b])
        out = await ok(bob, "force_release_file_reservation", project_key="p", file_reservation_id=lid,
                       note="stale since yesterday")
        assert (out["released"], out["notified"], out["reservation"]["status"]) == (1, True, "forced")
        sync_all([a, b])
        (mail,) = a.check_messages("alice").messages
        assert "stale since yesterday" in mail.content and lid in mail.content
        again = await ok(bob, "force_release_file_reservation", project_key="p", file_reservation_id=lid)
        assert (again["released"], again["already_released"]) == (0, True)


async def test_a_conflict_from_a_partition_is_listed(homes: tuple[Replica, Replica]) -> None:
    a, b = homes
    async with connect(a, "alice") as alice, connect(b, "bob") as bob:
        first = (await ok(alice, "file_reservation_paths", project_key="p", paths=["src/"]))["granted"][0]
        second = (await ok(bob, "file_reservation_paths", project_key="p", paths=["src/a.py"]))["granted"][0]
        sync_all([a, b])
        for c in (alice, bob):
            listed = await ok(c, "list_file_reservations", project_key="p")
            (conflict,) = listed["conflicts"]
            assert (conflict["lost"]["id"], conflict["winner"]["id"]) == (second["id"], first["id"])
            assert {x["id"]: x["status"] for x in listed["file_reservations"]} == \
                {first["id"]: "held", second["id"]: "lost"}


@pytest.mark.parametrize(("args", "error"), [
    ({"paths": ["../etc"]}, "leaves the project"),
    ({"paths": ["a"], "ttl_seconds": 0}, "ttl_seconds"),
    ({"paths": []}, "paths"),
    ({"paths": ["a"], "unknown": 1}, "unknown"),
])
async def test_bad_arguments_are_refused(homes: tuple[Replica, Replica], args: dict[str, Any], error: str) -> None:
    async with connect(homes[0], "alice") as c:
        failed, text = await call(c, "file_reservation_paths", project_key="p", **args)
    assert failed and error in json.dumps(text)
    assert homes[0].vector() == {}


async def test_install_precommit_guard_writes_the_hook_for_this_home(homes: tuple[Replica, Replica],
                                                                     tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415

    from replica import guard  # noqa: PLC0415

    repo = tmp_path / "repo"
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", str(repo)], check=True)
    async with connect(homes[0], "alice") as c:
        out = await ok(c, "install_precommit_guard", project_key="backend", code_repo_path=str(repo))
        hook = Path(out["hook"])
        text = await asyncio.to_thread(hook.read_text)
        assert hook == repo / ".git" / "hooks" / "pre-commit" and guard.HOOK_MARK in text
        assert f"--home {Path(homes[0].path).parent}" in text
        error, text = await call(c, "install_precommit_guard", project_key="backend",
                                 code_repo_path=str(tmp_path / "not-a-repo"))
        assert error and "git" in text
