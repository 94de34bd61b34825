"""One error model: every exception class of ours is a PeerdError of the local or the remote family,
and the one table (replica.errors.FACES) tells each door what to say."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

from peerd.cli.errors import EXIT_NO_DAEMON, EXIT_NO_HOME, CliError
from peerd.errors import ConfigError, PeerError, SealError
from peerd.pairing.desk import DeskError
from replica.errors import (
    FACES,
    InvalidArgument,
    LocalError,
    NotFound,
    PeerdError,
    RemoteError,
    StoreError,
    face,
    told,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("replica", "discovery", "mcp_server", "peerd")


def exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in our packages (imported, so the real bases count)."""
    found: list[type[BaseException]] = []
    for package in PACKAGES:
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            tree = ast.parse(Path(str(module.__file__)).read_text())
            for node in tree.body:
                cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found.append(cls)
    return found


def test_every_exception_is_a_peerd_error_of_one_family() -> None:
    classes = exception_classes()
    assert len(classes) > 20
    outside = [c.__qualname__ for c in classes if not issubclass(c, PeerdError)]
    assert outside == []
    roots = [c.__qualname__ for c in classes if c is not PeerdError and not issubclass(c, LocalError | RemoteError)
             and c.__name__ not in ("DaemonError", "DiscoveryError")]  # the two bases of both families
    assert roots == []


@pytest.mark.parametrize(("exc", "code", "status", "exit_code"), [
    (InvalidArgument("x"), "invalid_argument", 400, 1),
    (NotFound("x"), "not_found", 404, 1),
    (StoreError("x"), "store_error", 500, 1),
    (ConfigError("x"), "invalid_argument", 400, 1),
    (SealError("x"), "remote_error", 502, 1),
    (PeerError("x"), "remote_error", 502, 1),
    (DeskError(429, "x"), "refused", 429, 1),
    (CliError("x", EXIT_NO_HOME), "invalid_argument", 400, EXIT_NO_HOME),
    (CliError("x", EXIT_NO_DAEMON), "invalid_argument", 400, EXIT_NO_DAEMON),
])
def test_one_table_tells_each_door(exc: PeerdError, code: str, status: int, exit_code: int) -> None:
    got = face(exc)
    assert (got.code, got.status, got.exit) == (code, status, exit_code)
    assert told(exc) == f"{code}: x"


def test_the_table_lists_the_specific_before_the_general() -> None:
    classes = [cls for cls, _f in FACES]
    for i, cls in enumerate(classes):
        assert not any(issubclass(cls, earlier) for earlier in classes[:i]), cls
    assert classes[-1] is PeerdError
