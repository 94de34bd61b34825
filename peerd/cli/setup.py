"""Opening a home for the commands that set up or serve a node, so that no mistake passes silently.

Invariants:
* A home with a node in it (``replica.db`` or ``node.key``) but no ``config.toml``
  has lost its fleet key: it never gets a new random fleet without ``--new-fleet``;
  the error says how to recover (join with an invite, ``init --fleet-key``).
* A command that may create a home creates the node (key and replica, together)
  before the config, so the default node name can carry the node id.
* Every hint printed names ``--home`` when the user gave one (``home_flag``).
* A home opened here is made owner-only first (``peerd.home.tighten``).
* A command that made a home and then failed takes back what it made, and only that
  (``Footprint``): a new folder goes with its parents made for it; a folder that was there, empty
  or not, keeps what it held.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from peerd import home as homes
from peerd.cli.errors import EXIT_FAIL, EXIT_NO_HOME, CliError
from peerd.config import Config, init_home, load_config
from replica import Replica, open_home


def home_flag(home_arg: str | None) -> str:
    """`` --home DIR`` as the user should type it again, or ``""`` if they gave none."""
    return f" --home {shlex.quote(home_arg)}" if home_arg else ""


@dataclass(frozen=True)
class Footprint:
    """What was at a home's path before a command that may make it there."""

    home: Path
    top: Path | None  # the highest folder of the path that was missing (the command makes it)
    entries: frozenset[str] | None  # what the folder held, when it was there

    @classmethod
    def of(cls, home: Path) -> Footprint:
        path, top = home.absolute(), None
        while not path.exists() and path.parent != path:
            top, path = path, path.parent
        return cls(home, top, frozenset(os.listdir(home)) if home.is_dir() else None)

    def undo(self) -> None:
        """Take back what was made at the path since (the folders made, or the entries added)."""
        if self.top is not None:
            shutil.rmtree(self.top, ignore_errors=True)
            return
        for name in set(os.listdir(self.home)) - (self.entries or frozenset()):
            path = self.home / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def has_node(home: Path) -> bool:
    return homes.replica_path(home).exists() or homes.node_key_path(home).exists()


def lost_fleet_message(home: Path, flag: str) -> str:
    return (
        f"{home} holds a node (its replica and node key) but no config.toml: the fleet key is lost, and "
        "peerd will not make up a new fleet for this node. To recover, either:\n"
        f"  - join your fleet again: run `peerd invite` on a machine of the fleet, then here: "
        f"peerd join TOKEN{flag}\n"
        f"  - or give the fleet key back (fleet_key in config.toml on any machine of the fleet): "
        f"peerd init{flag} --fleet-key peerd-fleet-...\n"
        f"  - or start a new fleet with this node: peerd run{flag} --new-fleet"
    )


def no_home_message(home: Path, flag: str) -> str:
    return (
        f"no peerd home at {home} (no config.toml there). If a daemon runs on this machine, give its home "
        "with --home or PEERD_HOME (an MCP client may not pass PEERD_HOME on: put --home in the server's "
        f"arguments). To make a new home here: peerd init{flag}, or pass --init"
    )


def open_fleet(home: Path, *, flag: str, create: bool, new_fleet: bool = False, name: str | None = None,
               fleet_key: bytes | None = None) -> tuple[Config, bool]:
    """The home's config, and whether this call made a new one; refuses what would fail silently."""
    homes.tighten(home)
    if homes.config_path(home).exists():
        if new_fleet:
            current = load_config(homes.config_path(home))
            raise CliError(f"--new-fleet: {home} already belongs to fleet {current.fleet_id}; it is kept "
                           "(use another --home for a new fleet)", EXIT_FAIL)
        return init_home(home, name=name, fleet_key=fleet_key), False
    if not create:
        raise CliError(no_home_message(home, flag), EXIT_NO_HOME)
    if has_node(home) and fleet_key is None and not new_fleet:
        raise CliError(lost_fleet_message(home, flag), EXIT_NO_HOME)
    homes.ensure_home(home)
    with open_home(home) as rep:  # key and replica together (a key alone would be retired later)
        close_fleet(rep, founder=fleet_key is None or new_fleet)
    return init_home(home, name=name, fleet_key=fleet_key), True


def close_fleet(rep: Replica, *, founder: bool) -> None:
    """Decide whom a new home's replica trusts without an admit: a new fleet's founder trusts itself;
    a home given only the fleet key trusts whoever lets it in (it is no member until a member runs
    ``peerd admit`` for it); a replica kept from before (its fleet key given back) keeps the members
    it knew."""
    if founder:
        rep.set_fleet_roots(frozenset({rep.node_key}))
    elif rep.fleet_roots() is None:
        if any(k != rep.node_key for k in rep.vector()):
            rep.close_open_fleet()
        else:
            rep.set_fleet_roots(frozenset())
