"""API key format, generation, hashing and constant-time verification (pure).

A key reads ``sd_live_<key_id>_<secret>``: the prefix makes leaked keys easy to scan for,
``key_id`` (12 base32 characters) is the lookup handle, and the 256-bit ``secret`` is stored
only as its SHA-256 (a fast hash is right for high-entropy secrets; there is nothing to brute
force). Verification compares digests with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

#: Every key starts with this.
PREFIX = "sd_live_"
#: What a key may do: ``send`` batches and manage suppressions, ``read`` batches, logs and
#: stats, manage ``keys``, and ``operator`` work on the whole deployment.
SCOPES: tuple[str, ...] = ("send", "read", "keys", "operator")
#: A new key's scopes when none are asked for, and those of keys made before scopes existed.
DEFAULT_SCOPES: frozenset[str] = frozenset({"send", "read", "keys"})
_KEY = re.compile(r"^sd_live_([a-z2-7]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret_hash: bytes
    plaintext: str
    """Shown to the user once, never stored."""


def generate() -> NewKey:
    key_id = base64.b32encode(secrets.token_bytes(10)).decode().lower().rstrip("=")[:12]
    secret = secrets.token_urlsafe(32)
    return NewKey(key_id, hash_secret(secret), f"{PREFIX}{key_id}_{secret}")


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse(key: str) -> tuple[str, str] | None:
    """Split a presented key into (key_id, secret); None when it is not a well-formed key."""
    match = _KEY.fullmatch(key)  # not .match: its $ also matches before a final newline
    return (match.group(1), match.group(2)) if match else None


def verify(secret: str, stored_hash: bytes) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def scopes_problem(wanted: Iterable[str]) -> str | None:
    """Why ``wanted`` is not a set of scopes a key can have, or None."""
    wanted = list(wanted)
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown:
        return f"unknown scope(s) {', '.join(map(repr, unknown))}; choose from {', '.join(SCOPES)}"
    if not wanted:
        return "must hold at least one scope"
    return None
