"""The stack at rest: every service running, no mail at all, and the CPU it keeps using.

After the services start, the phase waits :data:`SETTLE` seconds (start-up work: migrations
checked, queues declared, the first passes of every background loop), then samples the CPU of
each process for ``idle_seconds``: ``idle_cores`` is the whole stack's (our services,
Cassandra and RabbitMQ; the sandbox, a test double, and the bench itself left out) in cores,
and ``per_process`` each one's. What it measures is polling: the background loops that wake on
a timer rather than on a broadcast or their own next due time (issue 34, target <= 0.03).
Cassandra and RabbitMQ are shared with the machine's other users: ``untracked_pct_of_machine``
says how busy the machine was besides.
"""

from __future__ import annotations

import asyncio
import time

from bench import cqlops
from bench.phases import Context, Result, phase
from bench.sampler import SYSTEM

#: Seconds between the services' readiness and the measurement.
SETTLE = 20.0
#: Processes running but not counted: the provider stand-ins and the bench's own process.
NOT_THE_STACK = frozenset({"sandbox", "bench", SYSTEM})
#: The services an idle stack runs (``make hostile``'s: every one).
SERVICES = frozenset({"sandbox", "api", "consumers", "webhooks", "tracking", "hooks"})


def stack_cores(usage: Result, seconds: float) -> tuple[float, dict[str, float]]:
    """The whole stack's cores and each of its processes' over a window of ``seconds``
    (pure: ``usage`` is :meth:`Context.usage`'s)."""
    per = {
        label: round(float(entry["cpu_s"]) / seconds, 4)
        for label, entry in usage.items()
        if label not in NOT_THE_STACK
    }
    return round(sum(per.values()), 4), dict(sorted(per.items()))


@phase(
    "idle",
    group="C",
    order=90,
    needs=SERVICES,
    description="every service running with no mail: the stack's CPU in cores",
)
async def idle(ctx: Context) -> Result:
    seconds = ctx.config.idle_seconds
    ctx.printer(f"settling {SETTLE:.0f}s, then sampling {seconds:.0f}s with no mail")
    await asyncio.sleep(SETTLE)
    before = await ctx.cassandra_ops()
    start = time.time()
    await asyncio.sleep(seconds)
    end = time.time()
    # What the background loops ask of Cassandra with no mail: their polls, per second.
    ops = cqlops.per_unit(before, await ctx.cassandra_ops(), round(end - start), "second")
    usage = ctx.usage(start, end, 0)
    cores, per_process = stack_cores(usage, end - start)
    ctx.printer(
        f"idle: {cores:.3f} cores ("
        + ", ".join(f"{k} {v:.3f}" for k, v in per_process.items())
        + ")"
    )
    ctx.printer(f"idle: Cassandra {cqlops.summary(ops)}")
    return {
        "idle_cores": cores,
        "per_process": per_process,
        "seconds": end - start,
        "usage": usage,
        "cassandra_ops_per_s": ops,
    }
