"""``peerd backup FILE`` and ``peerd restore FILE``: a home in one file, and a new home from it.

Invariants:
* ``backup`` copies the replica with SQLite's online backup from this process (``replica.backup``),
  beside a running daemon or with none, and stores the home's ``config.toml`` in the copy: the
  file holds the fleet key, and says so. An existing FILE is replaced only with ``--force``.
* ``restore`` checks the whole file first (a peerd backup, SQLite's integrity check, a schema this
  peerd knows) and writes nothing before that; it then builds the home in a hidden folder beside
  the target and renames it into place, so a failure at any step leaves no home, half or whole.
  The target must not exist, or be an empty folder.
* A restored home is a **new node** (a fresh node key): the backup's node may have signed ops
  after the backup was made, and no peer can prove which was the last; under a new key the new
  node can write at once, offline, and never sign an (origin, seq) the old one signed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from peerd import home as homes
from peerd.cli.errors import EXIT_FAIL, EXIT_NO_HOME, CliError
from peerd.cli.format import plural
from peerd.cli.setup import home_flag, no_home_message
from peerd.config import Config, config_from_dict, decode_fleet_key, render_config
from peerd.errors import ConfigError
from replica import hlc

SECRET_NOTE = "the file holds the fleet key: keep it as private as the home"


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text, flush=True)


def _iso(ms: int) -> str:
    return hlc.to_iso(hlc.pack(ms))


def _counts(messages: int, ops: int, nodes: int) -> str:
    return f"{plural(messages, 'message')}, {plural(ops, 'op')} from {plural(nodes, 'node')}"


# -- backup ---------------------------------------------------------------------------------------


def cmd_backup(args: argparse.Namespace) -> int:
    from replica import backup  # noqa: PLC0415 - sqlite and signing: only when a command needs them

    home = homes.resolve_home(args.home)
    cfg_path, db = homes.config_path(home), homes.replica_path(home)
    if not cfg_path.is_file():
        raise CliError(no_home_message(home, home_flag(args.home)), EXIT_NO_HOME)
    raw = cfg_path.read_bytes()
    cfg = _load(raw, str(cfg_path))
    if not db.is_file():
        raise CliError(f"{home} holds no replica yet ({db.name}): nothing to back up", EXIT_NO_HOME)
    dest = Path(args.file).absolute()
    info = backup.create(db, dest, {homes.CONFIG_TOML: raw}, force=args.force)
    data = {"file": str(dest), "home": str(home), "node_id": info.node.hex(), "name": cfg.name,
            "fleet_id": cfg.fleet_id, "created": _iso(info.created_ms), "schema_version": info.schema_version,
            "messages": info.messages, "ops": info.ops, "origins": info.origins, "bytes": info.size,
            "holds_fleet_key": True}
    _emit(args, data, f"backed up {home} to {dest}\n"
                      f"  node    {cfg.name}  ({info.node.hex()[:16]})\n"
                      f"  holds   {_counts(info.messages, info.ops, info.origins)}, schema v{info.schema_version}, "
                      f"{info.size:,} bytes\n"
                      f"  secret  {SECRET_NOTE}\n"
                      f"  restore peerd restore {dest} --home NEW_HOME")
    return 0


def _load(raw: bytes, where: str) -> Config:
    """The config a ``config.toml`` text holds; ConfigError (exit 1) naming ``where`` if it is bad."""
    try:
        return config_from_dict(tomllib.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as exc:
        raise ConfigError(f"{where}: not a valid config.toml: {exc}") from None


# -- restore --------------------------------------------------------------------------------------


def cmd_restore(args: argparse.Namespace) -> int:
    from replica import backup, identity, open_home  # noqa: PLC0415

    target = homes.resolve_home(args.home)
    _require_free(target)
    src = Path(args.file).absolute()
    info = backup.inspect(src)  # every check before anything is written
    raw = info.files.get(homes.CONFIG_TOML)
    if raw is None:
        raise backup.BadBackup(f"{src} holds no {homes.CONFIG_TOML}: it cannot make a home")
    cfg = _load(raw, f"{src} ({homes.CONFIG_TOML})")
    text = _config_text(raw, cfg, name=args.name, fleet_key=args.fleet_key)
    ident = identity.generate()
    with _staging(target) as staging:
        backup.unpack(src, homes.replica_path(staging), ident.public_key)
        identity.load_or_create(homes.node_key_path(staging), ident)
        homes.atomic_write(homes.config_path(staging), text.encode("utf-8"), mode=0o600)
        homes.ensure_token(homes.local_token_path(staging))  # a new home: its own local secret
        with open_home(staging) as rep:  # opens as peerd will (an older schema is upgraded here, once)
            stats = rep.stats()
    new_cfg = _load(text.encode("utf-8"), str(homes.config_path(target)))
    data = {"home": str(target), "file": str(src), "node_id": ident.node_id, "name": new_cfg.name,
            "fleet_id": new_cfg.fleet_id, "previous_node_id": info.node.hex(), "backup_created": _iso(info.created_ms),
            "messages": stats["messages"], "ops": stats["ops"], "origins": stats["origins"]}
    flag = home_flag(str(target))
    _emit(args, data, f"restored {src} into {target}\n"
                      f"  node    {new_cfg.name}  ({ident.node_id[:16]}, a new node: the backup's node was "
                      f"{info.node.hex()[:16]})\n"
                      f"  holds   {_counts(stats['messages'], stats['ops'], stats['origins'])} as of "
                      f"{_iso(info.created_ms)}; what the old node wrote later comes back from its peers\n"
                      f"  admit   it is no member until one lets it in; on a member: peerd admit {ident.node_id} "
                      f"--name {shlex.quote(new_cfg.name)}\n"
                      f"  start   peerd run{flag}\n"
                      f"  secret  {target / homes.CONFIG_TOML} holds the fleet key, as the backup does\n"
                      f"  retire  if the old machine is gone for good, once this node has caught up, on a member: "
                      f"peerd remove {info.node.hex()[:16]}")
    return 0


def _require_free(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CliError(f"{target} exists and is not empty; restore into a new home (a folder that does not "
                       "exist yet, or an empty one)", EXIT_FAIL)


def _config_text(raw: bytes, cfg: Config, *, name: str | None, fleet_key: str | None) -> str:
    """The backup's config.toml as it was, or rewritten with the new name or fleet key (the key
    the backup held then joins the keys the fleet used before)."""
    changes: dict[str, Any] = {}
    if name is not None:
        changes["name"] = name
    if fleet_key is not None:
        key = decode_fleet_key(fleet_key)
        if key != cfg.fleet_key:
            changes |= {"fleet_key": key, "previous_fleet_keys": (cfg.fleet_key, *cfg.previous_fleet_keys)}
    return render_config(dataclasses.replace(cfg, **changes)) if changes else raw.decode("utf-8")


@contextlib.contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A private folder beside ``target``, renamed to it when the block succeeds; on any failure
    it is removed, with every parent folder this made."""
    made = _missing_parents(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.restore-{secrets.token_hex(4)}")
    try:
        staging.mkdir(mode=0o700)
        with contextlib.suppress(OSError):  # mkdir's mode is masked by the umask
            staging.chmod(0o700)
        yield staging
        if target.exists():
            target.rmdir()  # an empty folder (checked first); a file or content appearing since fails here
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _missing_parents(folder: Path) -> list[Path]:
    """The folders from ``folder`` up that do not exist yet, deepest first."""
    out = []
    while not folder.exists() and folder != folder.parent:
        out.append(folder)
        folder = folder.parent
    return out


# -- the flags ------------------------------------------------------------------------------------


def backup_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("file", metavar="FILE", help="the backup file to write")
    s.add_argument("--force", action="store_true", help="replace FILE if it exists")
    s.set_defaults(fn=cmd_backup)


def restore_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("file", metavar="FILE", help="a file written by `peerd backup`")
    s.add_argument("--name", help="a name for the restored node (default: the backup's)")
    s.add_argument("--fleet-key", help="the fleet's current key, when it was rotated since the backup "
                                       "(fleet_key in config.toml on any member)")
    s.set_defaults(fn=cmd_restore)
