"""Reading a day's stats for a sender of 10 million recipients that day.

The outcome rows are seeded directly (one row per recipient in its bucket, as the webhook
intake writes them, the buckets marked changed an hour ago), then the day is read through
``StatsStore.range`` exactly as ``GET /v1/stats`` reads it: the first read recounts every
bucket (cold, reported separately); the following reads find each bucket's rollup current
and cost O(buckets). ``ms_10m`` is the median of the warm reads.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from cassandra.util import uuid_from_time

from bench.phases import Context, Result, phase
from shared.stats import StatsStore, batch_day

#: Rows per seeding write (one partition each).
SEED_BATCH = 250
#: Seeding writes in flight.
SEED_WINDOW = 48
#: Timed warm reads.
READS = 25


async def _seed(stats: StatsStore, user_id: uuid.UUID, batch_id: uuid.UUID, rows: int) -> None:
    db = stats.db
    day = batch_day(batch_id)
    insert = await db.prepare(
        "INSERT INTO stat_rows (user_id, day, bucket, batch_id, log_id, outcome, opened) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    per_bucket = -(-rows // stats.buckets)
    window = asyncio.Semaphore(SEED_WINDOW)
    base = batch_id.int >> 64 << 64

    async def write(bucket: int, start: int, count: int) -> None:
        async with window:
            stmts = []
            for i in range(start, start + count):
                # Log ids whose bucket (low 48 bits mod B) is ``bucket``.
                log_id = uuid.UUID(int=base | 0x8000 << 48 | (i * stats.buckets + bucket))
                outcome = "failed" if i % 50 == 0 else "success"
                stmts.append(
                    insert.bind((user_id, day, bucket, batch_id, log_id, outcome, i % 5 == 0))
                )
            await db.batch(stmts)

    await asyncio.gather(
        *(
            write(b, s, min(SEED_BATCH, per_bucket - s))
            for b in range(stats.buckets)
            for s in range(0, per_bucket, SEED_BATCH)
        )
    )
    changed = datetime.now(UTC) - timedelta(hours=1)
    await asyncio.gather(
        *(
            db.execute(
                "UPDATE stat_rows SET dirty_at = ? WHERE user_id = ? AND day = ? AND bucket = ?",
                (changed, user_id, day, b),
            )
            for b in range(stats.buckets)
        )
    )
    await stats.activity(user_id, batch_id)


@phase(
    "stats_read",
    group="C",
    order=90,
    needs=(),
    description="GET /v1/stats's read of a day with 10M outcome rows (seeded directly)",
)
async def stats_read(ctx: Context) -> Result:
    db = ctx.stack.db
    assert db is not None  # noqa: S101
    rows = 1_000_000 if ctx.config.quick else 10_000_000
    stats = StatsStore(db)
    user_id, batch_id = uuid.uuid4(), uuid_from_time(time.time())
    day = batch_day(batch_id)
    t0 = time.perf_counter()
    await _seed(stats, user_id, batch_id, rows)
    seeded = time.perf_counter() - t0
    ctx.printer(f"seeded {rows:,} outcome rows in {seeded:.1f}s")
    t0 = time.perf_counter()
    first = (await stats.range(user_id, day, day))[day]
    cold_ms = (time.perf_counter() - t0) * 1000
    warm = []
    for _ in range(READS):
        t0 = time.perf_counter()
        again = (await stats.range(user_id, day, day))[day]
        warm.append((time.perf_counter() - t0) * 1000)
    counted = first.get("success", 0) + first.get("failed", 0)
    ms = statistics.median(warm)
    ctx.printer(
        f"{counted:,} outcomes: cold read (recount of {stats.buckets} buckets) {cold_ms:,.0f} ms, "
        f"warm read median {ms:.1f} ms, max {max(warm):.1f} ms"
    )
    return {
        "rows": rows,
        "counted": counted,
        "agrees": again == first and counted == rows,
        "buckets": stats.buckets,
        "seed_seconds": seeded,
        "cold_ms": cold_ms,
        "warm_ms": warm,
        "ms_10m": ms if rows == 10_000_000 else None,
        "ms_max": max(warm),
    }
