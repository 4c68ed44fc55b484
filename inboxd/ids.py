"""Opaque public identifiers and secret tokens."""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from typing import Final

# Each kind of row has its own short prefix so that an id pasted into the wrong place is easy to
# spot in logs and support requests; the rest is 100 bits in base32 (20 characters): the creation
# time in microseconds (52 bits), then 48 random bits. Ids that sort by creation time put each new
# row at one edge of its table's id index instead of on a random leaf of it: on 10M messages an
# inbox action's writes took ~25 % less time and its COMMIT wrote ~40 % fewer pages (measured by
# hand: 2,000 renames in one transaction, bench/HISTORY.md). Ids are not secrets (keys and tokens
# are separate) and never decide order; the random part keeps them unguessable all the same.
_ALPHABET: Final = "234567abcdefghijklmnopqrstuvwxyz"  # base32 in ASCII order: sorts as numbers
_PAIRS: Final = tuple(a + b for a in _ALPHABET for b in _ALPHABET)  # 10 bits -> 2 characters
_TIME_BITS: Final = 52
_RANDOM_BITS: Final = 48


# The random parts come from os.urandom in blocks of this many ids, not one system call per id:
# a write makes two ids (its SYSTEM message and its event), and under load the system call per
# id was about 2 % of the trio thread (py-spy). Same source, same unguessability.
_POOL_IDS: Final = 512
_RANDOM_BYTES: Final = _RANDOM_BITS // 8


class _RandomPool:
    """Random bytes drawn from the OS a block at a time, handed out once each (a lock: ids are
    made on the trio thread and in worker threads); a forked child starts a pool of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0

    def take(self, n: int) -> int:
        with self._lock:
            if self._at + n > len(self._block):
                self._block, self._at = os.urandom(_POOL_IDS * n), 0
            at = self._at
            self._at = at + n
            return int.from_bytes(self._block[at : at + n], "big")

    def forget(self) -> None:
        self._lock = threading.Lock()
        self._block, self._at = b"", 0


_pool = _RandomPool()
os.register_at_fork(after_in_child=_pool.forget)


def new_id(prefix: str) -> str:
    micros = time.time_ns() // 1000 % (1 << _TIME_BITS)
    n = micros << _RANDOM_BITS | _pool.take(_RANDOM_BYTES)
    return prefix + "_" + "".join([_PAIRS[(n >> shift) & 1023] for shift in range(90, -1, -10)])


def derived_id(prefix: str, *parts: str) -> str:
    """An id of the same form, made from ``parts`` (SHA-256): the same parts give the same id,
    so one that must not change across restarts needs no row of its own (a channel webhook
    delivery's ``X-Svc-Delivery``). It does not sort by time: nothing orders by these."""
    digest = hashlib.sha256("\0".join(parts).encode("utf-8")).digest()
    n = int.from_bytes(digest[:13], "big") >> 4  # 100 bits
    return prefix + "_" + "".join([_PAIRS[(n >> shift) & 1023] for shift in range(90, -1, -10)])


API_KEY_PREFIX = "ibx_"
KEY_DISPLAY_PREFIX_LEN = 12


def new_api_key() -> str:
    """A new API key: 256 random bits, url-safe."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> bytes:
    """Keys carry 256 random bits, so one SHA-256 is enough: there is nothing to brute-force."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def new_webhook_secret() -> str:
    """A signing secret: 32 random bytes in the ``whsec_<base64url>`` form of CONTRACT section 6."""
    return "whsec_" + secrets.token_urlsafe(32)
