"""The home folder: where one daemon keeps its replica, node key, config and status.

Invariants:
- The home is chosen as: explicit `--home` argument > `PEERD_HOME` environment
  variable > the platform's per-user data folder for the app "peerd".
- A home created here is private to its user (mode 0700 on POSIX).
- Files are replaced atomically (temporary file in the same folder, fsync, rename):
  a reader sees the old content or the new one, never a torn file.
- `daemon.json` exists only while a daemon serves from this home; it is a JSON object.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from peerd.errors import DaemonError

APP_NAME = "peerd"
HOME_ENV = "PEERD_HOME"

REPLICA_DB = "replica.db"
NODE_KEY = "node.key"
CONFIG_TOML = "config.toml"
DAEMON_JSON = "daemon.json"


def resolve_home(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Return the home folder as an absolute path (not created)."""
    env = os.environ if environ is None else environ
    if explicit is not None and str(explicit) != "":
        chosen = Path(explicit)
    elif env.get(HOME_ENV):
        chosen = Path(env[HOME_ENV])
    else:
        import platformdirs  # noqa: PLC0415 - slow to import; only when no home is named (`peerd hook`)

        chosen = platformdirs.user_data_path(APP_NAME, appauthor=False)
    return chosen.expanduser().absolute()


def replica_path(home: Path) -> Path:
    """The SQLite replica file."""
    return home / REPLICA_DB


def node_key_path(home: Path) -> Path:
    """The node's Ed25519 private key."""
    return home / NODE_KEY


def config_path(home: Path) -> Path:
    """The daemon's `config.toml` (holds the fleet key)."""
    return home / CONFIG_TOML


def daemon_json_path(home: Path) -> Path:
    """The running daemon's status file."""
    return home / DAEMON_JSON


def ensure_home(home: Path) -> Path:
    """Create the home folder (and parents) if missing; a new home gets mode 0700."""
    if not home.is_dir():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # mkdir's mode is masked by the umask
            home.chmod(0o700)
    return home


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` with `data` atomically; the file gets `mode`."""
    tmp = _write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def create_exclusive(path: Path, data: bytes, *, mode: int = 0o600) -> bool:
    """Create `path` holding `data` unless it exists; return whether it was created.

    Two processes racing here cannot both win, and neither can see a half-written file.
    """
    tmp = _write_temp(path, data, mode)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: fall back to O_EXCL
        return _create_excl_direct(path, data, mode)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return True


def write_daemon_json(home: Path, info: Mapping[str, object]) -> None:
    """Atomically write the running daemon's status (pid, node id, URLs, ...)."""
    text = json.dumps(dict(info), indent=2, sort_keys=True) + "\n"
    atomic_write(daemon_json_path(home), text.encode("utf-8"), mode=0o600)


def read_daemon_json(home: Path) -> dict[str, object] | None:
    """Return the daemon status, or None if no daemon has written one."""
    path = daemon_json_path(home)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DaemonError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        info = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise DaemonError(f"{path}: not valid JSON; delete it if no daemon is running") from None
    if not isinstance(info, dict):
        raise DaemonError(f"{path}: expected a JSON object; delete it if no daemon is running")
    return info


def remove_daemon_json(home: Path, *, only_pid: int | None = None) -> bool:
    """Delete the status file; return whether it was removed.

    With `only_pid`, delete it only if it names that pid, so a daemon shutting down
    never removes the file of a newer daemon that took over the home.
    """
    path = daemon_json_path(home)
    if only_pid is not None:
        try:
            info = read_daemon_json(home)
        except DaemonError:
            return False
        if info is None or info.get("pid") != only_pid:
            return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        _fchmod(fd, mode)
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def _create_excl_direct(path: Path, data: bytes, mode: int) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    except FileExistsError:
        return False
    try:
        _fchmod(fd, mode)
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fchmod(fd: int, mode: int) -> None:
    # os.open's mode is masked by the umask; set it exactly. (No fchmod on Windows.)
    if hasattr(os, "fchmod"):
        os.fchmod(fd, mode)


def _fsync_dir(folder: Path) -> None:
    # Makes the rename durable on POSIX; not possible (nor needed) on Windows.
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pid_alive(pid: object) -> bool:
    """Whether ``pid`` (as read from daemon.json) names a running process."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's process: alive
        return True
    return True
