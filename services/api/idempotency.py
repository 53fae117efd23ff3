"""``Idempotency-Key`` records: the first request with a key wins for 24 hours.

Claiming a key (a lightweight transaction) fixes the batch id the request will store, and
takes a lease on it. A repeat with a different body gets 409. A repeat with the same body gets
the stored answer once there is one; while the first request is still in progress it gets 409
with ``Retry-After``, unless the batch turns out to be stored already (its answer is then
returned, whatever happened to the first request) or the lease has run out (the holder died or
stalled): the repeat then takes the claim over and finishes the *same* batch id. Whatever
crashes, a client that keeps retrying with its key gets exactly one batch id.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from shared.core.errors import DependencyUnavailable
from shared.infra.db import Database


@dataclass(frozen=True, slots=True)
class Claimed:
    """This request holds the key and stores ``batch_id``."""

    batch_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Existing:
    """Another request claimed the key first."""

    same_body: bool
    batch_id: uuid.UUID
    response: bytes | None
    """The first request's answer, or None while it is in progress."""
    owner: uuid.UUID | None
    lease_until: datetime | None

    def expired(self, now: datetime) -> bool:
        return self.lease_until is None or self.lease_until <= now


class IdempotencyKeys(Protocol):
    """What callers use of :class:`IdempotencyStore` (the store, or its in-memory twin)."""

    async def claim(
        self, user_id: uuid.UUID, key: str, body_hash: bytes, batch_id: uuid.UUID, owner: uuid.UUID
    ) -> Claimed | Existing: ...

    async def take_over(
        self, user_id: uuid.UUID, key: str, stale: Existing, owner: uuid.UUID
    ) -> bool: ...

    async def complete(self, user_id: uuid.UUID, key: str, response: bytes) -> None: ...

    async def release(self, user_id: uuid.UUID, key: str, owner: uuid.UUID) -> None: ...


class IdempotencyStore:
    def __init__(self, db: Database, *, lease: float = 30.0) -> None:
        self.db = db
        self.lease = timedelta(seconds=lease)

    async def claim(
        self, user_id: uuid.UUID, key: str, body_hash: bytes, batch_id: uuid.UUID, owner: uuid.UUID
    ) -> Claimed | Existing:
        for _ in range(2):
            now = datetime.now(UTC)
            row = await self.db.one(
                "INSERT INTO idempotency_keys (user_id, key, body_hash, batch_id, owner, "
                "lease_until, created_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
                (user_id, key, body_hash, batch_id, owner, now + self.lease, now),
            )
            if row is None or row["[applied]"]:
                return Claimed(batch_id)
            if row["body_hash"] is not None and row["batch_id"] is not None:
                break
            # The claim's cells expired (24 h TTL) while cells written later by take_over or
            # complete live on: the row exists but claims nothing. Clear it and claim again.
            await self.db.one(
                "DELETE FROM idempotency_keys WHERE user_id = ? AND key = ? IF body_hash = null",
                (user_id, key),
            )
        else:
            raise DependencyUnavailable(
                "cassandra", f"Idempotency-Key {key!r} could not be claimed"
            )
        return Existing(
            same_body=hmac.compare_digest(row["body_hash"] or b"", body_hash),
            batch_id=row["batch_id"],
            response=row["response"],
            owner=row["owner"],
            lease_until=row["lease_until"].replace(tzinfo=UTC) if row["lease_until"] else None,
        )

    async def take_over(
        self, user_id: uuid.UUID, key: str, stale: Existing, owner: uuid.UUID
    ) -> bool:
        """Take a claim whose lease ran out; False if someone else did first."""
        row = await self.db.one(
            "UPDATE idempotency_keys SET owner = ?, lease_until = ? WHERE user_id = ? AND key = ? "
            "IF owner = ? AND response = null",
            (owner, datetime.now(UTC) + self.lease, user_id, key, stale.owner),
        )
        return bool(row and row["[applied]"])

    async def complete(self, user_id: uuid.UUID, key: str, response: bytes) -> None:
        # LWT on the same row keeps reads of it linearizable (no mixing with plain writes).
        await self.db.execute(
            "UPDATE idempotency_keys SET response = ? WHERE user_id = ? AND key = ? IF EXISTS",
            (response, user_id, key),
        )

    async def release(self, user_id: uuid.UUID, key: str, owner: uuid.UUID) -> None:
        """Forget our claim when the request failed before anything was stored (a 429), so
        the client may retry with the same key at once."""
        await self.db.execute(
            "DELETE FROM idempotency_keys WHERE user_id = ? AND key = ? IF owner = ?",
            (user_id, key, owner),
        )
