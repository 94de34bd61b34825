"""Name matching (``replica.names.name_key``): VantagePeers' normalisation as a pure rule."""

from __future__ import annotations

import sys
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from replica.names import _TRIM, name_key, same_name


def test_key_is_nfc_lower_and_trimmed_like_vantagepeers() -> None:
    """Case and Unicode form fold; accents and inner spaces do not; outer white space and BOM go."""
    assert name_key("TAU") == "tau"
    assert name_key("he\u0301lios") == name_key("HÉLIOS") == "hélios"
    assert name_key("helios") != name_key("hélios")
    assert name_key("\u00a0 Marie\ufeff\n") == "marie"
    assert name_key("tau laptop") == "tau laptop"
    assert same_name("Zoé", "zoe\u0301") and not same_name("zoe", "zoé")


def test_trim_set_is_python_white_space_plus_bom() -> None:
    """The trimmed characters are exactly str.isspace() plus U+FEFF (what JavaScript's trim removes)."""
    spaces = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert set(_TRIM) == spaces | {"\ufeff"}


@given(st.text())
def test_key_is_idempotent(s: str) -> None:
    """Keying a key changes nothing, so keys can be compared and stored safely."""
    assert name_key(name_key(s)) == name_key(s)


@given(st.text())
def test_key_ignores_unicode_form(s: str) -> None:
    """A name written decomposed (NFD) or composed (NFC) has the same key."""
    assert name_key(unicodedata.normalize("NFD", s)) == name_key(unicodedata.normalize("NFC", s))


# Letters whose upper case lowers back to them (not ß, µ...), so any mix of cases is one name.
_CASED = [c for c in map(chr, range(0x41, 0x250)) if c.isalpha() and c.upper().lower() == c.lower()]


@given(st.text(alphabet=_CASED, min_size=1))
def test_key_ignores_case(s: str) -> None:
    """Upper-, lower- and mixed-case spellings of a name match."""
    assert name_key(s.upper()) == name_key(s.lower()) == name_key(s.swapcase()) == name_key(s)
