"""The pre-commit guard in real git repositories, with no daemon: a commit touching a path another
role holds exclusively is refused (holder, reason and expiry named), its holder's passes, an expired
or lost lease no longer blocks, no role set blocks every exclusive lease and says how to set one,
and the bypass variable and --no-verify work."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from replica import guard, leases, open_home
from tests.daemons import PEERD
from tests.test_leases import MINUTE, Writer


def git(repo: Path, *args: str, role: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in (guard.ROLE_ENV, guard.BYPASS_ENV)}
    environ.update(env)
    if role is not None:
        environ[guard.ROLE_ENV] = role
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=environ, check=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "backend"
    path.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@example.org"], ["config", "user.name", "t"]):
        assert git(path, *args).returncode == 0
    (path / "src").mkdir()
    (path / "src" / "api.py").write_text("v1\n")
    (path / "README").write_text("hi\n")
    assert git(path, "add", ".").returncode == 0 and git(path, "commit", "-qm", "init").returncode == 0
    return path


@pytest.fixture
def home(tmp_path: Path, repo: Path) -> Path:
    h = tmp_path / "home"
    with open_home(h) as r:
        r.reserve("backend", "alice", ["src/"], ttl_seconds=3600, reason="auth refactor")
    done = subprocess.run([str(PEERD), "guard", "install", "--home", str(h), "--repo", str(repo)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return h


def change(repo: Path, name: str = "src/api.py") -> None:
    (repo / name).write_text((repo / name).read_text() + "more\n")
    assert git(repo, "add", name).returncode == 0


def test_a_commit_touching_another_roles_path_is_refused_naming_the_lease(repo: Path, home: Path) -> None:
    change(repo)
    done = git(repo, "commit", "-qm", "bob's change", role="bob")
    assert done.returncode != 0
    assert "src/api.py" in done.stderr and "held by alice" in done.stderr and "auth refactor" in done.stderr
    assert "until 20" in done.stderr  # the expiry, as an ISO time
    assert git(repo, "rev-list", "--count", "HEAD").stdout.strip() == "1"


def test_the_holder_commits_and_other_paths_pass(repo: Path, home: Path) -> None:
    change(repo, "README")
    assert git(repo, "commit", "-qm", "readme", role="bob").returncode == 0
    change(repo)
    assert git(repo, "commit", "-qm", "alice's change", role="Alice").returncode == 0


def test_no_role_refuses_every_exclusive_lease_and_says_how_to_set_one(repo: Path, home: Path) -> None:
    change(repo)
    done = git(repo, "commit", "-qm", "who?")
    assert done.returncode != 0 and f"set {guard.ROLE_ENV}=" in done.stderr


def test_the_bypass_variable_and_no_verify(repo: Path, home: Path) -> None:
    change(repo)
    assert git(repo, "commit", "-qm", "bypass", role="bob", **{guard.BYPASS_ENV: "1"}).returncode == 0
    change(repo)
    assert git(repo, "commit", "--no-verify", "-qm", "no-verify", role="bob").returncode == 0


def test_an_expired_or_lost_lease_no_longer_blocks(tmp_path: Path, repo: Path) -> None:
    h = tmp_path / "home2"
    w = Writer()
    now = int(time.time() * 1000)
    expired, _ = w.take(now - 120 * MINUTE, "alice", "src/api.py", ttl=60 * MINUTE, project="backend")
    winner, _ = w.take(now - 2 * MINUTE, "carol", "docs/", ttl=60 * MINUTE, project="backend")
    lost, _ = w.take(now - MINUTE, "dave", "docs/x.md", ttl=60 * MINUTE, project="backend")
    with open_home(h) as r:
        r.apply([expired, winner, lost])
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("x\n")
    assert subprocess.run([str(PEERD), "guard", "install", "--home", str(h), "--repo", str(repo)],
                          check=False).returncode == 0
    change(repo)
    assert git(repo, "commit", "-qm", "after expiry", role="bob").returncode == 0
    assert git(repo, "add", "docs/x.md").returncode == 0
    done = git(repo, "commit", "-qm", "docs", role="dave")  # dave's lease was lost to carol's: carol blocks
    assert done.returncode != 0 and "held by carol" in done.stderr


def test_install_keeps_a_foreign_hook(repo: Path, tmp_path: Path) -> None:
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(guard.GuardError, match="another pre-commit hook"):
        guard.install(repo, "backend", str(tmp_path / "h"))
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"


def test_the_check_blocks_by_pattern_on_the_replica_file_alone(tmp_path: Path) -> None:
    with open_home(tmp_path / "h") as r:
        r.reserve("p", "alice", ["src/*.py"], reason="r")
        db = Path(r.path)
    now = int(time.time() * 1000)
    blocks = guard.blocking(db, "p", ["src/a.py", "docs/x.md"], "bob", now)
    assert [(b.path, b.holder) for b in blocks] == [("src/a.py", "alice")]
    assert guard.blocking(db, "p", ["src/a.py"], "alice", now) == []
    assert guard.blocking(db, "p", ["src/a.py"], "bob", now + 2 * 3600 * 1000) == []  # expired by then
    assert guard.blocking(tmp_path / "none.db", "p", ["src/a.py"], None, now) == []
    assert leases.covers("src/", "src/b/c.py") and not leases.covers("src/*.py", "docs/a.py")
