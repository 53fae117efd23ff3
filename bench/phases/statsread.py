"""Reading a day's stats for a sender of 10 million recipients that day.

The outcome rows are seeded directly (one row per recipient in its bucket, as the webhook
intake writes them, each bucket marked changed an hour ago in ``stat_rows`` and in
``stat_dirty``, as the writes mark them). The day is then read through ``StatsStore.range``
exactly as ``GET /v1/stats`` reads it, by a store of its own each time it is cold:

- ``behind_ms``: a read before any roll-up (it serves what rollups there are, counts at most
  one small page per bucket, and starts the roll-ups);
- ``roll_seconds``: the roll-up of every bucket of the day at once (what a pass of the
  consumers' ``StatsStore.roll_due`` or that read starts), the lag of a read behind the
  writes on this day;
- ``cold_ms``: the first read after the writes once rolled up (figure
  ``stats_read_cold_ms_10m``), then ``ms_10m``, the median of the warm reads.

``rows_read_cold`` is how many stat rows the cold and warm reads counted: 0 (no recount in a
request). Run alone, small: ``python -m bench.phases.statsread --rows 100000`` (a keyspace of
its own, dropped after).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

import orjson
from cassandra.util import uuid_from_time

from bench.phases import Context, Result, phase
from shared.delivery.stats import StatsStore, batch_day, day_of, dirty_shard
from shared.infra.config import CassandraSettings
from shared.infra.db import Database
from shared.infra.migrations import migrate

#: Rows per seeding write (one partition each).
SEED_BATCH = 250
#: Seeding writes in flight.
SEED_WINDOW = 48
#: Timed warm reads.
READS = 25


async def _seed(stats: StatsStore, user_id: uuid.UUID, batch_id: uuid.UUID, rows: int) -> int:
    """Seed at least ``rows`` outcome rows (a whole number per bucket); returns how many."""
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
        ),
        *(
            db.execute(
                "UPDATE stat_dirty SET at = ? WHERE marked_on = ? AND shard = ? "
                "AND user_id = ? AND day = ? AND bucket = ?",
                (changed, day_of(changed), dirty_shard(user_id), user_id, day, b),
            )
            for b in range(stats.buckets)
        ),
    )
    await stats.activity(user_id, batch_id)
    return per_bucket * stats.buckets


async def _read(stats: StatsStore, user_id: uuid.UUID, day: date) -> tuple[float, dict[str, int]]:
    t0 = time.perf_counter()
    counts = (await stats.range(user_id, day, day))[day]
    return (time.perf_counter() - t0) * 1000, counts


async def measure(db: Database, rows: int, printer: Callable[[str], None]) -> Result:
    """Seed ``rows`` outcome rows of one user-day and time its reads (see the module)."""
    user_id, batch_id = uuid.uuid4(), uuid_from_time(time.time())
    day = batch_day(batch_id)
    seeder = StatsStore(db)
    t0 = time.perf_counter()
    seeded_rows = await _seed(seeder, user_id, batch_id, rows)
    seeded = time.perf_counter() - t0
    printer(f"seeded {rows:,} outcome rows in {seeded:.1f}s")
    # Behind: the first read before any roll-up, by a process of its own; the roll-ups it
    # starts (every bucket at once) are how long a read lags writes on this day.
    behind = StatsStore(db)
    behind_ms, _ = await _read(behind, user_id, day)
    t0 = time.perf_counter()
    await behind.rolled()
    roll_seconds = time.perf_counter() - t0
    # The consumers' pass finds the buckets current and drops their marks.
    await StatsStore(db).roll_due(datetime.now(UTC))
    reader = StatsStore(db)
    cold_ms, first = await _read(reader, user_id, day)
    warm = []
    for _ in range(READS):
        ms, again = await _read(reader, user_id, day)
        warm.append(ms)
    counted = first.get("success", 0) + first.get("failed", 0)
    ms = statistics.median(warm)
    printer(
        f"{counted:,} outcomes: read behind the roll-up {behind_ms:,.1f} ms, roll-up "
        f"{roll_seconds:,.1f} s, cold read {cold_ms:,.1f} ms ({reader.rows_counted} rows "
        f"counted), warm read median {ms:.1f} ms, max {max(warm):.1f} ms"
    )
    return {
        "rows": rows,
        "counted": counted,
        "agrees": again == first and counted == seeded_rows,
        "buckets": reader.buckets,
        "seed_seconds": seeded,
        "behind_ms": behind_ms,
        "roll_seconds": roll_seconds,
        "rows_read_cold": reader.rows_counted,
        "cold_ms": cold_ms,
        "cold_ms_10m": cold_ms if rows == 10_000_000 else None,
        "warm_ms": warm,
        "ms_10m": ms if rows == 10_000_000 else None,
        "ms_max": max(warm),
    }


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
    return await measure(db, 1_000_000 if ctx.config.quick else 10_000_000, ctx.printer)


async def _alone(rows: int) -> Result:
    settings = CassandraSettings(keyspace=f"bench_stats_{uuid.uuid4().hex[:12]}")
    await migrate(settings)
    db = await Database.connect(settings, keyspace=settings.keyspace)
    try:
        return await measure(db, rows, print)
    finally:
        await db.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", prepare=False, timeout=120)
        await db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.phases.statsread", description="the stats_read phase alone"
    )
    parser.add_argument("--rows", type=int, default=100_000, help="outcome rows to seed")
    result = asyncio.run(_alone(parser.parse_args(argv).rows))
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0 if result["agrees"] and result["rows_read_cold"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
