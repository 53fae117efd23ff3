"""The outbox: batches stored but not yet confirmed by the broker, and the relay that publishes
them.

Acceptance (``shared.acceptance``) writes an outbox row before the batch itself and removes
it once the broker confirms ``batch.<uuid>``. Every interval the relay takes the rows of its
own namespace (the exchange it publishes to) older than the grace period and finishes each
acceptance: if the batch is stored it rewrites its indexes and publishes it (a duplicate of a
publish that did succeed is harmless downstream) and removes the row; a cancelled batch's row
is removed; a batch not (yet) stored is left alone, because its write may still land, until
:data:`ABANDON_AFTER`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra.query import BoundStatement

from shared.db import Database, Row
from shared.errors import DependencyUnavailable

log = logging.getLogger(__name__)

#: Shards of one namespace's outbox; the relay scans each.
SHARDS = 16
#: An outbox row whose batch is still not stored this long after acceptance belongs to a
#: request that failed (its client got an error, and a retry with the same Idempotency-Key
#: finishes it through the API): the relay stops looking at it.
ABANDON_AFTER = timedelta(hours=1)

#: Finishes one batch's acceptance; returns None when the batch is not stored.
Finish = Callable[[uuid.UUID], Awaitable[Any]]


def shard_of(batch_id: uuid.UUID) -> int:
    return zlib.crc32(batch_id.bytes) % SHARDS


class Outbox:
    """The outbox rows of one broker namespace (the exchange batches are published to)."""

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def add(self, batch_id: uuid.UUID, user_id: uuid.UUID, created_at: datetime) -> None:
        await self.db.batch([await self.statement(batch_id, user_id, created_at)])

    async def statement(
        self, batch_id: uuid.UUID, user_id: uuid.UUID, created_at: datetime
    ) -> BoundStatement:
        """The outbox row's write, for a caller to send with the batch's own."""
        insert = await self.db.prepare(
            "INSERT INTO outbox (namespace, shard, batch_id, user_id, created_at) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        return insert.bind((self.namespace, shard_of(batch_id), batch_id, user_id, created_at))

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


async def relay_once(outbox: Outbox, finish: Finish, *, grace: float) -> int:
    """One pass over every shard; returns how many acceptances it finished."""
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=grace)
    finished = 0
    for shard in range(SHARDS):
        for row in await outbox.rows(shard):
            created = row["created_at"].replace(tzinfo=UTC)
            if created > cutoff:
                continue
            batch_id = row["batch_id"]
            if await finish(batch_id) is not None:
                finished += 1
            elif now - created > ABANDON_AFTER:
                await outbox.done(batch_id)
    return finished


async def relay_forever(outbox: Outbox, finish: Finish, *, interval: float, grace: float) -> None:
    while True:
        try:
            count = await relay_once(outbox, finish, grace=grace)
            if count:
                log.info("outbox relay finished %d acceptance(s)", count)
        except DependencyUnavailable as exc:
            log.warning("outbox relay: %s", exc)
        await asyncio.sleep(interval)
