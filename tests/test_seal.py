"""Sealing peer bodies with the fleet key: round trip, refusal of anything altered."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerd.config import fleet_id, new_fleet_key
from peerd.errors import DaemonError, PeerError, SealError
from peerd.seal import SEAL_OVERHEAD, WRONG_KEY, box_key, open_sealed, seal

KEY = bytes(range(32))


def test_round_trip() -> None:
    """A sealed body opens to exactly the original bytes with the same key."""
    body = b"hello fleet" * 100
    assert open_sealed(KEY, seal(KEY, body)) == body
    assert open_sealed(KEY, seal(KEY, b"")) == b""


@pytest.mark.parametrize("size", [0, 1, 1000, 256 * 1024])
def test_overhead_is_exactly_40_bytes(size: int) -> None:
    """Sealing adds 24 bytes of nonce and 16 of MAC, nothing more."""
    assert SEAL_OVERHEAD == 40
    assert len(seal(KEY, b"x" * size)) == size + 40


def test_each_seal_uses_a_fresh_nonce() -> None:
    """Sealing the same body twice gives different bytes (no nonce reuse)."""
    assert seal(KEY, b"same") != seal(KEY, b"same")


def test_wrong_key_is_refused() -> None:
    """A body sealed by another fleet is refused with the wrong-key message."""
    sealed = seal(new_fleet_key(), b"secret")
    with pytest.raises(SealError, match="not sealed with this fleet's key"):
        open_sealed(KEY, sealed)


def test_tampered_byte_is_refused() -> None:
    """Flipping one bit of the ciphertext makes the body refuse to open."""
    sealed = bytearray(seal(KEY, b"pay 10 coins"))
    sealed[30] ^= 0x01
    with pytest.raises(SealError, match="wrong fleet key or tampered body"):
        open_sealed(KEY, bytes(sealed))


def test_truncated_bodies_are_refused() -> None:
    """A body cut short is refused: below 40 bytes as too short, otherwise as tampered."""
    sealed = seal(KEY, b"some plaintext")
    with pytest.raises(SealError, match=r"body too short to be sealed \(39 bytes"):
        open_sealed(KEY, sealed[:39])
    with pytest.raises(SealError, match=re.escape(WRONG_KEY)):
        open_sealed(KEY, sealed[:-1])
    with pytest.raises(SealError, match="too short"):
        open_sealed(KEY, b"")


def test_errors_do_not_leak_nacl_exceptions() -> None:
    """SealError carries no chained nacl exception and belongs to the daemon's hierarchy."""
    with pytest.raises(SealError) as info:
        open_sealed(KEY, b"\0" * 64)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__
    assert isinstance(info.value, PeerError)
    assert isinstance(info.value, DaemonError)


def test_box_key_is_derived_not_the_fleet_key() -> None:
    """The box key differs from the fleet key and from its public id, and per fleet."""
    derived = box_key(KEY)
    assert len(derived) == 32
    assert derived != KEY
    assert fleet_id(KEY) not in derived.hex()
    assert derived != box_key(new_fleet_key())


def test_wrong_size_key_is_a_programming_error() -> None:
    """A fleet key of the wrong size raises ValueError, not a misleading SealError."""
    with pytest.raises(ValueError, match="32 bytes"):
        seal(b"short", b"x")
    with pytest.raises(ValueError, match="32 bytes"):
        open_sealed(b"short", b"\0" * 64)


@given(st.binary(max_size=2048))
def test_open_inverts_seal(body: bytes) -> None:
    """For any body, open_sealed(seal(body)) == body."""
    assert open_sealed(KEY, seal(KEY, body)) == body


@given(st.binary(max_size=256), st.data())
def test_any_single_byte_change_is_refused(body: bytes, data: st.DataObject) -> None:
    """Changing any one byte of a sealed body (nonce, ciphertext or MAC) is detected."""
    sealed = bytearray(seal(KEY, body))
    index = data.draw(st.integers(0, len(sealed) - 1), label="index")
    sealed[index] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(SealError, match=re.escape(WRONG_KEY)):
        open_sealed(KEY, bytes(sealed))
