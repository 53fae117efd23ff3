"""The keys that sign our tokens: a ring of keys by id, the first of which signs.

Pure. A key ring is part of the settings (``SAFEDELIVR_TRACKING_KEYS``), so configuration
parses it at start-up; the tracking tokens (:mod:`shared.engagement.engagement_tokens`) use it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Signing keys by id; the first signs."""

    keys: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a key ring needs at least one key")
        for kid, key in self.keys:
            if not kid.isalnum() or len(key) < 32:
                raise ValueError("a key id is alphanumeric and a key has 32 bytes or more")

    @property
    def signing(self) -> tuple[str, bytes]:
        return self.keys[0]

    def get(self, kid: str) -> bytes | None:
        return dict(self.keys).get(kid)


def ring_from(text: str) -> KeyRing:
    """``kid1:base64key,kid2:base64key`` (a setting) as a ring; ValueError if malformed."""
    pairs: list[tuple[str, bytes]] = []
    for item in (part.strip() for part in text.split(",")):
        kid, sep, encoded = item.partition(":")
        if not sep:
            raise ValueError("each key is kid:base64")
        try:
            pairs.append((kid, base64.b64decode(encoded, validate=True)))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"key {kid!r} is not base64") from exc
    return KeyRing(tuple(pairs))
