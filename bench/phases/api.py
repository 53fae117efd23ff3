"""The real API under load: closed-loop maximum, then open-loop latency at fractions of it.

The API runs as its own process (``safedelivr api``) and :mod:`bench.loadgen` drives it from
another. Consumers do not run: acceptance is measured alone, as L_accept is. The
``batch.<uuid>`` messages the accepted batches leave are purged after every step so each
step starts from the same (empty) queue.

Throughput and CPU per recipient count the recipients the API's 202 answers say they accepted
(:mod:`bench.loadgen`), never requests times N; recipients sent in a 202 but not accepted are
reported as ``recipients_not_accepted``.
"""

from __future__ import annotations

from typing import Any

from bench import cqlops
from bench.phases import Context, Result, phase


async def _drive(ctx: Context, label: str, spec: dict[str, Any]) -> Result:
    cfg = ctx.config
    runner = ctx.child(
        "loadgen",
        "bench.loadgen",
        {
            "url": f"{ctx.stack.url('api')}/v1/batches",
            "recipients": cfg.recipients,
            **spec,
        },
        BENCH_API_KEY=ctx.stack.api_key,
    )
    before = await ctx.cassandra_ops()
    await runner.start()
    result = await runner.finish(timeout=float(spec["warmup"]) + float(spec["duration"]) + 120)
    # Over the whole run, warm-up included: the snapshots cannot bracket the window exactly.
    after = await ctx.cassandra_ops(settled=True)
    result["cassandra_ops_per_batch"] = ops = cqlops.per_unit(
        before, after, int(result["accepted_all"])
    )
    result["recipients_not_accepted"] = result["ok"] * cfg.recipients - result["recipients"]
    result["usage"] = ctx.usage(result["window_start"], result["window_end"], result["recipients"])
    result["cassandra_gc"] = gc = ctx.cassandra_gc(result["window_start"], result["window_end"])
    result["purged"] = await ctx.stack.purge(ctx.stack.topology.batches_queue)
    lat = result["latency_ms"]
    ctx.printer(
        f"{label}: {result['ok_per_s']:,.1f} batches/s accepted "
        f"({result['recipients_per_s']:,.0f} recipients/s, "
        f"{result['recipients_not_accepted']:,} sent but not accepted), "
        f"{result['errors']} other answers, "
        f"p50 {_ms(lat['p50'])} p99 {_ms(lat['p99'])} p99.9 {_ms(lat['p999'])} ms; "
        f"Cassandra GC: {gc['pauses']} pauses, {gc['total_ms']:.0f} ms, longest {gc['max_ms']:.0f}"
    )
    ctx.printer(f"{label}: Cassandra {cqlops.summary(ops)}")
    return result


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@phase(
    "api_max",
    group="B",
    order=10,
    needs={"sandbox", "api"},
    description="POST /v1/batches (N=100), closed loop at several concurrencies; best kept",
)
async def api_max(ctx: Context) -> Result:
    cfg = ctx.config
    levels = []
    for concurrency in cfg.api_levels:
        levels.append(
            await _drive(
                ctx,
                f"closed c={concurrency}",
                {
                    "mode": "closed",
                    "concurrency": concurrency,
                    "warmup": cfg.api_warmup,
                    "duration": cfg.api_duration,
                },
            )
        )
    best = max(levels, key=lambda r: float(r["recipients_per_s"]))
    return {
        "batches_per_s": best["ok_per_s"],
        "recipients_per_s": best["recipients_per_s"],
        "best_concurrency": best["concurrency"],
        "levels": levels,
    }


@phase(
    "api_open",
    group="B",
    order=20,
    needs={"sandbox", "api"},
    description="POST /v1/batches open loop at 50% and 80% of the maximum; latency from schedule",
)
async def api_open(ctx: Context) -> Result:
    cfg = ctx.config
    maximum = ctx.results.get("api_max", {}).get("batches_per_s")
    if not maximum:
        raise RuntimeError("needs the api_max phase (the rates are fractions of its maximum)")
    steps: dict[str, Result] = {}
    for fraction in cfg.open_fractions:
        rate = float(maximum) * fraction
        result = await _drive(
            ctx,
            f"open {fraction:.0%} ({rate:,.0f}/s)",
            {
                "mode": "open",
                "rate": rate,
                "warmup": cfg.open_warmup,
                "duration": cfg.open_duration,
            },
        )
        result["fraction"] = fraction
        steps[f"{round(fraction * 100)}%"] = result
    return {"max_batches_per_s": maximum, "steps": steps}
