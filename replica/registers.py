"""Last-writer-wins registers in SQL: which register a write names, and its projection when it wins.

Invariants:
* A projection changes only when the register write wins: ``LWW_UPSERT`` is
  ``lww.wins`` in SQL, and ``tests/test_crdt_properties.py`` checks the two agree.
* A register write is filed under the keys of the names in its key (``register_key``), so
  ``Tau`` and ``tau`` write one receipt or profile. The signed op keeps the name as written; a
  profile shows the spelling of its first write (lowest stamp), the same on every replica.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from replica import routing
from replica.hlc import wall_of
from replica.ids import receipt_id
from replica.lww import join_key
from replica.names import name_key
from replica.ops import (
    TEXT_KEYS,
)

LWW_UPSERT = (
    "INSERT INTO lww(tbl, k, f, v, hlc, origin) VALUES (?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(tbl, k, f) DO UPDATE SET v = excluded.v, hlc = excluded.hlc, origin = excluded.origin "
    "WHERE excluded.hlc > lww.hlc OR (excluded.hlc = lww.hlc AND excluded.origin > lww.origin)"
)


def register_key(table: str, key: list[str]) -> list[str]:
    """The register a write's key denotes: names in it by their keys (pure).

    A receipt is (message, role, instance or ""); a profile is (role) or (role, instance),
    an empty instance meaning the role's own profile."""
    if table == "rcpt":
        return [key[0], name_key(key[1]), routing.instance_key(key[2])]
    if table == "prof":
        inst = routing.instance_key(key[1]) if len(key) > 1 else ""
        return [name_key(key[0]), inst] if inst else [name_key(key[0])]
    return key


def register_field(table: str, field: str, value: Any) -> tuple[str, Any]:
    """A profile's whole-text ``static``/``dynamic`` (older nodes) is one key of the object,
    ``ops.TEXT_KEYS`` (pure)."""
    if table == "prof" and field in TEXT_KEYS:
        return f"{field}.{TEXT_KEYS[field]}", None if value is None else json.dumps(value, ensure_ascii=False)
    return field, value


def put_register(cur: sqlite3.Cursor, write: list[Any], hlc: int, origin: bytes) -> bool:
    """Apply one LWW write [table, key, field, value]; project it if it wins."""
    table, raw_key, raw_field, value = write
    key = register_key(table, raw_key)
    field, value = register_field(table, raw_field, value)
    stored = int(value) if isinstance(value, bool) else value
    if table == "prof":
        _touch_profile(cur, key, raw_key, hlc, origin)
    cur.execute(LWW_UPSERT, (table, join_key(key), field, stored, hlc, origin))
    if cur.rowcount != 1:
        return False
    _PROJECT[table](cur, key, field, stored, hlc)
    return True


def _project_receipt(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    col = {"d": "delivered", "r": "read", "a": "acked"}[field]
    msg_id, role, inst = key
    cur.execute(
        f"INSERT INTO receipts(msg_id, role, inst, rid, {col}) VALUES (?, ?, ?, ?, ?) "
        f"ON CONFLICT(msg_id, role, inst) DO UPDATE SET {col} = excluded.{col}",
        (msg_id, role, inst, receipt_id(msg_id, role, inst), value),
    )


def _touch_profile(cur: sqlite3.Cursor, key: list[str], raw_key: list[str], hlc: int, origin: bytes) -> None:
    """Every write to a profile (winning or not) counts for its spelling (the first write's) and
    its update time (the newest write's): both depend only on the set of writes."""
    role = raw_key[0].strip()
    inst = raw_key[1].strip() if len(key) > 1 else None
    cur.execute(
        "INSERT INTO profiles(id, rkey, ikey, role, inst, first_hlc, first_origin, updated)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET"
        " role = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.role ELSE role END,"
        " inst = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.inst ELSE inst END,"
        " first_origin = CASE WHEN (excluded.first_hlc, excluded.first_origin) < (first_hlc, first_origin)"
        "   THEN excluded.first_origin ELSE first_origin END,"
        " first_hlc = min(first_hlc, excluded.first_hlc),"
        " updated = max(updated, excluded.updated)",
        (join_key(key), key[0], key[1] if len(key) > 1 else "", role, inst, hlc, origin, wall_of(hlc)),
    )


def _project_nothing(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    """Profile fields are read from the registers themselves (``lww``)."""


def _project_agent(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        f"INSERT INTO agents(id, {field}) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET {field} = excluded.{field}",
        (key[0], value),
    )


def _project_member(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        "INSERT INTO members(thread, agent, present) VALUES (?, ?, ?) "
        "ON CONFLICT(thread, agent) DO UPDATE SET present = excluded.present",
        (key[0], key[1], value),
    )


def _project_thread(cur: sqlite3.Cursor, key: list[str], field: str, value: Any, hlc: int) -> None:
    cur.execute(
        "INSERT INTO threads(id, created) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET created = excluded.created",
        (key[0], value),
    )


_PROJECT = {
    "rcpt": _project_receipt,
    "prof": _project_nothing,
    "agent": _project_agent,
    "member": _project_member,
    "thread": _project_thread,
    "ack": _project_nothing,  # read from ``lww`` (``replica.acks``)
}
