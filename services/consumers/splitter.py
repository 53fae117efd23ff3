"""The ``batch.#`` consumer: turns an accepted batch into one dispatch job per chunk.

Chunks were fixed at acceptance (no larger than the smallest provider limit in the chain), so
splitting is publishing ``[bulk.]<first provider>.<batch_uuid>`` (the batch's lane, decided at
acceptance) once per chunk with confirms, then
marking the batch ``dispatched``. A redelivery republishes; the sender's attempt claims make
those duplicates harmless.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aio_pika.abc

from shared.core.models import BatchJob, ChunkJob
from shared.delivery.batchstore import Batches
from shared.delivery.handoff import Route
from shared.infra.broker import Broker
from shared.infra.logs import bound
from shared.infra.settle import Delivery, Poison
from shared.infra.topology import dispatch_key, parse_routing_key

#: Confirmed publishes in flight while fanning out one batch.
PUBLISH_WINDOW = 64


@dataclass
class Splitter:
    broker: Broker
    batches: Batches
    running: Callable[[], Route]
    """The running chain in force (live settings, health): new chunks go to its head."""

    async def process(
        self, message: aio_pika.abc.AbstractIncomingMessage, delivery: Delivery
    ) -> None:
        key = parse_routing_key(message.routing_key or "")
        if key.kind != "batch":
            raise Poison(f"not a batch key: {message.routing_key}")
        job = BatchJob.decode(message.body)
        if job.batch_id != key.id:
            raise Poison("routing key and body disagree")
        with bound(batch_id=job.batch_id):
            await self.split(job)

    async def split(self, job: BatchJob) -> None:
        header = await self.batches.header(job.batch_id)
        if header is None:
            raise Poison(f"batch {job.batch_id} does not exist")
        if header.status != "accepted":
            # Fanned out already (a redelivery or a relay duplicate), or cancelled; never one
            # still pending or scheduled (nothing publishes it before it is accepted).
            return
        window = asyncio.Semaphore(PUBLISH_WINDOW)
        # A batch that pins a provider starts there; any other at the running chain's head.
        message = header.message
        first = message.provider or self.running().chain[0]
        key = dispatch_key(first, job.batch_id, 0, message.lane)

        async def publish(chunk: int) -> None:
            async with window:
                await self.broker.publish(
                    key,
                    ChunkJob(batch_id=job.batch_id, chunk=chunk).encode(),
                    message_id=f"{job.batch_id}:{chunk}:0",
                )

        await asyncio.gather(*(publish(i) for i in range(header.chunk_count)))
        await self.batches.mark_dispatched(job.batch_id)
