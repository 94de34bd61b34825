"""The home folder: where one daemon keeps its replica, node key, config and status.

Invariants:
- The home is chosen as: explicit `--home` argument > `PEERD_HOME` environment
  variable > the platform's per-user data folder for the app "peerd".
- A home created here is private to its user (mode 0700 on POSIX), and so is every file
  peerd writes in it (0600). ``tighten`` takes group and other permissions off a home that
  was made looser, on what this user owns; whatever it cannot fix is named (``open_to_others``).
- ``local.token`` holds the local port's secret: whoever can read it can use the daemon
  (``mcp_server.localauth``). It is made once, owner-only before a byte is in it, and never
  replaced behind a running daemon's back.
- Files are replaced atomically (temporary file in the same folder, fsync, rename):
  a reader sees the old content or the new one, never a torn file.
- `daemon.json` exists only while a daemon serves from this home; it is a JSON object.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from peerd.errors import DaemonError

APP_NAME = "peerd"
HOME_ENV = "PEERD_HOME"

REPLICA_DB = "replica.db"
NODE_KEY = "node.key"
CONFIG_TOML = "config.toml"
DAEMON_JSON = "daemon.json"
LOCAL_TOKEN = "local.token"
TOKEN_BYTES = 32
CLIENT_HEADER = "X-Peerd-Client"  # "cli" from the command line: the local API's sentences in its words
OPEN_BITS = 0o077  # what group and others may do


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


def local_token_path(home: Path) -> Path:
    """The local port's secret (``Authorization: Bearer`` its content)."""
    return home / LOCAL_TOKEN


def new_token() -> str:
    """A fresh secret for the local port: 32 random bytes, url-safe base64 (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def read_token(path: Path) -> str | None:
    """The secret in ``path``, or None when there is none this user can read."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def ensure_token(path: Path) -> str:
    """The secret in ``path``, made first if missing: mode 0600 from the moment the file exists,
    and two processes racing here end up with the same one."""
    if (token := read_token(path)) is not None:
        return token
    create_exclusive(path, (new_token() + "\n").encode("ascii"), mode=0o600)
    token = read_token(path)
    if token is None:
        raise DaemonError(f"{path}: cannot read the local port's secret; delete the file to make a new one")
    return token


def read_local_token(home: Path) -> str | None:
    """What peerd's own clients send the home's daemon (None: no token this user can read)."""
    return read_token(local_token_path(home))


def auth_headers(home: Path) -> dict[str, str]:
    """The header that admits peerd's own clients to the home's daemon ({} with no readable token:
    the daemon then answers 401, saying where the token is)."""
    token = read_local_token(home)
    return {} if token is None else {"Authorization": f"Bearer {token}"}


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


# -- owner-only ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loose:
    """A path in a home that others may use: its mode and owner, and whether it is ours to fix."""

    path: Path
    mode: int
    uid: int
    ours: bool

    def describe(self) -> str:
        who = "" if self.ours else f", owned by uid {self.uid}, not by this user"
        return f"{self.path} (mode {self.mode:04o}{who})"


def is_home(home: Path) -> bool:
    """Whether ``home`` holds a peerd node (config or replica): only then is it peerd's to tighten."""
    return (home / CONFIG_TOML).exists() or (home / REPLICA_DB).exists()


def home_entries(home: Path) -> list[Path]:
    """The home and what is directly in it (a subfolder made owner-only keeps others out of its
    content too)."""
    try:
        with os.scandir(home) as it:
            return [home, *(Path(entry.path) for entry in it)]
    except OSError:
        return [home]


def open_to_others(paths: list[Path], uid: int | None = None) -> list[Loose]:
    """Which of ``paths`` group or others may read, write or enter (POSIX; symlinks skipped)."""
    if os.name != "posix":
        return []
    me = os.geteuid() if uid is None else uid
    out: list[Loose] = []
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & OPEN_BITS:
            out.append(Loose(path, stat.S_IMODE(st.st_mode), st.st_uid, st.st_uid == me))
    return out


def tighten_paths(paths: list[Path]) -> list[Loose]:
    """Take group and other permissions off those of ``paths`` this user owns (0755 becomes
    0700, 0644 0600); what stays open to others, since someone else owns it or chmod failed."""
    left: list[Loose] = []
    for loose in open_to_others(paths):
        try:
            if not loose.ours:
                raise PermissionError
            os.chmod(loose.path, loose.mode & ~OPEN_BITS)  # lstat said: not a symlink
        except OSError:
            left.append(loose)
    return left


def tighten(home: Path) -> list[Loose]:
    """Make a peerd home owner-only (what peerd does each time it opens one); what it could not
    fix. A folder that is no peerd home is left as it is."""
    return tighten_paths(home_entries(home)) if is_home(home) else []


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
