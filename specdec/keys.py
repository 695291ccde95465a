"""Per-sequence secrets: who may release a sequence, and which draft worker may draft for it.

A sequence id is no secret (an admin sees it, its draft worker carries it in every message), so
ids alone cannot decide who owns what. The router draws two random keys per sequence: the owner key,
which only it knows and which a worker's Release must present, and the draft key, which it gives the
target and the one draft worker it attached, and which every draft must carry. Any other peer, even
an authenticated one, can then neither end nor read nor steer another client's generation. A
sequence admitted without a key (a tool or a test talking to a worker directly) is open to anyone,
as it was chosen to be.
"""
from __future__ import annotations

import hmac
import secrets


def new_key() -> str:
    """128 random bits, as hex."""
    return secrets.token_hex(16)


def key_matches(expected: str, given: str) -> bool:
    """Whether `given` proves ownership of something keyed with `expected` ("" = unkeyed: anyone).
    Compared in constant time."""
    return not expected or hmac.compare_digest(expected.encode(), given.encode())
