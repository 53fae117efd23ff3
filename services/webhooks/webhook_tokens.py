"""Mailgun webhook tokens, each accepted once: the one writer of ``webhook_tokens``.

Mailgun signs ``timestamp + token`` but not the body, so a captured signature could carry
another body. A token is stored with the hash of the first body it came with: the same body
again is a replay (harmless, applied idempotently), another body is a forgery.
"""

from __future__ import annotations

import hmac
from typing import Protocol

from shared.infra.db import Database


class Tokens(Protocol):
    """What callers use of :class:`WebhookTokens` (the store, or its in-memory twin)."""

    async def accept_once(self, token: str, body_hash: bytes) -> bool: ...


class WebhookTokens:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def accept_once(self, token: str, body_hash: bytes) -> bool:
        """Whether ``token`` may be applied with this body: first use, or the same body."""
        row = await self.db.one(
            "INSERT INTO webhook_tokens (mg_token, body_hash) VALUES (?, ?) IF NOT EXISTS",
            (token, body_hash),
        )
        if row is None or row["[applied]"]:
            return True
        return hmac.compare_digest(row["body_hash"] or b"", body_hash)
