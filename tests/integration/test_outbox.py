"""The outbox table as the relay reads it (real Cassandra)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from cassandra.util import uuid_from_time

from shared.delivery.outbox import Outbox
from shared.infra.db import Database
from tests.conftest import unique


async def test_a_written_row_is_unpublished_until_marked_done(db: Database) -> None:
    outbox = Outbox(db, unique("ns"))
    first, second = uuid_from_time(datetime.now(UTC)), uuid_from_time(datetime.now(UTC))
    for batch_id in (first, second):
        await outbox.add(batch_id, uuid.uuid4())
    buckets = {outbox.bucket(b) for b in (first, second)}

    async def unpublished() -> set[uuid.UUID]:
        return {b for minute, shard in buckets for b in await outbox.unpublished(minute, shard)}

    assert await unpublished() == {first, second}
    await outbox.done(first)
    assert await unpublished() == {second}
