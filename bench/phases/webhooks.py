"""Webhook ingest: the raw Cassandra write loop of the same rows, grouped per partition as
the ingest groups a post's (L_wh), then signed SendGrid-style batched posts (100 events each)
and Mailgun-style single posts to the real webhook service, as events/s with the per-process
CPU of each."""

from __future__ import annotations

from bench import cqlops
from bench.phases import Context, Result, phase

#: Events per SendGrid-style post (SendGrid batches up to 768 kB; ≥ 100 per the brief).
EVENTS_PER_POST = 100
#: Posts' worth of events the raw loop writes at once (the batched posts: 4 in flight).
RAW_WINDOW = 8


async def _hooks(ctx: Context, label: str, spec: dict[str, object]) -> Result:
    cfg = ctx.config
    runner = ctx.child(
        label,
        "bench.hooks",
        {
            "user_id": str(ctx.stack.user_id),
            "warmup": cfg.accept_warmup,
            "duration": cfg.accept_duration,
            **spec,
        },
    )
    await runner.start()
    await runner.next_message("ready", timeout=300)
    before = await ctx.cassandra_ops()
    await runner.go()
    await runner.measured(timeout=cfg.accept_warmup + cfg.accept_duration + 120)
    after = await ctx.cassandra_ops(settled=True)
    await runner.go()
    result = await runner.finish(timeout=60)
    # Per post (raw: per post's worth of events, written as the ingest groups a post),
    # warm-up included.
    result["cassandra_ops_per_batch"] = ops = cqlops.per_unit(
        before, after, int(result["calls"]), "post"
    )
    result["usage"] = ctx.usage(
        result["window_start"], result["window_end"], result["events"], unit="event"
    )
    ctx.printer(f"{label}: {result['events_per_s']:,.0f} events/s")
    ctx.printer(f"{label}: Cassandra {cqlops.summary(ops)}")
    return result


@phase(
    "l_webhook",
    group="A",
    order=40,
    needs=(),
    description="raw webhook rows of 100-event posts, grouped per partition as the ingest's",
)
async def l_webhook(ctx: Context) -> Result:
    return await _hooks(
        ctx, "L_webhook", {"mode": "raw", "window": RAW_WINDOW, "per_post": EVENTS_PER_POST}
    )


@phase(
    "webhooks_batched",
    group="B",
    order=60,
    needs={"webhooks"},
    description="signed SendGrid-style posts of 100 events to the webhook service",
)
async def webhooks_batched(ctx: Context) -> Result:
    return await _hooks(
        ctx,
        "webhooks batched",
        {
            "mode": "sendgrid",
            "url": ctx.stack.url("webhooks"),
            "per_post": EVENTS_PER_POST,
            "concurrency": 4,
            "sendgrid_private_key": ctx.stack.sendgrid_private_key,
        },
    )


@phase(
    "webhooks_single",
    group="B",
    order=61,
    needs={"webhooks"},
    description="signed Mailgun-style single-event posts to the webhook service",
)
async def webhooks_single(ctx: Context) -> Result:
    return await _hooks(
        ctx,
        "webhooks single",
        {
            "mode": "mailgun",
            "url": ctx.stack.url("webhooks"),
            "concurrency": 32,
            "sendgrid_private_key": ctx.stack.sendgrid_private_key,
            "mailgun_key": ctx.stack.mailgun_signing_key,
        },
    )
