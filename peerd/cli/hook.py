"""``peerd hook``: a role's unread mail, printed the way Claude Code and Codex hooks read it.

For clients without channel pushes (Codex, Claude Code without channels), run on the
``UserPromptSubmit`` and ``SessionStart`` hook events.

Invariants:
* stdout holds exactly one JSON object, ``{"hookSpecificOutput": {"hookEventName": ...,
  "additionalContext": ...}}``, when there is mail to show, and nothing otherwise.
* It never blocks the user's prompt: every failure prints nothing on stdout, one line on
  stderr, and exits 0; only a usage error in its own command line exits 1. Never 2, the
  code with which a hook blocks a prompt.
* On prompt-submit it shows mail never delivered, so each message is shown once, however
  many hooks of the reader run at once or one right after another; on session-start every
  unread message (a new context knows none of it). Like ``check_messages``, it records
  *delivered* for what it shows, never *read*. With nothing new it prints nothing at all.
* Once per reader: a hook holds its reader's lock (``hook-locks/`` in the home, an ``flock``)
  from before it looks until the delivery of what it showed is recorded, so the next hook of
  that reader looks only after that; a lock not had within ``LOCK_WAIT`` seconds is a failure
  (below). The lock dies with the process holding it, so a crash never leaves it held.
* Fast: it imports the standard library, ``replica.mailbox`` and ``mcp_server.framing``
  (no MCP SDK, no aiohttp, no asyncio) and reads on a read-only connection. Delivery is
  recorded after the answer, by a detached child process that loads the signing replica and
  inherits the lock, so the prompt never waits for it (a message whose delivery could not be
  recorded is shown again, never lost). ``bench/bench_hook.py`` measures it on a 1M-message replica.
* It never calls the daemon (no local port, no token); what it writes in the home (its
  cursors, its locks) is owner-only, and the child that records delivery makes the home owner-only.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn

from mcp_server import framing
from replica import mailbox, schema
from replica.errors import StoreError
from replica.names import name_key
from replica.routing import DAY_MS, DEFAULT_BROADCAST_HISTORY_MS

try:
    import fcntl
except ImportError:  # no flock here (Windows): no fork either, so the delivery is recorded before the answer
    fcntl = None  # type: ignore[assignment]

EVENTS = {"prompt-submit": "UserPromptSubmit", "session-start": "SessionStart"}
DEFAULT_SHOWN = 10
MAX_SHOWN = 50
PAGE = 1000  # unread mail read per call; "more" counts past it as "+"
MAX_STDIN = 1024 * 1024
EXIT_USAGE = 1  # not argparse's 2: a hook that exits 2 blocks the user's prompt (as peerd.cli.parser's table says)
CURSORS = "hook-cursors.json"  # in the home: where each reader's last look ended (a cache)
LOCKS = "hook-locks"  # in the home: a lock file per reader, held while a hook looks and records
LOCK_WAIT = 8.0  # seconds a hook waits for its reader's lock (hooks are given 10)


def _shown(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_SHOWN:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_SHOWN}")
    return value


def hook_arguments(p: argparse.ArgumentParser) -> None:
    """The hook's flags, for ``peerd.cli.parser``'s table (whose usage errors exit 1 for the hook)."""
    p.description = "Print a role's unread mail for a Claude Code or Codex hook."
    p.add_argument("--role", required=True, help="the role whose mail to show")
    p.add_argument("--instance", help="this instance of the role")
    p.add_argument("--event", choices=sorted(EVENTS),
                   help="which hook runs it (default: hook_event_name from the hook's stdin, else prompt-submit)")
    p.add_argument("--from", dest="senders", action="append", metavar="ROLE",
                   help="show only mail from this role or agent (repeatable)")
    p.add_argument("--limit", type=_shown, default=DEFAULT_SHOWN,
                   help=f"most messages shown in full (default {DEFAULT_SHOWN}, at most {MAX_SHOWN})")
    p.set_defaults(fn=cmd_hook)


# -- pure parts -----------------------------------------------------------------------------------


def read_payload(stream: IO[str] | None) -> dict[str, Any]:
    """The hook's JSON on stdin, or {} (no stdin, a terminal, not a JSON object)."""
    if stream is None or stream.isatty():
        return {}
    try:
        value = json.loads(stream.read(MAX_STDIN) or "{}")
    except (ValueError, OSError):
        return {}
    return value if isinstance(value, dict) else {}


def event_name(flag: str | None, payload: dict[str, Any]) -> str:
    """The hook event to answer: the flag wins, then the payload's ``hook_event_name``."""
    if flag is not None:
        return EVENTS[flag]
    named = payload.get("hook_event_name")
    return named if isinstance(named, str) and named in EVENTS.values() else EVENTS["prompt-submit"]


def hook_output(event: str, text: str) -> str:
    return json.dumps({"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}},
                      ensure_ascii=False)


def home_of(explicit: str | None) -> Path:
    if explicit or os.environ.get("PEERD_HOME"):
        return Path(explicit or os.environ["PEERD_HOME"]).expanduser().absolute()
    from peerd.home import resolve_home  # noqa: PLC0415 - the platform's data folder: only when no home is named

    return resolve_home(None)


# -- the shell ------------------------------------------------------------------------------------


def history_ms(home: Path) -> int:
    """The home's broadcast history (``broadcast_history_days`` in config.toml), as the daemon
    and ``peerd mcp`` use it; the default where it is not set or not readable."""
    try:
        with (home / "config.toml").open("rb") as f:
            days = tomllib.load(f).get("broadcast_history_days")
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT_BROADCAST_HISTORY_MS
    if not isinstance(days, int) or isinstance(days, bool) or days < 0:
        return DEFAULT_BROADCAST_HISTORY_MS
    return days * DAY_MS


# -- where the last look ended ------------------------------------------------------------------
#
# A reader's mail below a position stays as it was seen: arrivals only get higher positions,
# and neither *read* nor *delivered* is ever undone. So the hook keeps, per reader, the
# position below which everything was read ("unread" cursor) or delivered ("pending" cursor),
# and the next look starts there instead of scanning a long history again. A cursor is kept
# with the broadcast floor it was found under and is used only while the floor is no earlier
# (an earlier floor can bring old broadcasts in), and only if it is not past the replica's end
# (a replaced replica file). The file is a cache: lost updates or deleting it only cost a scan.


def cursor_key(kind: str, role: str, instance: str | None) -> str:
    return f"{kind}\x1f{role}\x1f{instance or ''}"


def usable(entry: object, floor: int, mark: int) -> int:
    """Where a look may start, given a stored cursor entry (0: from the beginning)."""
    if not isinstance(entry, dict):
        return 0
    after, was = entry.get("after"), entry.get("floor")
    if not isinstance(after, int) or not isinstance(was, int) or isinstance(after, bool) or isinstance(was, bool):
        return 0
    return after if was <= floor and 0 <= after <= mark else 0


def cursor_after(items: Sequence[mailbox.Mail], mark: int, *, pending: bool) -> int:
    """The new cursor after a look that returned ``items`` (in arrival order, at most ``PAGE``)
    with the replica at ``mark``: just before the first unread (or, ``pending``, undelivered)
    one; past everything looked at when there is none."""
    wanted = [m for m in items if m.delivered is None] if pending else list(items)
    if wanted:
        return wanted[0].seq - 1
    return items[-1].seq if len(items) >= PAGE else mark


def load_cursors(home: Path) -> dict[str, Any]:
    try:
        value = json.loads((home / CURSORS).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def save_cursors(home: Path, cursors: dict[str, Any]) -> None:
    tmp = home / f".{CURSORS}.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only, as all of the home
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(cursors, separators=(",", ":")))
        os.replace(tmp, home / CURSORS)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


# -- once per reader ---------------------------------------------------------------------------
#
# A hook shows what it found and leaves recording its delivery to a child: until that is
# recorded, another look would find the same mail undelivered. So a hook holds its reader's lock
# from before it looks, and hands it to the child (an flock belongs to the open file, which the
# child shares), which lets it go when the delivery is recorded, or when it dies.


class LockTimeout(StoreError):
    """The reader's lock was not had in time (another hook of the reader is still recording)."""


def lock_path(home: Path, role: str, instance: str | None) -> Path:
    reader = f"{name_key(role)}\x1f{name_key(instance) if instance else ''}"
    return home / LOCKS / f"{hashlib.sha256(reader.encode()).hexdigest()[:32]}.lock"


@contextlib.contextmanager
def reader_lock(home: Path, role: str, instance: str | None, wait: float = LOCK_WAIT) -> Iterator[int | None]:
    """Hold the reader's lock (the open file's descriptor; None where there is no flock) for the
    block; a child forked inside it keeps holding it after the block."""
    if fcntl is None:
        yield None
        return
    path = lock_path(home, role, instance)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        _acquire(fd, wait)
        yield fd
    finally:
        os.close(fd)  # a child that inherited it still holds the lock


def _acquire(fd: int, wait: float) -> None:
    """flock ``fd``, waiting at most ``wait`` seconds (an interval timer breaks the wait)."""
    assert fcntl is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass

    def give_up(_signum: int, _frame: FrameType | None) -> None:
        raise LockTimeout(f"another peerd hook of this role is still recording its delivery after {wait:g} s; "
                          "the mail it shows is shown next time")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, wait)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def replica_file(home: Path) -> Path:
    db = home / "replica.db"
    if not db.is_file():
        raise FileNotFoundError(f"no peerd replica in {home} (run `peerd init`, or pass --home)")
    return db


def collect(home: Path, role: str, instance: str | None, *, all_unread: bool,
            senders: Sequence[str]) -> list[mailbox.Mail]:
    """The reader's mail to consider (read-only connection, no signing loaded), looked at from
    where the last look ended."""
    db = replica_file(home)
    cursors = load_cursors(home)
    unread_key, pending_key = cursor_key("unread", role, instance), cursor_key("pending", role, instance)
    conn = mailbox.connect(db)
    try:
        cur = conn.cursor()
        if mailbox.schema_version(cur) != schema.LATEST:  # written by an older peerd: upgrade it first
            upgrade(home)
        cur.execute("BEGIN")  # one snapshot: the mark and the look agree
        mark = mailbox.mark(cur)
        floor = mailbox.broadcast_floor(cur, role, time.time_ns() // 1_000_000, history_ms(home))
        after = usable(cursors.get(unread_key), floor, mark)
        if not all_unread:
            after = max(after, usable(cursors.get(pending_key), floor, mark))
        items = mailbox.mail(cur, role, instance, floor=floor, after=after, limit=PAGE, pending_only=not all_unread)
        cur.execute("COMMIT")
    finally:
        conn.close()
    found = {pending_key: cursor_after(items, mark, pending=True)}
    if all_unread:
        found[unread_key] = cursor_after(items, mark, pending=False)
    if any(usable(cursors.get(k), floor, mark) != v for k, v in found.items()):
        save_cursors(home, {**cursors, **{k: {"after": v, "floor": floor} for k, v in found.items()}})
    return [m for m in items if framing.allowed(m.sender, senders)]


def upgrade(home: Path) -> None:
    """Open the replica the full way once, which brings its schema up to date (or says why not)."""
    from replica import open_home  # noqa: PLC0415 - only for a file an older peerd wrote

    open_home(home).close()


def record(home: Path, items: Sequence[mailbox.Mail]) -> None:
    """Record delivery (after the answer, off the prompt's path), making the home owner-only first."""
    from peerd.home import tighten  # noqa: PLC0415 - after the answer, like the signing replica
    from replica import open_home  # noqa: PLC0415 - loads signing: only when a delivery is recorded

    tighten(home)
    with open_home(home) as rep:
        rep.record_delivered(items)


def record_after_answer(home: Path, items: Sequence[mailbox.Mail]) -> None:
    """Record delivery in a detached child process, so the hook answers (and exits) without
    waiting for the signing replica to load; the child inherits the reader's lock and lets it go
    when it exits. Where there is no fork, record it here."""
    if not hasattr(os, "fork"):
        record(home, items)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return  # the hook's own process: its answer is out, it exits now
    code = 1
    try:
        os.setsid()  # outlives the hook runner's process group
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(quiet, fd)  # the runner waits for its pipes to close: let them go at once
        record(home, items)
        code = 0
    finally:
        os._exit(code)


def run(args: argparse.Namespace, stdin: IO[str] | None, stdout: IO[str]) -> None:
    payload = read_payload(stdin)
    event = event_name(args.event, payload)
    role = args.role.strip()
    instance = (args.instance or "").strip() or None
    home = home_of(args.home)
    replica_file(home)  # no lock folder in a folder that is no home
    with reader_lock(home, role, instance):
        items = collect(home, role, instance, all_unread=event == EVENTS["session-start"], senders=args.senders or ())
        if not items:
            return
        shown = items[: args.limit]
        text = framing.hook_text(role, instance, shown, len(items) - len(shown),
                                 new_only=event != EVENTS["session-start"])
        stdout.write(hook_output(event, text) + "\n")
        stdout.flush()
        record_after_answer(home, shown)  # its child holds the lock until the delivery is recorded


def answer(args: argparse.Namespace) -> int:
    """Run the hook with parsed arguments: exit 0 whatever happens (a usage error: 1)."""
    if not args.role.strip():
        print("peerd hook: --role must not be empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        run(args, sys.stdin, sys.stdout)
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a hook must never break the user's prompt: say why, show nothing
        print(f"peerd hook: {exc}", file=sys.stderr)
    return 0


def cmd_hook(args: argparse.Namespace) -> NoReturn:
    """``peerd hook``: answer, then leave at once (``leave``)."""
    leave(answer(args))


def leave(code: int) -> NoReturn:
    """Exit at once with the output flushed: the interpreter's teardown (about 20 ms of CPU,
    freeing every module) would be time the user's prompt waits for. Nothing is left to
    close: the replica connection is closed and the cursors file replaced before this."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
