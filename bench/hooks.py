"""Child process for webhook ingest: the raw Cassandra loop and the signed-POST load.

``raw``: per post of ``per_post`` events, the rows their ``delivered`` events write (timeline
rows, the recipients' own rows, their outcome rows and their buckets' dirty marks), grouped
as the ingest groups a post's writes (:func:`plan_post`: one unlogged batch per partition,
all sent at once), with a window of posts in flight: no HTTP, no signature, no parsing, no
state machine, no reads. It does strictly less than the ingest of the same post, in as many
requests or fewer, so the pipeline can cost no less CPU per event (issue 34: one logged batch
per event cost more than the ingest's grouping, and the pipeline came out below it).
``sendgrid`` / ``mailgun``: signed posts to the running webhook service, SendGrid-style
batches of ``per_post`` events or Mailgun-style single events, ``concurrency`` in flight.
Each mode first seeds one batch of recipients (untimed) for the events to correlate with.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
from cassandra.query import BoundStatement
from cassandra.util import uuid_from_time

from bench.child import emit, hold, progress, run, wait_for_go
from sandbox import signing
from shared.core.models import Address, Message, Recipient
from shared.delivery.batchstore import BatchStore, NewBatch
from shared.delivery.recipients import log_id_for
from shared.delivery.stats import DEFAULT_BUCKETS, batch_day, bucket_of, dirty_shard
from shared.infra.config import load_settings
from shared.infra.db import Database


async def _seed(db: Database, user_id: uuid.UUID, count: int) -> tuple[uuid.UUID, list[Any]]:
    batch_id = uuid_from_time(time.time())
    message = Message(sender=Address(email="bench@example.com"), subject="hooks", text="x")
    store = BatchStore(db)
    first: list[Any] = []
    for i in range(0, count, 1000):
        part_id = batch_id if i == 0 else uuid_from_time(time.time())
        part = [
            Recipient(log_id=log_id_for(part_id, email), email=email)
            for email in (
                f"r{j}.{batch_id.hex[:6]}@example.com" for j in range(i, min(i + 1000, count))
            )
        ]
        batch = NewBatch(part_id, user_id, message, part, 1000)
        await store.write(batch)
        await store.index(batch)
        first = first or part
    return batch_id, first


@dataclass(frozen=True, slots=True)
class PostWrites:
    """Where the raw loop writes one post's events, grouped as the ingest groups a round
    (``RecipientStore.reported_many``): one unlogged batch per stat partition (its outcome
    rows and its dirty mark), one of the buckets' ``stat_dirty`` marks (the user's shard), and
    one of the states and timeline rows (the batch's partition)."""

    stats: dict[int, list[uuid.UUID]]
    """Per stats bucket, the log ids whose outcome rows it holds."""
    states: list[uuid.UUID]
    """The log ids whose state and timeline row go to the batch's partition."""

    @property
    def requests(self) -> int:
        """Cassandra requests of the post: one per group."""
        return len(self.stats) + 1 + (1 if self.states else 0)


def plan_post(log_ids: list[uuid.UUID], buckets: int = DEFAULT_BUCKETS) -> PostWrites:
    """The groups of one post's writes (pure): the ingest's partitions, without its reads,
    parsing, planning or de-duplication."""
    stats: dict[int, list[uuid.UUID]] = {}
    for log_id in log_ids:
        stats.setdefault(bucket_of(log_id, buckets), []).append(log_id)
    return PostWrites(stats, list(log_ids))


def posted(targets: list[Any], per_post: int, n: int) -> list[Any]:
    """The recipients of post ``n``: the same for the raw loop and the signed posts."""
    return targets[(n * per_post) % len(targets) :][:per_post]


async def raw(db: Database, user_id: uuid.UUID, spec: dict[str, Any]) -> dict[str, Any]:
    batch_id, targets = await _seed(db, user_id, 1000)
    per_post = int(spec["per_post"])
    insert, state, outcome, dirty, mark = [
        await db.prepare(cql)
        for cql in (
            "INSERT INTO log_events (batch_id, log_id, at, event_id, provider, kind, raw_event, "
            "detail) VALUES (?, ?, ?, ?, 'sg', 'delivered', 'delivered', '')",
            "UPDATE batches USING TIMESTAMP ? SET providers['sg'] = 'delivered', "
            "message_ids['sg'] = ?, event = 'delivered', last_update = ?, state = 'success' "
            "WHERE batch_id = ? AND chunk = 0 AND log_id = ?",
            "UPDATE stat_rows USING TIMESTAMP ? SET outcome = 'success' "
            "WHERE user_id = ? AND day = ? AND bucket = ? AND batch_id = ? AND log_id = ?",
            "UPDATE stat_rows SET dirty_at = ? WHERE user_id = ? AND day = ? AND bucket = ?",
            "UPDATE stat_dirty SET at = ? "
            "WHERE marked_on = ? AND shard = ? AND user_id = ? AND day = ? AND bucket = ?",
        )
    ]
    day, shard = batch_day(batch_id), dirty_shard(user_id)
    counter = iter(range(10**9))

    async def one() -> None:
        n = next(counter)
        now = datetime.now(UTC)
        stamp = int(now.timestamp()) * 1_000_000 + 3
        plan = plan_post([t.log_id for t in posted(targets, per_post, n)])
        groups: list[list[BoundStatement]] = [
            [
                dirty.bind((now, user_id, day, bucket)),
                *(outcome.bind((stamp, user_id, day, bucket, batch_id, i)) for i in ids),
            ]
            for bucket, ids in plan.stats.items()
        ]
        groups.append([mark.bind((now, now.date(), shard, user_id, day, b)) for b in plan.stats])
        groups.append(
            [
                stmt
                for i, log_id in enumerate(plan.states)
                for stmt in (
                    insert.bind((batch_id, log_id, now, f"raw-{n}-{i}")),
                    state.bind((stamp, "mid", now, batch_id, log_id)),
                )
            ]
        )
        # All at once: the ingest sends its stat rows before its states, a step more.
        await asyncio.gather(*(db.batch(g) for g in groups))

    return await _timed(spec, one, per_call=per_post, window=int(spec["window"]))


def _sendgrid_body(batch_id: uuid.UUID, targets: list[Any], per_post: int, n: int) -> bytes:
    now = int(time.time())
    return orjson.dumps(
        [
            {
                "email": t.email,
                "event": "delivered",
                "timestamp": now,
                "sg_event_id": f"{n}-{i}-{secrets.token_hex(4)}",
                "sg_message_id": "bench.filter0001",
                "batch_id": str(batch_id),
                "chunk": "0",
                "log_id": str(t.log_id),
            }
            for i, t in enumerate(posted(targets, per_post, n))
        ]
    )


async def post(db: Database, user_id: uuid.UUID, spec: dict[str, Any]) -> dict[str, Any]:
    batch_id, targets = await _seed(db, user_id, 1000)
    # The posts need no connection of ours: closed before the window (bench.cqlops).
    await db.close()
    mode, url, per_post = spec["mode"], spec["url"], int(spec.get("per_post", 1))
    key = signing.load_private_key(spec["sendgrid_private_key"])
    counter = iter(range(10**9))
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            n = next(counter)
            if mode == "sendgrid":
                body = _sendgrid_body(batch_id, targets, per_post, n)
                ts = str(int(time.time()))
                headers = {
                    "X-Twilio-Email-Event-Webhook-Signature": signing.sign_sendgrid(key, ts, body),
                    "X-Twilio-Email-Event-Webhook-Timestamp": ts,
                    "Content-Type": "application/json",
                }
            else:
                t = targets[n % len(targets)]
                body = orjson.dumps(
                    {
                        "signature": signing.mailgun_signature(
                            spec["mailgun_key"], int(time.time())
                        ),
                        "event-data": {
                            "event": "delivered",
                            "id": f"b{n}",
                            "timestamp": time.time(),
                            "recipient": t.email,
                            "message": {"headers": {"message-id": "bench@mg"}},
                            "user-variables": {
                                "batch_id": str(batch_id),
                                "chunk": "0",
                                "log_id": str(t.log_id),
                            },
                        },
                    }
                )
                headers = {"Content-Type": "application/json"}
            async with http.post(f"{url}/webhooks/{mode}", data=body, headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"webhook answered {resp.status}: {await resp.text()}")

        per_call = per_post if mode == "sendgrid" else 1
        return await _timed(spec, one, per_call=per_call, window=int(spec["concurrency"]))


async def _timed(spec: dict[str, Any], one: Any, *, per_call: int, window: int) -> dict[str, Any]:
    emit("ready")
    await wait_for_go()
    warmup, duration = float(spec["warmup"]), float(spec["duration"])
    start = time.time()
    w_start, w_end = start + warmup, start + warmup + duration
    done: list[float] = []

    async def worker() -> None:
        while time.time() < w_end:
            await one()
            done.append(time.time())

    async def report() -> None:
        while time.time() < w_end:
            await asyncio.sleep(2.5)
            recent = sum(1 for t in done if t > time.time() - 2.5) * per_call / 2.5
            progress(f"{recent:,.0f} events/s")

    reporter = asyncio.create_task(report())
    await asyncio.gather(*(worker() for _ in range(window)))
    reporter.cancel()
    await hold()
    counted = sum(1 for t in done if w_start <= t <= w_end) * per_call
    return {
        # Posts (raw: logged batches) of the whole run, warm-up included.
        "calls": len(done),
        "events": counted,
        "events_per_s": counted / duration,
        "window_start": w_start,
        "window_end": w_end,
    }


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    settings = load_settings()
    db = await Database.connect(settings.cassandra, keyspace=settings.cassandra.keyspace)
    user_id = uuid.UUID(spec["user_id"])
    if spec["mode"] != "raw":
        return await post(db, user_id, spec)
    try:
        return await raw(db, user_id, spec)
    finally:
        await db.close()


if __name__ == "__main__":
    run(main)
