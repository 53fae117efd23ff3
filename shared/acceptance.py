"""Accepting a batch durably, and finishing an acceptance that stopped part-way.

The order is what makes a crash at any point safe:

1. an outbox row (``shared.outbox``): from here on the relay will look after the batch;
2. the batch partition, header and chunks, as one mutation: the batch exists or not
   (sent in one request with (1): if it fails the request fails and the batch is cancelled,
   so the relay never publishes a batch whose client was told it failed);
3. the indexes (the user's list, the batch's ``queued`` stat row), rewritable from (2);
4. a confirmed publish of ``batch.<uuid>``, then the outbox row marked published.

:meth:`Acceptance.finish` redoes (3) and (4) for a stored batch from what (2) stored. The
relay calls it for outbox rows left behind; the API calls it when a retried request (same
``Idempotency-Key``) finds the batch stored, and answers with the 202 stored in (2).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from cassandra.query import Statement

from shared.batchstore import BatchHeader, BatchStore, NewBatch
from shared.broker import Broker
from shared.errors import PublishError
from shared.models import BatchJob
from shared.outbox import Outbox
from shared.topology import batch_key

log = logging.getLogger(__name__)


@dataclass
class Acceptance:
    batches: BatchStore
    outbox: Outbox
    broker: Broker

    async def store(self, batch: NewBatch, *, also: Sequence[Statement] = ()) -> None:
        """Steps 1-3, with the writes ``also`` of other partitions in (2)'s request. A
        scheduled batch has no outbox row: its schedule row (in ``also``) stands for it.
        Raises DependencyUnavailable if any fails (the batch may or may not be stored then:
        a retry with the same id and body writes the same rows)."""
        own = [] if batch.send_at else [await self.outbox.statement(batch.batch_id, batch.user_id)]
        await self.batches.write(batch, also=[*own, *also])
        await self.batches.index(batch)

    async def publish(self, batch_id: uuid.UUID) -> bool:
        """Step 4's publish; False when the broker did not confirm (the relay will publish)."""
        try:
            await self.broker.publish(
                batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
            )
        except PublishError as exc:
            log.warning("batch %s stored but not yet published (%s); the relay will", batch_id, exc)
            return False
        return True

    async def finish(self, batch_id: uuid.UUID) -> BatchHeader | None:
        """Finish a stored batch's acceptance; None if it is not stored (or was cancelled).

        Raises DependencyUnavailable (PublishError included) when it cannot finish now.
        """
        header = await self.batches.header(batch_id)
        if header is None:
            return None
        if header.status == "cancelled":
            await self.outbox.done(batch_id)
            return None
        if header.status == "scheduled":
            # The scheduler publishes it when its time comes; only the indexes may lack.
            await self.batches.index_stored(header)
            return header
        if header.status == "accepted":
            # Not yet split by a consumer: the indexes may be missing and it may never have
            # been published. Both are harmless to repeat.
            await self.batches.index_stored(header)
            await self.broker.publish(
                batch_key(batch_id), BatchJob(batch_id=batch_id).encode(), message_id=str(batch_id)
            )
        await self.outbox.done(batch_id)
        return header
