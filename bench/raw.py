"""Raw baselines, run as a child process: the least work acceptance and dispatch must do.

``python -m bench.raw '{"mode": "accept", ...}'`` -- **L_accept**, the physical minimum of an
acceptance: a bare loop (no HTTP, no validation, no outbox, no indexes) that, per batch, makes
one single-partition mutation of the batch with its recipients (:meth:`BatchStore.write`, the
data the API would build) and one confirmed publish of ``batch.<uuid>``, with ``window``
batches in flight. Everything the API does beyond this is overhead the ratio shows.
Both modes :func:`bench.child.hold` once their work is done, before closing their connections.

``python -m bench.raw '{"mode": "e2e", ...}'`` -- **L_e2e**: seeds a corpus of batches
(untimed; then ``ready``, and it waits for ``go``), publishes one ``sg.<uuid>`` chunk job
per chunk and consumes them with ``prefetch``: per job, the attempt claim (LWT), the
SendGrid adapter's request to the sandbox for the same chunk, ``finish`` and the
recipient-row update, then the ack. It skips what the real dispatcher also does (reading
attempts, the header and the chunk's rows; the splitter hop), which is the overhead the
end-to-end ratio shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aio_pika
import aio_pika.abc

from bench import child
from bench.workload import BatchFactory
from shared.core.models import BatchJob, ChunkJob
from shared.delivery.attempts import AttemptStore, chunk_line, tag
from shared.delivery.batchstore import Batches, BatchStore
from shared.delivery.recipients import RecipientStore, Selection
from shared.infra.broker import Broker, connect_nodes
from shared.infra.config import Settings, load_settings
from shared.infra.db import Database
from shared.infra.resources import topology_for
from shared.infra.topology import batch_key, dispatch_key
from shared.providers.sendgrid import SendGridProvider

#: Seconds between progress lines.
REPORT_EVERY = 3.0
#: Seconds without progress after which a dispatch loop gives up (and says so).
STALL = 20.0
#: Recipients of the batches being seeded at once (see :func:`seed`).
SEED_RECIPIENTS_IN_FLIGHT = 6400


async def _connect(settings: Settings, name: str) -> tuple[Database, Broker]:
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    broker = Broker(
        settings.amqp.url.get_secret_value(),
        topology_for(settings),
        publish_timeout=settings.amqp.publish_timeout,
        name=name,
    )
    await broker.connect()
    return db, broker


async def accept(spec: dict[str, Any]) -> dict[str, Any]:
    """L_accept: ``window`` workers accept and publish batches for ``warmup + duration`` s."""
    settings = load_settings()
    db, broker = await _connect(settings, "bench-raw-accept")
    store = BatchStore(db)
    factory = BatchFactory(int(spec["recipients"]), settings.providers.chain_codes)
    user_id = uuid.UUID(spec["user_id"])
    warmup, duration = float(spec["warmup"]), float(spec["duration"])
    done: list[float] = []
    seq = iter(range(10**12))
    t_start = time.time()
    w_start, w_end = t_start + warmup, t_start + warmup + duration

    async def worker() -> None:
        while time.time() < w_end:
            batch = factory.new(next(seq), user_id)
            await store.write(batch)
            await broker.publish(
                batch_key(batch.batch_id),
                BatchJob(batch_id=batch.batch_id).encode(),
                message_id=str(batch.batch_id),
            )
            done.append(time.time())

    reporter = asyncio.create_task(_report(done, w_start, "batches/s", factory.size))
    try:
        await asyncio.gather(*(worker() for _ in range(int(spec["window"]))))
        reporter.cancel()
        await child.hold()
    finally:
        reporter.cancel()
        await broker.close()
        await db.close()
    counted = sum(1 for t in done if w_start <= t < w_end)
    return {
        "window_start": w_start,
        "window_end": w_end,
        "batches": counted,
        "recipients": counted * factory.size,
        "batches_per_s": counted / duration,
        "recipients_per_s": counted * factory.size / duration,
        "total_batches": len(done),
    }


async def _report(done: list[float], w_start: float, unit: str, size: int) -> None:
    last_n, last_t = 0, time.time()
    while True:
        await asyncio.sleep(REPORT_EVERY)
        now, n = time.time(), len(done)
        rate = (n - last_n) / (now - last_t)
        phase = "warm-up" if now < w_start else "measuring"
        child.progress(f"{phase}: {rate:,.0f} {unit} ({rate * size:,.0f} recipients/s)")
        last_n, last_t = n, now


async def seed(
    store: Batches,
    factory: BatchFactory,
    user_id: uuid.UUID,
    count: int,
    *,
    replayable: bool = False,
) -> list[tuple[uuid.UUID, float, int]]:
    """Accept ``count`` batches (untimed) with a few in flight; ``(id, time, seq)`` each.

    No outbox row is written: the batch is then exactly what an accepted and published batch
    leaves in Cassandra. In-flight batches are bounded by size:
    64 batches of 1,000 recipients fill the driver's socket buffer, and the libev reactor
    then fails requests at once (``ConnectionBusy``) instead of waiting.
    """
    window = min(64, max(4, SEED_RECIPIENTS_IN_FLIGHT // factory.size))
    corpus: list[tuple[uuid.UUID, float, int]] = []
    seqs = iter(range(count))
    t0 = time.monotonic()

    async def worker() -> None:
        for seq in seqs:
            if replayable:
                batch, batch_time = factory.new_replayable(seq, user_id)
            else:
                batch, batch_time = factory.new(seq, user_id), time.time()
            await store.write(batch)
            await store.index(batch)
            corpus.append((batch.batch_id, batch_time, seq))
            if len(corpus) % 2000 == 0:
                child.progress(f"seeding: {len(corpus):,}/{count:,} batches")

    await asyncio.gather(*(worker() for _ in range(window)))
    child.progress(f"seeded {count:,} batches in {time.monotonic() - t0:.1f}s")
    return corpus


async def e2e(spec: dict[str, Any]) -> dict[str, Any]:
    """L_e2e: consume chunk jobs, send, record, ack; timed from first publish to last ack."""
    settings = load_settings()
    db, broker = await _connect(settings, "bench-raw-e2e")
    store, attempts, states = BatchStore(db), AttemptStore(db), RecipientStore(db)
    factory = BatchFactory(int(spec["recipients"]), settings.providers.chain_codes)
    provider = SendGridProvider.from_settings(settings.providers)
    corpus = await seed(
        store, factory, uuid.UUID(spec["user_id"]), int(spec["batches"]), replayable=True
    )
    by_id = {batch_id: (batch_time, seq) for batch_id, batch_time, seq in corpus}
    jobs = [
        (batch_id, chunk)
        for batch_id, _, _ in corpus
        for chunk in range(-(-factory.size // factory.chunk_size))
    ]
    acked: list[tuple[float, int]] = []
    all_done = asyncio.Event()

    async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        job = ChunkJob.decode(message.body)
        batch_time, seq = by_id[job.batch_id]
        chunk = factory.chunk(seq, job.batch_id, batch_time, job.chunk)
        # The protocol's minimum: claim as calling, call, accepted (two LWTs), recipients.
        line, owner = chunk_line(job.chunk), uuid.uuid4()
        started = datetime.now(UTC)
        claimed = await attempts.create(
            job.batch_id,
            line,
            job.attempt,
            chunk=job.chunk,
            provider=provider.code,
            state="calling",
            owner=owner,
            calling_at=started,
        )
        if not claimed:
            raise RuntimeError(f"attempt of {job.batch_id}/{job.chunk} already claimed")
        receipt = await provider.send(chunk)
        await attempts.transition(
            job.batch_id,
            line,
            job.attempt,
            expect={"state": "calling", "owner": owner},
            values={
                "state": "accepted",
                "status_code": receipt.status,
                "message_id": receipt.message_id,
                "finished_at": datetime.now(UTC),
                "decision": "done",
            },
        )
        await states.accepted(
            job.batch_id,
            Selection(job.chunk, tuple(r.log_id for r in chunk.recipients), whole=True),
            provider=provider.code,
            tag=tag(line, job.attempt),
            when=started,
            message_id=receipt.message_id,
        )
        await message.ack()
        acked.append((time.time(), len(chunk.recipients)))
        if len(acked) == len(jobs):
            all_done.set()

    connection = await connect_nodes(settings.amqp.url.get_secret_value(), name="bench-raw")
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=int(spec["prefetch"]))
    queue = await channel.get_queue(topology_for(settings).provider_queue(provider.code))
    await queue.consume(handle)
    window = asyncio.Semaphore(64)

    async def publish(batch_id: uuid.UUID, chunk: int) -> None:
        async with window:
            await broker.publish(
                dispatch_key(provider.code, batch_id, 0),
                ChunkJob(batch_id=batch_id, chunk=chunk).encode(),
                message_id=f"{batch_id}:{chunk}:0",
            )

    # Seeded: the parent reads Cassandra's counters now, and again at hold().
    child.emit("ready")
    await child.wait_for_go()
    t_first = time.time()
    reporter = asyncio.create_task(_report_acks(acked, t_first))
    await asyncio.gather(*(publish(b, c) for b, c in jobs))
    stalled = await _wait_done(all_done, acked, t_first + float(spec["max_seconds"]))
    if not all_done.is_set():
        why = f"no ack for {STALL:.0f}s" if stalled else f"{spec['max_seconds']}s passed"
        child.progress(f"stopped ({why}) with {len(acked):,}/{len(jobs):,} chunks done")
    reporter.cancel()
    await child.hold()
    await connection.close()
    t_last = max((t for t, _ in acked), default=time.time())
    recipients = sum(n for _, n in acked)
    await provider.aclose()
    await broker.close()
    await db.close()
    elapsed = t_last - t_first
    return {
        "window_start": t_first,
        "window_end": t_last,
        "chunks": len(acked),
        "chunks_expected": len(jobs),
        "complete": len(acked) == len(jobs),
        "stalled": stalled,
        "recipients": recipients,
        "seconds": elapsed,
        "recipients_per_s": recipients / elapsed if elapsed > 0 else 0.0,
        "chunks_per_s": len(acked) / elapsed if elapsed > 0 else 0.0,
        "prefetch": int(spec["prefetch"]),
        "chunk_size": factory.chunk_size,
    }


async def _wait_done(done: asyncio.Event, acked: list[tuple[float, int]], deadline: float) -> bool:
    """Wait for ``done`` until ``deadline``; True if acks stopped coming for :data:`STALL`
    seconds first (a broker or Cassandra restart by another user of the machine)."""
    while not done.is_set() and time.time() < deadline:
        last = acked[-1][0] if acked else None
        if last is not None and time.time() - last > STALL:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 1.0)
    return False


async def _report_acks(acked: list[tuple[float, int]], t_first: float) -> None:
    last_r, last_t = 0, time.time()
    while True:
        await asyncio.sleep(REPORT_EVERY)
        now = time.time()
        total = sum(n for _, n in acked)
        child.progress(
            f"{now - t_first:5.1f}s: {len(acked):,} chunks, "
            f"{(total - last_r) / (now - last_t):,.0f} recipients/s"
        )
        last_r, last_t = total, now


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    modes = {"accept": accept, "e2e": e2e}
    return await modes[spec["mode"]](spec)


if __name__ == "__main__":
    child.run(main)
