"""How names match: one pure rule for roles, instances, senders and agent names.

Invariants:
* ``name_key`` is VantagePeers' ``normalizeOrchestratorId``: Unicode NFC, then
  full lower-casing (``str.lower``, locale-independent, like JavaScript's
  ``toLowerCase``), then trimming of Unicode white space (and U+FEFF, as
  JavaScript's ``trim`` does). No accent folding: ``hélios`` and ``helios`` stay
  different names; ``HÉLIOS`` and a decomposed ``he\\u0301lios`` are ``hélios``.
* It is idempotent (``name_key(name_key(s)) == name_key(s)``), so a key may be
  keyed again safely, and two names match exactly when their keys are equal.
* Names are matched by key everywhere (routing, receipts, profiles, filters);
  the name as first written is what is signed and shown.
"""

from __future__ import annotations

import unicodedata

# Every character str.isspace() calls white space, plus the byte-order mark, which JavaScript's
# trim removes and Python does not count as white space (tests/test_names.py checks the list).
_TRIM = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def name_key(name: str) -> str:
    """The form under which ``name`` matches other names (NFC, lower case, trimmed)."""
    if name.isascii():  # most names: NFC changes no ASCII text, and ASCII lowers to ASCII
        return name.lower().strip(_TRIM)
    lowered = unicodedata.normalize("NFC", name).lower()
    return unicodedata.normalize("NFC", lowered).strip(_TRIM)


def same_name(a: str, b: str) -> bool:
    """Whether two names denote the same role, instance or agent."""
    return name_key(a) == name_key(b)
