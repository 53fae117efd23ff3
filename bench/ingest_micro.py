"""In-process micro-measurement of webhook ingest against the real Cassandra: CPU µs of this
process and Cassandra round trips per event, one SendGrid delivery at a time, applied event by
event (``Ingest.apply``, one logged batch each: the path before issue 34), each event as a
delivery of its own (``single``: a Mailgun post) and as a delivery (``Ingest.apply_all``:
grouped single-partition batches), in one run on a fresh keyspace.

    python -m bench.ingest_micro [--events 1000] [--posts 5]

Each post is ``--events`` events (``processed`` and ``delivered`` of half as many
recipients, in batches of 100); every post names recipients of its own, so both ways write
fresh rows. The figure counts this process only (the driver's I/O thread included), not
Cassandra's own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from shared.core.models import ATTEMPT_ARG, Address, Message, Recipient
from shared.core.webhook_events import ProviderEvent
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.recipients import log_id_for
from shared.infra.broker import Broker
from shared.infra.config import CassandraSettings, load_settings
from shared.infra.db import Database
from shared.infra.migrations import migrate
from shared.ingest.ingest import CONCURRENCY, Ingest, IngestMetrics
from shared.providers import sendgrid_events

BATCH = 100


class CountingDatabase(Database):
    """The production session, counting its requests (each one round trip)."""

    trips = 0

    async def execute(self, *args: Any, **kw: Any) -> Any:
        CountingDatabase.trips += 1
        return await super().execute(*args, **kw)


async def _batches(db: Database, recipients: int) -> list[NewBatch]:
    store = BatchStore(db)
    out = []
    for start in range(0, recipients, BATCH):
        batch_id = uuid.uuid1()
        emails = [f"r{start + i}.{batch_id.hex[:8]}@example.org" for i in range(BATCH)]
        batch = NewBatch(
            batch_id=batch_id,
            user_id=uuid.uuid4(),
            message=Message(sender=Address(email="news@example.com"), subject="Hi", text="x"),
            recipients=[
                Recipient(log_id=log_id_for(batch_id, e), email=e, name=None, substitutions={})
                for e in emails
            ],
            chunk_size=BATCH,
        )
        await store.write(batch)
        out.append(batch)
    return out


def _post(batches: list[NewBatch]) -> list[ProviderEvent]:
    now = int(time.time())
    items = []
    for b in batches:
        for r in b.recipients:
            for kind in ("processed", "delivered"):
                items.append(
                    {
                        "email": r.email,
                        "timestamp": now,
                        "event": kind,
                        "sg_event_id": uuid.uuid4().hex,
                        "sg_message_id": "m1.filter",
                        "batch_id": str(b.batch_id),
                        "chunk": "0",
                        "log_id": str(log_id_for(b.batch_id, r.email)),
                        ATTEMPT_ARG: "c.0",
                    }
                )
    raw = orjson.dumps(items)
    return list(sendgrid_events.parse_events(raw, received_at=datetime.now(UTC)).events)


async def _one_by_one(ingest: Ingest, events: list[ProviderEvent]) -> None:
    window = asyncio.Semaphore(CONCURRENCY)

    async def one(ev: ProviderEvent) -> None:
        async with window:
            await ingest.apply(ev)

    await asyncio.gather(*(one(ev) for ev in events))


async def _singly(ingest: Ingest, events: list[ProviderEvent]) -> None:
    """Each event a delivery of its own (Mailgun posts one event at a time)."""
    window = asyncio.Semaphore(CONCURRENCY)

    async def one(ev: ProviderEvent) -> None:
        async with window:
            await ingest.apply_all([ev])

    await asyncio.gather(*(one(ev) for ev in events))


async def main(events: int, posts: int) -> None:
    settings = load_settings()
    cassandra = CassandraSettings(
        **{**settings.cassandra.model_dump(), "keyspace": f"bench_ingest_{uuid.uuid4().hex[:8]}"}
    )
    await migrate(cassandra)
    db = await CountingDatabase.connect(cassandra, keyspace=cassandra.keyspace)
    try:
        ingest = Ingest.over(
            db, Broker.__new__(Broker), settings, IngestMetrics.create(CollectorRegistry())
        )
        ways = {"per event": _one_by_one, "single": _singly, "grouped": None}
        prepared = {
            way: [_post(await _batches(db, events // 2)) for _ in range(posts + 1)] for way in ways
        }
        for way, deliveries in prepared.items():
            warm, *measured = deliveries
            run = ways[way]
            await (ingest.apply_all(warm) if run is None else run(ingest, warm))
            trips, cpu, wall = CountingDatabase.trips, time.process_time(), time.perf_counter()
            for post in measured:
                if run is None:
                    await ingest.apply_all(post)
                else:
                    await run(ingest, post)
            n = sum(len(p) for p in measured)
            print(
                f"{way:>9}: {1e6 * (time.process_time() - cpu) / n:7.1f} CPU µs/event, "
                f"{(CountingDatabase.trips - trips) / n:5.3f} round trips/event, "
                f"{n / (time.perf_counter() - wall):7.0f} events/s ({n} events)"
            )
    finally:
        await db.execute(f"DROP KEYSPACE IF EXISTS {cassandra.keyspace}", timeout=120)
        await db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--posts", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.posts))
