"""Keys that are equal in every process and Python run, for keyed sampling draws and seeds.

Kept apart from the engine's tensor code (`explorer/sampling.py`) so that the processes that only
name requests (the driver, the explorer's bookkeeping) import no torch for it."""

from __future__ import annotations

import hashlib


def stable_key(*parts: object) -> int:
    """A 64-bit key from strings and ints, equal in every process and Python run (unlike `hash`)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
