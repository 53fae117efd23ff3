"""End-to-end dispatch through the real consumers and the sandbox, fed by accepted batches.

:mod:`bench.feeder` stores a corpus through ``BatchStore`` (untimed), then publishes one
``batch.<uuid>`` per batch; the consumers process splits, sends through the sandbox's
SendGrid stand-in and marks the rows ``sent``. The clock runs from the first publish to the
``finished_at`` of the last chunk attempt (written just before the recipient rows, to the
millisecond, by the consumer itself), so polling adds no error. Completion is checked three
ways: the sandbox accepted every recipient, every chunk has a ``sent`` attempt, and sampled
batches have every recipient row at ``sent``. The corpus is sized from L_e2e to last
``e2e_seconds``.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from datetime import UTC

from bench import cqlops
from bench.phases import Context, Result, phase
from bench.stats import per_second, spread_window
from shared.delivery.recipients import RecipientStore

#: Seconds between progress lines while draining.
REPORT_EVERY = 2.5
#: Batches whose recipient rows are read back after a drain.
ROW_SAMPLE = 50
#: Seconds without a recipient reaching the provider after which a drain is abandoned.
STALL = 20.0
#: Recipients/s assumed when no L_e2e figure exists (the phase ran alone).
FALLBACK_RATE = 5_000.0


def corpus_batches(
    rate: float, seconds: float, recipients: int, lo: int, hi_recipients: int
) -> int:
    """Batches that keep a drain at ``rate`` recipients/s busy for ``seconds``, bounded."""
    wanted = math.ceil(rate * seconds / recipients)
    return max(lo, min(wanted, max(lo, hi_recipients // recipients)))


async def _drain(ctx: Context, recipients: int, baseline: str) -> Result:
    cfg, stack = ctx.config, ctx.stack
    rate = float(ctx.results.get(baseline, {}).get("recipients_per_s") or FALLBACK_RATE)
    batches = corpus_batches(
        rate, cfg.e2e_seconds, recipients, cfg.e2e_min_batches, cfg.e2e_max_recipients
    )
    feeder = ctx.child(
        f"feeder-{recipients}",
        "bench.feeder",
        {"recipients": recipients, "batches": batches, "user_id": str(stack.user_id)},
    )
    await feeder.start()
    ready = await feeder.next_message("ready", timeout=900)
    ids = {uuid.UUID(b) for b in ready["batch_ids"]}
    expected, chunks = int(ready["recipients"]), int(ready["chunks"])
    before = (await stack.sandbox_sends())["sendgrid"]
    ops_before = await ctx.cassandra_ops()
    await feeder.go()
    finished = asyncio.create_task(feeder.finish(timeout=cfg.e2e_timeout + 60))
    sent, depths = await _watch(ctx, before, expected, time.time())
    feed = await finished
    # Before the checks below: their reads are the bench's, not the drain's.
    ops_after = await ctx.cassandra_ops(settled=True)
    attempts = await _sent_attempts(ctx, ids, chunks)
    t0 = float(feed["first_publish"])
    done_at = sorted(attempts.values())
    complete = len(done_at) == chunks
    t_end = done_at[-1] if done_at else time.time()
    per_chunk = expected / chunks
    seconds = t_end - t0
    result: Result = {
        "batch_recipients": recipients,
        "batches": batches,
        "chunks": chunks,
        "recipients": expected,
        "complete": complete,
        "chunks_sent": len(done_at),
        "sandbox_recipients": sent,
        "first_publish": t0,
        "last_publish": feed["last_publish"],
        "window_start": t0,
        "window_end": t_end,
        "seconds": seconds,
        "recipients_per_s": per_second(len(done_at) * per_chunk, seconds),
        "chunks_per_s": per_second(len(done_at), seconds),
        "first_chunk_after_s": (done_at[0] - t0) if done_at else None,
        "max_queue_depth": depths,
    }
    if len(done_at) >= 10:
        lo, hi = spread_window(done_at, 0.1, 0.9)
        result["steady_recipients_per_s"] = per_second(0.8 * len(done_at) * per_chunk, hi - lo)
    result["cassandra_ops_per_batch"] = ops = cqlops.per_unit(
        ops_before, ops_after, whole_batches(attempts, chunks // batches)
    )
    if not complete:
        ops.setdefault("why", []).append("drain incomplete: the part-sent batches are left out")
    result["rows_checked"], result["rows_sent"] = await _check_rows(ctx, ids)
    result["usage"] = ctx.usage(t0, t_end, len(done_at) * per_chunk)
    result["purged"] = await stack.purge(*stack.work_queues())
    ctx.printer(
        f"e2e (N={recipients}): {result['recipients_per_s']:,.0f} recipients/s over "
        f"{seconds:.1f}s, {len(done_at):,}/{chunks:,} chunks sent, sampled rows "
        f"{result['rows_sent']:,}/{result['rows_checked']:,} sent"
    )
    ctx.printer(f"e2e (N={recipients}): Cassandra {cqlops.summary(ops)}")
    return result


def whole_batches(attempts: dict[tuple[uuid.UUID, int], float], chunks_per_batch: int) -> int:
    """Batches every chunk of which was sent: what a drain's Cassandra operations are divided
    by (a batch half sent did only part of its work)."""
    sent: dict[uuid.UUID, int] = {}
    for batch_id, _ in attempts:
        sent[batch_id] = sent.get(batch_id, 0) + 1
    return sum(1 for n in sent.values() if n >= chunks_per_batch)


async def _watch(
    ctx: Context, before: dict[str, int], expected: int, t0: float
) -> tuple[int, dict[str, int]]:
    """Poll the sandbox until it accepted ``expected`` recipients (or time runs out)."""
    stack, cfg = ctx.stack, ctx.config
    queues = {"batches": stack.topology.batches_queue, "sg": stack.topology.provider_queue("sg")}
    depths = dict.fromkeys(queues, 0)
    last_report, last_sent, sent = time.time(), 0, 0
    last_change, seen = time.time(), -1
    while time.time() - t0 < cfg.e2e_timeout:
        sent = (await stack.sandbox_sends())["sendgrid"]["recipients"] - before["recipients"]
        if sent >= expected:
            break
        now = time.time()
        if sent != seen:
            last_change, seen = now, sent
        elif now - last_change > STALL:
            ctx.printer(f"no progress for {STALL:.0f}s: stopping with {sent:,}/{expected:,}")
            break
        if now - last_report >= REPORT_EVERY:
            for name, queue in queues.items():
                depth = await stack.depth(queue)
                depths[name] = max(depths[name], depth)
            ctx.printer(
                f"{now - t0:5.1f}s: {sent:,}/{expected:,} recipients at the provider, "
                f"{(sent - last_sent) / (now - last_report):,.0f}/s; ready in queues: "
                + ", ".join(f"{k} {v:,}" for k, v in depths.items())
            )
            last_report, last_sent = now, sent
        await asyncio.sleep(0.2)
    else:
        ctx.printer(f"drain incomplete after {cfg.e2e_timeout:.0f}s: {sent:,}/{expected:,}")
    return sent, depths


async def _sent_attempts(
    ctx: Context, ids: set[uuid.UUID], chunks: int, wait: float = 10.0
) -> dict[tuple[uuid.UUID, int], float]:
    """``finished_at`` (epoch seconds) of every accepted attempt of the corpus's chunks."""
    db = ctx.stack.db
    assert db is not None  # noqa: S101
    deadline = time.monotonic() + wait
    while True:
        rows = await db.all_pages(
            "SELECT batch_id, line, chunk, state, finished_at FROM send_attempts", page_size=5000
        )
        found = {
            (r["batch_id"], r["chunk"]): r["finished_at"].replace(tzinfo=UTC).timestamp()
            for r in rows
            if r["batch_id"] in ids
            and r["line"].startswith("c")
            and r["state"] == "accepted"
            and r["finished_at"] is not None
        }
        if len(found) >= chunks or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


async def _check_rows(ctx: Context, ids: set[uuid.UUID]) -> tuple[int, int]:
    """Read back the recipient rows of a sample of batches: ``(rows read, rows sent)``."""
    db = ctx.stack.db
    assert db is not None  # noqa: S101
    sample = random.sample(sorted(ids), min(ROW_SAMPLE, len(ids)))
    checked = sent = 0
    for batch_id in sample:
        rows = await RecipientStore(db).batch_rows(batch_id)
        checked += len(rows)
        sent += sum(1 for r in rows if r["event"] == "sent")
    return checked, sent


@phase(
    "e2e",
    group="B",
    order=30,
    needs={"sandbox", "consumers"},
    description="real consumers + sandbox draining pre-accepted N=100 batches",
)
async def e2e(ctx: Context) -> Result:
    return await _drain(ctx, ctx.config.recipients, "l_e2e")


@phase(
    "e2e_1000",
    group="B",
    order=40,
    needs={"sandbox", "consumers"},
    description="real consumers + sandbox draining pre-accepted 1,000-recipient batches",
)
async def e2e_1000(ctx: Context) -> Result:
    return await _drain(ctx, ctx.config.big_recipients, "l_e2e_1000")
