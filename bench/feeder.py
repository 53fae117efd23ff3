"""Feeds the end-to-end phases, run as a child process.

Seeds ``batches`` accepted batches (in the lane ``priority`` asks for, else the one their size
decides) through :class:`BatchStore` exactly as the API stores them
(untimed; their outbox rows removed as after a confirmed publish), reports ``ready`` with the
batch ids, waits for ``go`` on stdin, then publishes ``batch.<uuid>`` for every batch with
confirms and a window of 64, as fast as it can, and reports when the first and last publish
happened. The consumers do the rest.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench import child
from bench.raw import seed
from bench.workload import BatchFactory
from shared.core.models import BatchJob
from shared.delivery.batchstore import BatchStore
from shared.infra.broker import Broker
from shared.infra.config import load_settings
from shared.infra.db import Database
from shared.infra.resources import topology_for
from shared.infra.topology import batch_key

#: Confirmed publishes in flight.
WINDOW = 64


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    settings = load_settings()
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    broker = Broker(
        settings.amqp.url.get_secret_value(), topology_for(settings), name="bench-feeder"
    )
    await broker.connect()
    factory = BatchFactory(
        int(spec["recipients"]), settings.providers.chain_codes, priority=spec.get("priority")
    )
    corpus = await seed(BatchStore(db), factory, uuid.UUID(spec["user_id"]), int(spec["batches"]))
    ids = [batch_id for batch_id, _, _ in corpus]
    # Closed before the window: a connection that closes inside it would take its request
    # count with it (bench.cqlops), and publishing needs none.
    await db.close()
    child.emit(
        "ready",
        batch_ids=[str(b) for b in ids],
        recipients=len(ids) * factory.size,
        chunks=len(ids) * -(-factory.size // factory.chunk_size),
    )
    await child.wait_for_go()
    window = asyncio.Semaphore(WINDOW)

    async def publish(batch_id: uuid.UUID) -> None:
        async with window:
            await broker.publish(
                batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
            )

    t_first = time.time()
    await asyncio.gather(*(publish(b) for b in ids))
    t_last = time.time()
    child.progress(f"published {len(ids):,} batch messages in {t_last - t_first:.2f}s")
    await broker.close()
    return {"first_publish": t_first, "last_publish": t_last, "published": len(ids)}


if __name__ == "__main__":
    child.run(main)
