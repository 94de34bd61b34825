"""Argument checks for the replica API, as pure functions.

Invariants:
* A check returns the value as the API uses it (names trimmed) or raises
  ``InvalidArgument`` with a message naming the argument as callers spell it;
  it never touches the store, so a call is checked before anything is written.
* Names are non-empty, at most ``MAX_NAME_CHARS`` characters, without control
  characters; content is a string of at most ``MAX_CONTENT_BYTES`` of UTF-8.
* Counts are ints (never bools) within the bounds the caller names, and never
  beyond 2^53 - 1 (``stamps.MAX_SAFE_INT``), so no integer argument reaches
  SQLite out of its range.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from replica.errors import InvalidArgument
from replica.names import name_key
from replica.ops import MAX_CONTENT_BYTES, MAX_NAME_CHARS
from replica.stamps import MAX_SAFE_INT

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_QUERY_WORDS = 32
MAX_SEQ = MAX_SAFE_INT  # the largest integer every JSON client reads exactly; beyond it a seq is a mistake

_CONTROL = re.compile(r"[\x00-\x1f]")


def _utf8(value: str, what: str) -> bytes:
    """``value`` as UTF-8; a lone surrogate (which SQLite and the wire cannot carry) is a bad argument."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode (it holds a lone surrogate)") from None


def check_name(value: object, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string")
    value = value.strip()
    _utf8(value, what)
    if len(value) > MAX_NAME_CHARS:
        raise InvalidArgument(f"{what} is longer than {MAX_NAME_CHARS} characters")
    if _CONTROL.search(value):
        raise InvalidArgument(f"{what} must not contain control characters")
    return value


def required_name(value: object, what: str) -> str:
    """A required name (``check_name`` without the optional case)."""
    out = check_name(value, what)
    assert out is not None
    return out


def required_names(values: Iterable[object], what: str) -> list[str]:
    """Required names, duplicates dropped, first occurrence first."""
    return list(dict.fromkeys(required_name(v, what) for v in values))


def check_content(value: object, what: str = "content") -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string")
    size = len(_utf8(value, what))
    if size > MAX_CONTENT_BYTES:
        raise InvalidArgument(f"{what} is {size} bytes; the limit is {MAX_CONTENT_BYTES} bytes")
    return value


def check_count(value: object, what: str, *, low: int = 0, high: int = MAX_SAFE_INT) -> int:
    """An integer within [low, high], and never beyond 2^53 - 1 (what JSON clients carry exactly;
    SQLite's own integers end at 2^63 - 1)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{what} must be an integer")
    top = min(high, MAX_SAFE_INT)
    if not low <= value <= top:
        raise InvalidArgument(f"{what} must be between {low} and {top}, got {value}")
    return value


def check_limit(value: object) -> int:
    return check_count(value, "limit", low=1, high=MAX_LIMIT)


def check_since(value: object, what: str = "since") -> int:
    """A cursor: None means from the start (0)."""
    return 0 if value is None else check_count(value, what)


def fts_query(query: object, *, prefix_last: bool = False) -> str:
    """A user's search words as an FTS5 query matching all of them (no operator injection);
    with ``prefix_last`` the last word also matches as a prefix (``deplo`` finds ``deploy``)."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgument("query must be a non-empty string")
    _utf8(query, "query")
    if "\x00" in query:  # FTS5 ends a string at NUL: the query would be malformed
        raise InvalidArgument("query must not contain NUL characters")
    words = [w for w in re.split(r"\s+", query.strip()) if w][:MAX_QUERY_WORDS]
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    if prefix_last:
        quoted[-1] += "*"
    return " ".join(quoted)


def agent_id_for(name: str) -> str:
    """An agent's id is a pure function of its name's key (``names.name_key``: NFC, lower
    case, trimmed): every replica agrees, and ``Alice`` and ``alice`` are one agent."""
    digest = hashlib.blake2b(name_key(name).encode(), digest_size=8, person=b"peerd-agent").hexdigest()
    return "ag_" + digest


def chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
