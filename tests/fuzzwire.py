"""Peer-message plaintexts for fuzzing, shared by the fuzz tests and ``bench/soak_fuzz.py``."""

from __future__ import annotations

from typing import Any

import msgpack

from peerd import protocol

UNKNOWN_KIND = 31  # a kind code no message has: the decoder reads past the head to refuse it


def packed(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def wire(msg: Any) -> bytes:
    """``msg`` as a peer message's plaintext: the head codec for a known kind, else an unknown
    kind code followed by the fields (so the fuzz reaches the decoder past the head)."""
    if isinstance(msg, dict) and isinstance(msg.get("t"), str) and msg["t"] in protocol.CODES:
        return protocol.encode(msg)
    rest = {k: v for k, v in msg.items() if k != "t"} if isinstance(msg, dict) else msg
    return bytes([UNKNOWN_KIND]) + packed(rest)
