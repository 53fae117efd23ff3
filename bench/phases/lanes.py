"""Priority lanes under load: transactional mail while a large bulk send drains (issue 13).

:mod:`bench.feeder` seeds the bulk corpus (untimed): ``lanes_bulk_recipients`` recipients in
batches of ``lanes_bulk_batch`` that ask for ``priority: bulk``, stored as the API stores them,
then publishes them all. Once the sandbox has received the first bulk recipients, this process
posts a one-recipient batch (no ``priority``: small, so transactional) to the API every
``lanes_interval`` seconds, without waiting for the answers, until the bulk corpus has reached
the sandbox (or ``lanes_timeout`` passes, or the drain stalls).

A transactional batch's time to provider runs from just before its POST to the ``finished_at``
of its chunk's accepted attempt: the consumer writes it as soon as the provider answered, so it
is a close upper bound of when the sandbox received the message, on the clock the e2e phases
use. A batch that never got there within :data:`WAIT_FOR_LATE` seconds of the end counts as
that long. Target: p99 <= ``lanes_target_p99`` (2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping

import aiohttp
import orjson

from bench.phases import Context, Result, phase
from bench.stats import latency_summary, per_second
from shared.delivery.attempts import Attempt, AttemptStore, chunk_line

#: Seconds between progress lines.
REPORT_EVERY = 2.5
#: Seconds without a bulk recipient reaching the provider after which the drain is abandoned.
STALL = 30.0
#: Seconds to wait after the drain for transactional batches still on their way.
WAIT_FOR_LATE = 30.0


def time_to_provider(
    submitted: Mapping[uuid.UUID, float],
    reached: Mapping[uuid.UUID, float],
    *,
    target: float,
    late: float = WAIT_FOR_LATE,
) -> Result:
    """The transactional figures: seconds from submission to the provider of each accepted
    batch (a batch that never got there counts as ``late``), their summary, and whether the
    p99 is within ``target`` seconds."""
    seconds = [reached[b] - t if b in reached else late for b, t in submitted.items()]
    summary = latency_summary(seconds)
    p99 = summary["p99"]
    return {
        "batches": len(submitted),
        "reached": sum(1 for b in submitted if b in reached),
        "missing": sum(1 for b in submitted if b not in reached),
        "time_to_provider_s": summary,
        "target_p99_s": target,
        "within_target": None if p99 is None else p99 <= target,
    }


def transactional_body(n: int, tag: str) -> bytes:
    """A small password-reset-like batch to one address of its own."""
    return orjson.dumps(
        {
            "from": {"email": "alerts@shop.example.com", "name": "Example Shop"},
            "to": [f"tx{n}.{tag}@example.org"],
            "subject": "Your sign-in code",
            "text": f"Your sign-in code is {n % 1_000_000:06d}.",
        }
    )


class Submitter:
    """Posts a transactional batch every ``interval`` seconds until stopped (open loop)."""

    def __init__(self, url: str, key: str, interval: float) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.interval = interval
        self.tag = uuid.uuid4().hex[:8]
        self.submitted: dict[uuid.UUID, float] = {}
        self.refused: dict[str, int] = {}
        self.api_seconds: list[float] = []
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks: set[asyncio.Task[None]] = set()
            start, n = time.monotonic(), 0
            while not self._stop.is_set():
                task = asyncio.create_task(self._post(session, n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
                delay = start + n * self.interval - time.monotonic()
                # Sleep until the next one is due, or until stopped.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), max(0.0, delay))
            if tasks:
                await asyncio.wait(tasks, timeout=60)

    async def _post(self, session: aiohttp.ClientSession, n: int) -> None:
        t0 = time.time()
        try:
            async with session.post(
                self.url, data=transactional_body(n, self.tag), headers=self.headers
            ) as resp:
                body = await resp.read()
                status = str(resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, body = type(exc).__name__, b""
        if status != "202":
            self.refused[status] = self.refused.get(status, 0) + 1
            return
        self.api_seconds.append(time.time() - t0)
        self.submitted[uuid.UUID(orjson.loads(body)["batch_id"])] = t0


@phase(
    "lanes",
    group="B",
    order=50,
    needs={"sandbox", "consumers", "api"},
    description=(
        "priority lanes: transactional batches every 100 ms while a large bulk corpus drains; "
        "transactional p99 time-to-provider"
    ),
)
async def lanes(ctx: Context) -> Result:
    cfg, stack = ctx.config, ctx.stack
    per_batch = min(cfg.lanes_bulk_batch, cfg.lanes_bulk_recipients)
    batches = max(1, cfg.lanes_bulk_recipients // per_batch)
    feeder = ctx.child(
        "feeder-bulk",
        "bench.feeder",
        {
            "recipients": per_batch,
            "batches": batches,
            "user_id": str(stack.user_id),
            "priority": "bulk",
        },
    )
    await feeder.start()
    ready = await feeder.next_message("ready", timeout=3600)
    expected = int(ready["recipients"])
    before = await _provider_total(ctx)
    await feeder.go()
    finished = asyncio.create_task(feeder.finish(timeout=cfg.lanes_timeout + 60))
    t_go = time.time()
    submitter = Submitter(f"{stack.url('api')}/v1/batches", stack.api_key, cfg.lanes_interval)
    drain = await _drain(ctx, submitter, before, expected, t_go)
    await finished
    reached = await _reached(ctx, submitter.submitted)
    result = time_to_provider(submitter.submitted, reached, target=cfg.lanes_target_p99)
    result.update(drain)
    result["refused"] = submitter.refused
    result["api_latency_s"] = latency_summary(submitter.api_seconds)
    result["usage"] = ctx.usage(t_go, drain["window_end"], drain["bulk_sent"])
    result["purged"] = await stack.purge(*stack.work_queues())
    p99 = result["time_to_provider_s"]["p99"]
    ctx.printer(
        f"lanes: {result['batches']:,} transactional batches during a {expected:,}-recipient "
        f"bulk drain ({drain['bulk_recipients_per_s']:,.0f}/s): time to provider p99 "
        f"{'-' if p99 is None else f'{p99:.2f}s'} (target {cfg.lanes_target_p99:g}s), "
        f"{result['missing']} never reached it"
    )
    return result


async def _drain(
    ctx: Context, submitter: Submitter, before: int, expected: int, t_go: float
) -> Result:
    """Run ``submitter`` from the first bulk recipient at the provider until the bulk corpus
    has all reached it (or the time is up, or it stalls); the drain's figures."""
    stack, cfg = ctx.stack, ctx.config
    bulk_queue = stack.topology.bulk_queue(stack.settings.providers.chain_codes[0])
    posting: asyncio.Task[None] | None = None
    t_first: float | None = None
    last_report = last_change = time.time()
    sent = seen = max_depth = 0
    complete = False
    try:
        while time.time() - t_go < cfg.lanes_timeout:
            # Transactional recipients count at the provider too: an over-estimate of theirs
            # only makes the drain look shorter, never the lanes better.
            sent = await _provider_total(ctx) - before - len(submitter.submitted)
            now = time.time()
            if sent > 0 and posting is None:
                t_first = now
                posting = asyncio.create_task(submitter.run())
            if sent >= expected:
                complete = True
                break
            if sent != seen:
                last_change, seen = now, sent
            elif now - last_change > STALL:
                ctx.printer(f"bulk drain stalled for {STALL:.0f}s at {sent:,}/{expected:,}")
                break
            if now - last_report >= REPORT_EVERY:
                depth = await stack.depth(bulk_queue)
                max_depth = max(max_depth, depth)
                ctx.printer(
                    f"{now - t_go:5.1f}s: bulk {max(sent, 0):,}/{expected:,} at the provider, "
                    f"{depth:,} chunks waiting; {len(submitter.submitted):,} transactional "
                    "batches accepted"
                )
                last_report = now
            await asyncio.sleep(0.2)
    finally:
        submitter.stop()
        if posting is not None:
            await posting
    t_end = time.time()
    return {
        "bulk_recipients": expected,
        "bulk_sent": max(sent, 0),
        "bulk_complete": complete,
        "complete": complete,
        "window_start": t_go,
        "window_end": t_end,
        "bulk_recipients_per_s": per_second(max(sent, 0), t_end - t_go),
        "transactional_from_s": None if t_first is None else t_first - t_go,
        "max_bulk_chunks_waiting": max_depth,
    }


async def _provider_total(ctx: Context) -> int:
    return sum(v["recipients"] for v in (await ctx.stack.sandbox_sends()).values())


async def _reached(
    ctx: Context, submitted: Mapping[uuid.UUID, float], wait: float = WAIT_FOR_LATE
) -> dict[uuid.UUID, float]:
    """When the provider answered each transactional batch's chunk (epoch seconds)."""
    db = ctx.stack.db
    assert db is not None  # noqa: S101
    attempts = AttemptStore(db)
    found: dict[uuid.UUID, float] = {}
    deadline = time.monotonic() + wait
    while True:
        for batch_id in [b for b in submitted if b not in found]:
            at = _accepted_at(await attempts.line(batch_id, chunk_line(0)))
            if at is not None:
                found[batch_id] = at
        if len(found) == len(submitted) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(1.0)


def _accepted_at(line: list[Attempt]) -> float | None:
    for attempt in line:
        if attempt.state == "accepted" and attempt.finished_at is not None:
            return float(attempt.finished_at.timestamp())
    return None
