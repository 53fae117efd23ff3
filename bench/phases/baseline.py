"""Raw limits measured in the same run: L_accept (phases A and C) and L_e2e (phase A).

Both run :mod:`bench.raw` in a child process with no service but the sandbox running, so no
consumer takes the messages they leave behind; those are purged afterwards.
"""

from __future__ import annotations

from bench import cqlops
from bench.phases import Context, Result, phase
from bench.stats import stability


async def _l_accept(ctx: Context, label: str) -> Result:
    cfg = ctx.config
    spec = {
        "mode": "accept",
        "recipients": cfg.recipients,
        "user_id": str(ctx.stack.user_id),
        "warmup": cfg.accept_warmup,
        "duration": cfg.accept_duration,
        "window": cfg.accept_window,
    }
    runner = ctx.child(label, "bench.raw", spec)
    before = await ctx.cassandra_ops()
    await runner.start()
    await runner.measured(timeout=cfg.accept_warmup + cfg.accept_duration + 120)
    after = await ctx.cassandra_ops(settled=True)
    await runner.go()
    result = await runner.finish(timeout=60)
    # Warm-up included, as the snapshots are: the loop's own minimum per batch.
    result["cassandra_ops_per_batch"] = ops = cqlops.per_unit(
        before, after, int(result["total_batches"])
    )
    result["usage"] = ctx.usage(result["window_start"], result["window_end"], result["recipients"])
    result["purged"] = await ctx.stack.purge(ctx.stack.topology.batches_queue)
    ctx.printer(
        f"L_accept: {result['batches_per_s']:,.1f} batches/s, "
        f"{result['recipients_per_s']:,.0f} recipients/s (window {cfg.accept_window})"
    )
    ctx.printer(f"L_accept: Cassandra {cqlops.summary(ops)}")
    return result


@phase(
    "l_accept",
    group="A",
    order=10,
    needs={"sandbox"},
    description=(
        "raw acceptance, the physical minimum: one single-partition mutation of the batch with "
        "its recipients + one confirmed publish, no HTTP"
    ),
)
async def l_accept(ctx: Context) -> Result:
    return await _l_accept(ctx, "raw-accept")


@phase(
    "l_accept_end",
    group="C",
    order=10,
    needs={"sandbox"},
    description="raw acceptance again at the end; the run is unstable if it moved by >10%",
)
async def l_accept_end(ctx: Context) -> Result:
    result = await _l_accept(ctx, "raw-accept-end")
    first = ctx.results.get("l_accept", {}).get("batches_per_s")
    if first is not None:
        result["stability"] = stability(float(first), float(result["batches_per_s"]))
        verdict = "stable" if result["stability"]["stable"] else "UNSTABLE"
        ctx.printer(f"A vs C: {result['stability']['difference']:.1%} apart: {verdict}")
    return result


async def _l_e2e(ctx: Context, recipients: int, label: str, prefetch: int | None = None) -> Result:
    cfg = ctx.config
    prefetch = prefetch or cfg.prefetch
    batches = max(cfg.e2e_min_batches, cfg.l_e2e_recipients // recipients)
    spec = {
        "mode": "e2e",
        "recipients": recipients,
        "user_id": str(ctx.stack.user_id),
        "batches": batches,
        "prefetch": prefetch,
        "max_seconds": cfg.e2e_timeout,
    }
    runner = ctx.child(label, "bench.raw", spec)
    await runner.start()
    await runner.next_message("ready", timeout=600)
    before = await ctx.cassandra_ops()
    await runner.go()
    await runner.measured(timeout=cfg.e2e_timeout + 120)
    after = await ctx.cassandra_ops(settled=True)
    await runner.go()
    result = await runner.finish(timeout=60)
    if not result["chunks"]:
        raise RuntimeError(f"no chunk was dispatched within {cfg.e2e_timeout:.0f}s")
    chunks_per_batch = -(-recipients // int(result["chunk_size"]))
    result["cassandra_ops_per_batch"] = ops = cqlops.per_unit(
        before, after, int(result["chunks"]) // chunks_per_batch
    )
    result["batch_recipients"] = recipients
    result["usage"] = ctx.usage(result["window_start"], result["window_end"], result["recipients"])
    result["purged"] = await ctx.stack.purge(*ctx.stack.work_queues())
    ctx.printer(
        f"L_e2e (N={recipients}): {result['recipients_per_s']:,.0f} recipients/s, "
        f"{result['chunks_per_s']:,.1f} chunks/s (prefetch {prefetch})"
    )
    ctx.printer(f"L_e2e (N={recipients}): Cassandra {cqlops.summary(ops)}")
    return result


@phase(
    "l_e2e",
    group="A",
    order=20,
    needs={"sandbox"},
    description="raw dispatch, N=100: consume chunk job, claim, SendGrid call, finish, rows, ack",
)
async def l_e2e(ctx: Context) -> Result:
    return await _l_e2e(ctx, ctx.config.recipients, "raw-e2e")


@phase(
    "l_e2e_wide",
    group="A",
    order=25,
    needs={"sandbox"},
    in_quick=False,
    description="raw dispatch, N=100, prefetch 64: what the CPU allows beyond the prefetch",
)
async def l_e2e_wide(ctx: Context) -> Result:
    return await _l_e2e(ctx, ctx.config.recipients, "raw-e2e-wide", ctx.config.wide_prefetch)


@phase(
    "l_e2e_1000",
    group="A",
    order=30,
    needs={"sandbox"},
    description="raw dispatch with 1,000-recipient batches (one 1,000-recipient chunk each)",
)
async def l_e2e_1000(ctx: Context) -> Result:
    return await _l_e2e(ctx, ctx.config.big_recipients, "raw-e2e-1000")
