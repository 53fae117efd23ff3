"""The outbox relay: publishes batches that were stored but never confirmed by the broker.

The API leaves an outbox row until the broker confirms ``batch.<uuid>``. Every interval, the
relay takes rows older than the grace period: if the batch header exists it publishes (a
duplicate of a publish that actually succeeded is harmless downstream) and removes the row;
if the header is missing the acceptance failed part-way, the client got an error, and the
traces are discarded.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from shared.batchstore import OUTBOX_SHARDS, BatchStore
from shared.broker import Broker
from shared.errors import DependencyUnavailable
from shared.models import BatchJob
from shared.topology import batch_key

log = logging.getLogger(__name__)


async def relay_once(store: BatchStore, broker: Broker, *, grace: float) -> int:
    """One pass over every shard; returns how many batches it published."""
    cutoff = datetime.now(UTC) - timedelta(seconds=grace)
    published = 0
    for shard in range(OUTBOX_SHARDS):
        for row in await store.pending(shard):
            if row["created_at"].replace(tzinfo=UTC) > cutoff:
                continue
            batch_id = row["batch_id"]
            if await store.header(batch_id) is None:
                log.info("discarding half-written batch %s", batch_id)
                await store.discard(batch_id, row["user_id"])
                continue
            await broker.publish(
                batch_key(batch_id),
                BatchJob(batch_id=batch_id).encode(),
                message_id=str(batch_id),
            )
            await store.mark_published(batch_id)
            published += 1
    return published


async def relay_forever(
    store: BatchStore, broker: Broker, *, interval: float, grace: float
) -> None:
    while True:
        try:
            count = await relay_once(store, broker, grace=grace)
            if count:
                log.info("outbox relay published %d batch(es)", count)
        except DependencyUnavailable as exc:
            log.warning("outbox relay: %s", exc)
        await asyncio.sleep(interval)
