"""Backups of a replica: a consistent copy made beside running writers, checked before it is restored.

A backup is one SQLite file: SQLite's online backup of the replica (one step, so one read
snapshot: a point in time, taken while other processes keep writing in WAL mode), switched to a
rollback journal so it is a single file, plus two tables added to the copy once it is complete:

* ``peerd_backup(k, v)``: the marker (``format`` = ``peerd-backup``, ``format_version``, the
  source ``node`` key, ``created`` in Unix ms, the replica's ``schema_version``, and counts);
* ``peerd_backup_files(name, data)``: files of the home the caller hands in (peerd stores its
  ``config.toml`` there), opaque to this module.

Invariants:
* ``create`` never writes to the replica it copies (it is opened read-only) and never leaves a
  partial file at the destination: the copy is built in a temporary file beside it (mode 0600),
  checked (``quick_check``), synced, then linked into place; an existing file is replaced only
  with ``force``.
* ``inspect`` only reads, and says what is wrong with a file that is not a whole, sound backup
  this version can restore: not SQLite, shorter than its header says (truncated), no marker
  (not a backup), a newer format or schema, or a failed ``integrity_check``.
* ``unpack`` writes only after ``inspect`` passed, and only the new replica file it is given
  (which must not exist yet). The restored replica belongs to a *new* node: the backup's node
  becomes an ordinary origin (its contiguous mark is what it had itself reported, every other
  origin's is recomputed from the ops held, removals are settled against it), and the new
  node's clock starts after every stamp held. No op is changed or dropped, so the new node never
  signs an (origin, seq) the old one signed: it signs under another origin.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from collections.abc import Mapping
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

from replica import fleetstore, schema
from replica.errors import InvalidArgument, StoreError
from replica.store import create_private

FORMAT = "peerd-backup"
FORMAT_VERSION = 1
MARKER_TABLE = "peerd_backup"
FILES_TABLE = "peerd_backup_files"
_HEADER = b"SQLite format 3\x00"
_HEADER_BYTES = 100
LOCK_TIMEOUT = 30.0  # seconds the copy may wait for a writer's lock (a checkpoint, say)
# A backup is read as a file nobody writes: no locks, and no -wal or -shm made beside it (a
# foreign file given by mistake is left exactly as it was).
FROZEN = "mode=ro&immutable=1"
FILE_MODE = 0o600  # a backup holds what the home holds (the caller's files: peerd's hold the fleet key)


class BadBackup(InvalidArgument):
    """A file given as a backup is not one this version can restore (nothing was written)."""


@dataclass(frozen=True)
class BackupInfo:
    """What a backup holds, from its marker."""

    node: bytes  # the node key of the replica it was made from
    created_ms: int
    schema_version: int
    messages: int
    ops: int
    origins: int
    size: int  # bytes of the backup file
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)


# -- making a backup --------------------------------------------------------------------------------


def create(source: Path, dest: Path, files: Mapping[str, bytes], *, force: bool = False,
           now_ms: int | None = None) -> BackupInfo:
    """Copy the replica file ``source`` to ``dest`` as a backup holding ``files``; ``dest`` must not
    exist unless ``force``. Raises ``InvalidArgument`` (bad destination) or ``StoreError``."""
    if not source.is_file():
        raise StoreError(f"{source}: no replica file there")
    if dest.resolve() in {p.resolve() for p in _with_sidecars(source)}:
        raise InvalidArgument(f"{dest} is the replica itself; give another file")
    if dest.exists() and not force:
        raise InvalidArgument(f"{dest} exists; give another file, or --force to replace it")
    if dest.is_dir():
        raise InvalidArgument(f"{dest} is a folder; give a file name")
    if not dest.parent.is_dir():
        raise InvalidArgument(f"{dest.parent}: no such folder")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        info = _copy(source, tmp, files, int(time.time() * 1000) if now_ms is None else now_ms)
        _place(tmp, dest, force=force)
    finally:
        for leftover in _with_sidecars(tmp):
            leftover.unlink(missing_ok=True)
    return info


def _copy(source: Path, tmp: Path, files: Mapping[str, bytes], now_ms: int) -> BackupInfo:
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))  # private before a byte is in it
    os.chmod(tmp, FILE_MODE)  # os.open's mode is masked by the umask
    try:
        with closing(sqlite3.connect(_uri(source, "mode=ro"), uri=True, timeout=LOCK_TIMEOUT)) as src, \
                closing(sqlite3.connect(tmp, isolation_level=None)) as dst:
            _require_replica(src, source)
            src.backup(dst)  # one step (pages=-1): one read snapshot of the whole file
            dst.execute("PRAGMA journal_mode = DELETE")  # a single file, no -wal beside it
            info = _mark(dst, files, now_ms)
            if (result := str(dst.execute("PRAGMA quick_check").fetchone()[0])) != "ok":
                raise StoreError(f"the copy of {source} fails SQLite's check: {result}")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot back up {source}: {exc}") from None
    _fsync(tmp)
    return BackupInfo(**{**info.__dict__, "size": tmp.stat().st_size})


def _require_replica(conn: sqlite3.Connection, path: Path) -> None:
    try:
        row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    except sqlite3.DatabaseError:
        row = None
    if row is None:
        raise StoreError(f"{path} is not a peerd replica")


def _mark(dst: sqlite3.Connection, files: Mapping[str, bytes], now_ms: int) -> BackupInfo:
    """Add the marker and the files to the finished copy (one transaction)."""
    def one(sql: str) -> int:
        return int(dst.execute(sql).fetchone()[0])

    node = _self_node(dst)
    counts = {"messages": one("SELECT count(*) FROM messages"), "ops": one("SELECT count(*) FROM ops"),
              "origins": one("SELECT count(*) FROM origins WHERE contig > 0 OR top > 0 OR node = "
                             "(SELECT v FROM meta WHERE k = 'self_node')")}
    version = one("SELECT v FROM meta WHERE k = 'schema_version'")
    marker = {"format": FORMAT, "format_version": FORMAT_VERSION, "node": node, "created": now_ms,
              "schema_version": version, **counts}
    dst.execute("BEGIN")
    dst.execute(f"CREATE TABLE {MARKER_TABLE}(k TEXT PRIMARY KEY, v) WITHOUT ROWID")
    dst.execute(f"CREATE TABLE {FILES_TABLE}(name TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID")
    dst.executemany(f"INSERT INTO {MARKER_TABLE}(k, v) VALUES (?, ?)", list(marker.items()))
    dst.executemany(f"INSERT INTO {FILES_TABLE}(name, data) VALUES (?, ?)", [(k, bytes(v)) for k, v in files.items()])
    dst.execute("COMMIT")
    return BackupInfo(node, now_ms, version, counts["messages"], counts["ops"], counts["origins"], 0, dict(files))


def _self_node(conn: sqlite3.Connection) -> bytes:
    row = conn.execute("SELECT v FROM meta WHERE k = ?", (fleetstore.SELF_META,)).fetchone()
    if row is None or not isinstance(row[0], bytes):
        raise StoreError("the replica does not say which node it belongs to (open it with peerd once)")
    return bytes(row[0])


def _place(tmp: Path, dest: Path, *, force: bool) -> None:
    if force:
        os.replace(tmp, dest)
    else:
        try:
            os.link(tmp, dest)  # fails if the file appeared meanwhile: never replaced by surprise
        except FileExistsError:
            raise InvalidArgument(f"{dest} exists; give another file, or --force to replace it") from None
    _fsync_dir(dest.parent)


# -- reading a backup ---------------------------------------------------------------------------------


def inspect(path: Path) -> BackupInfo:
    """Check that ``path`` is a whole, sound peerd backup this version can restore; ``BadBackup`` if not."""
    size = _check_header(path)
    try:
        with closing(sqlite3.connect(_uri(path, FROZEN), uri=True)) as conn:
            marker = _marker(conn, path)
            version = _check_versions(conn, marker, path)
            result = "\n".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
            if result != "ok":
                raise BadBackup(f"{path} is damaged (SQLite's integrity check: {result[:300]})")
            files = {str(n): bytes(d) for n, d in conn.execute(f"SELECT name, data FROM {FILES_TABLE}")}
    except sqlite3.Error as exc:
        raise BadBackup(f"{path} is damaged, or not a peerd backup: {exc}") from None
    node = marker.get("node")
    if not isinstance(node, bytes):
        raise BadBackup(f"{path}: the backup does not name its node")
    return BackupInfo(node, _int(marker, "created"), version, _int(marker, "messages"), _int(marker, "ops"),
                      _int(marker, "origins"), size, files)


def _check_header(path: Path) -> int:
    """The file's size, once its SQLite header is there and the file is as long as it says."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEADER_BYTES)
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        raise BadBackup(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadBackup(f"{path} is a folder, not a backup file") from None
    except OSError as exc:
        raise BadBackup(f"{path}: cannot read: {exc.strerror}") from None
    if len(head) < _HEADER_BYTES or not head.startswith(_HEADER):
        raise BadBackup(f"{path} is not a peerd backup (not an SQLite file)")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages, counter, valid_for = (int.from_bytes(head[i:i + 4], "big") for i in (28, 24, 92))
    if pages and counter == valid_for and size < pages * page:
        raise BadBackup(f"{path} is truncated: it holds {size} bytes, its header says {pages * page}")
    return size


def _marker(conn: sqlite3.Connection, path: Path) -> dict[str, object]:
    try:
        rows = conn.execute(f"SELECT k, v FROM {MARKER_TABLE}").fetchall()
    except sqlite3.OperationalError:
        rows = []
    marker = {str(k): v for k, v in rows}
    if marker.get("format") != FORMAT:
        if _is_replica(conn):
            raise BadBackup(f"{path} is a peerd replica, not a backup: make one with `peerd backup`")
        raise BadBackup(f"{path} is not a peerd backup")
    return marker


def _is_replica(conn: sqlite3.Connection) -> bool:
    try:
        return conn.execute("SELECT 1 FROM meta WHERE k = 'schema_version'").fetchone() is not None
    except sqlite3.Error:
        return False


def _check_versions(conn: sqlite3.Connection, marker: Mapping[str, object], path: Path) -> int:
    fmt = _int(marker, "format_version")
    if fmt > FORMAT_VERSION:
        raise BadBackup(f"{path} is a backup of format {fmt}, newer than this peerd reads ({FORMAT_VERSION}); "
                        "restore it with a newer peerd")
    row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version != _int(marker, "schema_version"):
        raise BadBackup(f"{path} is damaged: its replica is schema v{version}, its marker says "
                        f"v{_int(marker, 'schema_version')}")
    if version > schema.LATEST:
        raise BadBackup(f"{path} holds a replica of schema v{version}, newer than this peerd (v{schema.LATEST}); "
                        "restore it with the peerd that made it, or a newer one")
    return version


def _int(marker: Mapping[str, object], key: str) -> int:
    v = marker.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadBackup(f"the backup's marker has no valid {key!r}")
    return v


# -- restoring ------------------------------------------------------------------------------------


def unpack(path: Path, db: Path, new_node: bytes) -> BackupInfo:
    """Check the backup ``path`` (``inspect``), then write its replica to ``db`` (which must not
    exist) as the replica of the node ``new_node``. ``db`` is removed again if anything fails."""
    info = inspect(path)
    if db.exists():
        raise InvalidArgument(f"{db} exists; restore into a new home")
    create_private(db)  # owner-only before SQLite writes a byte (its -wal takes the same mode)
    try:
        with closing(sqlite3.connect(_uri(path, FROZEN), uri=True)) as src, \
                closing(sqlite3.connect(db, isolation_level=None, timeout=LOCK_TIMEOUT)) as dst:
            src.backup(dst)
            dst.execute("BEGIN IMMEDIATE")
            dst.execute(f"DROP TABLE {MARKER_TABLE}")
            dst.execute(f"DROP TABLE {FILES_TABLE}")
            adopt(dst.cursor(), new_node)
            dst.execute("COMMIT")
            dst.execute("PRAGMA journal_mode = WAL")
    except BaseException as exc:
        for leftover in _with_sidecars(db):
            with suppress(OSError):
                leftover.unlink()
        if isinstance(exc, sqlite3.Error):
            raise StoreError(f"cannot restore {path} to {db}: {exc}") from None
        raise
    return info


def adopt(cur: sqlite3.Cursor, new_node: bytes) -> None:
    """Make this replica the replica of ``new_node``; the node it belonged to becomes an ordinary
    origin. A replica never maintains its own origin's ``contig`` (its own ops are contiguous by
    construction: ``sync._CONTIG``), so that origin's mark becomes its newest seq; every other
    origin's mark is extended over the ops held (as ``sync._advance`` would)."""
    old = fleetstore.self_node(cur)
    clock = int(cur.execute("SELECT max(coalesce((SELECT max(hlc) FROM origins), 0),"
                            " coalesce((SELECT max(hlc) FROM ops), 0))").fetchone()[0])
    for oid, node, contig in cur.execute("SELECT oid, node, contig FROM origins").fetchall():
        newest = int(cur.execute("SELECT coalesce(max(seq), 0) FROM ops WHERE oid = ?", (oid,)).fetchone()[0])
        start = max(int(contig), newest) if bytes(node) == old else int(contig)
        cur.execute("UPDATE origins SET contig = ?, top = max(top, ?) WHERE oid = ?",
                    (_extend(cur, oid, start), newest, oid))
    cur.execute("INSERT INTO origins(node, hlc) VALUES (?, ?) ON CONFLICT(node) DO UPDATE SET hlc = excluded.hlc",
                (new_node, clock))
    fleetstore.remember_self(cur, new_node)
    if _has_table(cur, "fleet_removed"):
        fleetstore.settle(cur)  # the old node, if removed, now has its ops above the cutoff retracted too


def _extend(cur: sqlite3.Cursor, oid: int, start: int) -> int:
    """The highest n >= start such that every seq in (start, n] is held (``vector.contiguous``,
    over a sorted stream instead of a set, so a large origin is never held in memory)."""
    n = start
    for (seq,) in cur.execute("SELECT seq FROM ops WHERE oid = ? AND seq > ? ORDER BY seq", (oid, start)):
        if seq != n + 1:
            break
        n = int(seq)
    return n


def _uri(path: Path, options: str) -> str:
    return f"{path.absolute().as_uri()}?{options}"


def _with_sidecars(db: Path) -> tuple[Path, ...]:
    return (db, *(db.with_name(db.name + s) for s in ("-journal", "-wal", "-shm")))


def _has_table(cur: sqlite3.Cursor, name: str) -> bool:
    return cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows: neither possible nor needed
        return
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
