"""Opaque public identifiers and secret tokens."""

from __future__ import annotations

import base64
import hashlib
import secrets

# Each kind of row has its own short prefix so that an id pasted into the wrong place is easy to
# spot in logs and support requests; the rest is 100 random bits in lowercase base32.


def new_id(prefix: str) -> str:
    raw = base64.b32encode(secrets.token_bytes(15)).decode("ascii").lower()
    return f"{prefix}_{raw[:20]}"


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
