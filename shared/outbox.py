"""The outbox: batches stored but not yet confirmed by the broker, and the relay that publishes
them.

Acceptance writes an outbox row before the batch itself and removes it once the broker
confirms ``batch.<uuid>``. Every interval the relay takes the rows of its own namespace (the
exchange it publishes to) older than the grace period: if the batch is stored it publishes it
(a duplicate of a publish that did succeed is harmless downstream) and removes the row; if the
batch is not (yet) stored it leaves the row alone, because the write may still land; rows
expire after a week.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from datetime import UTC, datetime, timedelta

from shared.batchstore import BatchStore
from shared.broker import Broker
from shared.db import Database, Row
from shared.errors import DependencyUnavailable
from shared.models import BatchJob
from shared.topology import batch_key

log = logging.getLogger(__name__)

#: Shards of one namespace's outbox; the relay scans each.
SHARDS = 16


def shard_of(batch_id: uuid.UUID) -> int:
    return zlib.crc32(batch_id.bytes) % SHARDS


class Outbox:
    """The outbox rows of one broker namespace (the exchange batches are published to)."""

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID, created_at: datetime) -> None:
        await self.db.execute(
            "INSERT INTO outbox (namespace, shard, batch_id, user_id, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (self.namespace, shard_of(batch_id), batch_id, user_id, created_at),
            idempotent=True,
        )

    async def done(self, batch_id: uuid.UUID) -> None:
        await self.db.execute(
            "DELETE FROM outbox WHERE namespace = ? AND shard = ? AND batch_id = ?",
            (self.namespace, shard_of(batch_id), batch_id),
            idempotent=True,
        )

    async def rows(self, shard: int) -> list[Row]:
        return await self.db.rows(
            "SELECT batch_id, user_id, created_at FROM outbox WHERE namespace = ? AND shard = ?",
            (self.namespace, shard),
        )


async def relay_once(outbox: Outbox, store: BatchStore, broker: Broker, *, grace: float) -> int:
    """One pass over every shard; returns how many batches it published."""
    cutoff = datetime.now(UTC) - timedelta(seconds=grace)
    published = 0
    for shard in range(SHARDS):
        for row in await outbox.rows(shard):
            if row["created_at"].replace(tzinfo=UTC) > cutoff:
                continue
            batch_id = row["batch_id"]
            if await store.status(batch_id) is None:
                continue  # not stored (yet): the write may still land, or it failed for good
            await broker.publish(
                batch_key(batch_id),
                BatchJob(batch_id=batch_id).encode(),
                message_id=str(batch_id),
            )
            await outbox.done(batch_id)
            published += 1
    return published


async def relay_forever(
    outbox: Outbox, store: BatchStore, broker: Broker, *, interval: float, grace: float
) -> None:
    while True:
        try:
            count = await relay_once(outbox, store, broker, grace=grace)
            if count:
                log.info("outbox relay published %d batch(es)", count)
        except DependencyUnavailable as exc:
            log.warning("outbox relay: %s", exc)
        await asyncio.sleep(interval)
