"""``Idempotency-Key`` records: the first request with a key wins for 24 hours.

A lightweight transaction claims the key with the body hash; a repeat with the same body gets
the stored response, a different body gets 409, and a repeat that arrives while the first is
still being processed gets 409 too (the client retries later and then gets the response).
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.db import Database


@dataclass(frozen=True, slots=True)
class Claimed:
    """This request owns the key."""


@dataclass(frozen=True, slots=True)
class Existing:
    same_body: bool
    response: bytes | None
    """The first request's response, or None while it is still in progress."""


class IdempotencyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def claim(
        self, user_id: uuid.UUID, key: str, body_hash: bytes, batch_id: uuid.UUID
    ) -> Claimed | Existing:
        row = await self.db.one(
            "INSERT INTO idempotency_keys (user_id, key, body_hash, batch_id, created_at) "
            "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS",
            (user_id, key, body_hash, batch_id, datetime.now(UTC)),
        )
        if row is None or row["[applied]"]:
            return Claimed()
        same = hmac.compare_digest(row["body_hash"] or b"", body_hash)
        return Existing(same_body=same, response=row["response"])

    async def complete(self, user_id: uuid.UUID, key: str, response: bytes) -> None:
        # LWT on the same row keeps reads of it linearizable (no mixing with plain writes).
        await self.db.execute(
            "UPDATE idempotency_keys SET response = ? WHERE user_id = ? AND key = ? IF EXISTS",
            (response, user_id, key),
        )

    async def release(self, user_id: uuid.UUID, key: str) -> None:
        """Forget a claim whose request failed, so the client may retry with the same key."""
        await self.db.execute(
            "DELETE FROM idempotency_keys WHERE user_id = ? AND key = ? IF EXISTS",
            (user_id, key),
        )
