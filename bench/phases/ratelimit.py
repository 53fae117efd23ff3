"""The shared per-provider rate limit under a flood (``services.consumers.provider_rates``): how
much of SendGrid's limit three consumer processes use together, whether they ever exceed it, and
what the limiter costs.

With the API, three consumer processes and the sandbox (a process of its own, as a provider
is) running, :mod:`bench.feeder` seeds ``rate_limit_batches`` single-recipient batches
(untimed). Settings change through ``PATCH /v1/settings`` with an operator key, and each step
waits until every consumer process has applied them (``safedelivr_settings_applied``):

1. Both providers paused (work waits in the broker), the flood is published and split: every
   chunk job waits in SendGrid's queue, so what follows measures the send path alone.
2. For ``rate_limit_baseline_seconds``, no limits: the rate the flood offers SendGrid and the
   CPU per call of the same processes with no limiter at work (the limiter's baseline).
3. For ``rate_limit_seconds``, SendGrid limited to ``rate_limit_per_s`` and Mailgun to
   ``rate_limit_spill_per_s`` (far above what the consumers reach).

Steps 2 and 3 start :data:`SWITCH` seconds after the change was applied: calls granted
before it may still be arriving, and no limiter counted them. A backlog remains throughout
(``drained`` says if not), so SendGrid stays saturated and the rest spills over to Mailgun.
From the arrival time of every call at the sandbox, step 3 gives:

* SendGrid's busiest second (a window sliding over the calls) and its mean rate over the
  step's steady span (from 10 % to 90 % of its calls, both providers), each beside the limit
  and as a ratio to it. The limit is the raw baseline of both: a ratio above
  :data:`DEFECT_RATIO` (at 20/s the limit plus two calls, the window's edges) is a defect of
  the limiter, reported loudly and recorded;
* the calls (one recipient each) spilled to Mailgun;
* the CPU per call of every process, beside step 2's; the limiter's processes are the
  consumers, which take the slots, and Cassandra, which counts them.

The settings changed are put back as they were, and what the flood left is purged, whatever
happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from bench import stats
from bench.phases import Context, Result, phase
from bench.targets import ratio
from shared.accounts import accounts

#: Ratio to the limit above which the limiter let too many calls through.
DEFECT_RATIO = 1.1
#: Share of the limited step's calls left out at each end of its steady span.
STEADY_TRIM = 0.1
#: Shortest steady span (seconds) a mean rate is given for.
MIN_STEADY = 1.0
#: Seconds after a change is applied before a step is measured.
SWITCH = 1.0
#: The consumer processes that share the limit.
CONSUMERS = ("consumers", "consumers-b", "consumers-c")
PROVIDERS = ("sendgrid", "mailgun")
#: Seconds every consumer process has to apply a settings change (the contract says one).
APPLY_WITHIN = 5.0
#: Seconds between progress lines.
REPORT_EVERY = 5.0
#: Seconds without progress (split or sent) after which the flood is abandoned.
STALL = 20.0

_APPLIED = re.compile(r"^safedelivr_settings_applied (\S+)$", re.MULTILINE)

#: Per provider: ``{"paused": bool, "rate_limit_per_s": float | None}``, as the API shows it.
ProviderSettings = Mapping[str, Mapping[str, Any]]


def limit_figures(
    sendgrid: Sequence[float], mailgun: Sequence[float], limit: float
) -> dict[str, Any]:
    """The limiter's figures from the arrival times (epoch seconds) of the calls at each
    provider while SendGrid was limited to ``limit`` calls/s and saturated: its busiest
    second and its mean rate over the steady span, each with its ratio to the limit, the
    share spilled to Mailgun, and whether either ratio is above :data:`DEFECT_RATIO`."""
    sg, everything = sorted(sendgrid), sorted([*sendgrid, *mailgun])
    busiest = stats.busiest_second(sg)
    figures: dict[str, Any] = {
        "limit_per_s": limit,
        "sendgrid_calls": len(sg),
        "mailgun_calls": len(mailgun),
        "spilled_share": ratio(len(mailgun), len(everything)),
        "sendgrid_busiest_second": busiest,
        "busiest_ratio": ratio(busiest, limit),
        "mailgun_busiest_second": stats.busiest_second(mailgun),
        "steady_start": None,
        "steady_s": None,
        "sendgrid_steady_per_s": None,
        "steady_ratio": None,
        "mailgun_steady_per_s": None,
    }
    if everything:
        lo, hi = stats.spread_window(everything, STEADY_TRIM, 1 - STEADY_TRIM)
        if hi - lo >= MIN_STEADY:
            mean = stats.per_second(stats.window_count(sg, lo, hi), hi - lo)
            figures.update(
                steady_start=lo,
                steady_s=hi - lo,
                sendgrid_steady_per_s=mean,
                steady_ratio=ratio(mean, limit),
                mailgun_steady_per_s=stats.per_second(stats.window_count(mailgun, lo, hi), hi - lo),
            )
    ratios = [r for r in (figures["busiest_ratio"], figures["steady_ratio"]) if r is not None]
    figures["defect"] = any(r > DEFECT_RATIO for r in ratios)
    return figures


def in_force(providers: ProviderSettings) -> dict[str, dict[str, Any]]:
    """The settings as the consumers apply them (no limit and a limit of 0 are alike), and
    as a PATCH puts them back."""
    return {
        name: {
            "paused": bool(s.get("paused")),
            "rate_limit_per_s": float(s.get("rate_limit_per_s") or 0),
        }
        for name, s in providers.items()
    }


def running(sendgrid: float = 0.0, mailgun: float = 0.0, *, paused: bool = False) -> dict[str, Any]:
    """Both providers paused or not, with these limits (0: none)."""
    return {
        "sendgrid": {"paused": paused, "rate_limit_per_s": sendgrid},
        "mailgun": {"paused": paused, "rate_limit_per_s": mailgun},
    }


@phase(
    "rate_limit",
    group="B",
    order=55,
    needs={"sandbox", "api", "consumers", "consumers-b", "consumers-c"},
    in_quick=False,
    description=(
        "single-recipient flood through three consumer processes, unlimited then SendGrid at "
        "20 calls/s: busiest second and steady rate as ratios to the limit, spill, CPU per call"
    ),
)
async def rate_limit(ctx: Context) -> Result:
    cfg, stack = ctx.config, ctx.stack
    assert stack.db is not None  # noqa: S101
    feeder = ctx.child(
        "feeder-flood",
        "bench.feeder",
        {"recipients": 1, "batches": cfg.rate_limit_batches, "user_id": str(stack.user_id)},
    )
    operator = await accounts.create_key(
        stack.db, stack.user_id, "bench-operator", scopes=("operator",)
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        flood = Flood(ctx, http, operator)
        before = in_force(await flood.settings())
        try:
            await feeder.start()
            ready = await feeder.next_message("ready", timeout=600)
            await flood.apply(running(paused=True))
            flood.start(await stack.sandbox_sends(), int(ready["recipients"]))
            await feeder.go()
            split_s = await flood.split()
            await feeder.finish(timeout=60)
            t_go = time.time()
            applied = [await flood.apply(running())]
            t_unlimited = time.time() + SWITCH
            await flood.watch(t_unlimited + cfg.rate_limit_baseline_seconds, "unlimited")
            t_switch = time.time()
            limits = running(cfg.rate_limit_per_s, cfg.rate_limit_spill_per_s)
            applied.append(await flood.apply(limits))
            t_limited = time.time() + SWITCH
            await flood.watch(t_limited + cfg.rate_limit_seconds, "limited")
            t_end = time.time()
            arrivals = await flood.arrivals(t_go)
        finally:
            await feeder.stop()
            await flood.patch(before)
            purged = await stack.purge(
                *stack.work_queues(), *(q.name for q in stack.topology.delay_queues())
            )

    def within(provider: str, start: float, end: float) -> list[float]:
        return [t for t in arrivals[provider] if start <= t < end]

    limited = {p: within(p, t_limited, t_end) for p in PROVIDERS}
    offered = within("sendgrid", t_unlimited, t_switch) + within("mailgun", t_unlimited, t_switch)
    offered_per_s = stats.per_second(len(offered), t_switch - t_unlimited)
    result = limit_figures(limited["sendgrid"], limited["mailgun"], cfg.rate_limit_per_s)
    calls = len(limited["sendgrid"]) + len(limited["mailgun"])
    result.update(
        {
            "batches": cfg.rate_limit_batches,
            "split_s": split_s,
            "drained": flood.sent >= flood.expected,
            "complete": not flood.stalled,
            "stalled": flood.stalled,
            "spill_limit_per_s": cfg.rate_limit_spill_per_s,
            "settings_applied_after_s": applied,
            "settings_restored": before,
            "window_start": t_limited,
            "window_end": t_end,
            "seconds": t_end - t_limited,
            "calls_per_s": stats.per_second(calls, t_end - t_limited),
            "purged": purged,
            "unlimited": {
                "window_start": t_unlimited,
                "window_end": t_switch,
                "calls": len(offered),
                "mailgun_calls": len(within("mailgun", t_unlimited, t_switch)),
                "offered_per_s": offered_per_s,
                "offered_ratio": ratio(offered_per_s, cfg.rate_limit_per_s),
                "usage": ctx.usage(t_unlimited, t_switch, len(offered), unit="call"),
            },
        }
    )
    result["usage"] = ctx.usage(t_limited, t_end, calls, unit="call")
    _print(ctx, result)
    return result


def _print(ctx: Context, r: Result) -> None:
    steady = r["sendgrid_steady_per_s"]
    ctx.printer(
        f"limit {r['limit_per_s']:g}/s, the flood offering {r['unlimited']['offered_per_s']:.1f}"
        f"/s unlimited: SendGrid's busiest second {r['sendgrid_busiest_second']} "
        f"({r['busiest_ratio']:.2f} x the limit), steady "
        + ("-" if steady is None else f"{steady:.1f}/s ({r['steady_ratio']:.2f} x)")
        + f" over {r['steady_s'] or 0:.1f}s; {r['spilled_share'] or 0:.0%} of the calls "
        "spilled to Mailgun"
    )
    if r["defect"]:
        ctx.printer(
            f"LIMITER DEFECT: SendGrid got more than {DEFECT_RATIO:g} x its limit of "
            f"{r['limit_per_s']:g} calls/s (busiest second {r['sendgrid_busiest_second']}, "
            f"steady {'-' if steady is None else f'{steady:.1f}'}/s)"
        )


class Flood:
    """The flood as it goes: the provider settings it runs under (through the API, as an
    operator changes them) and its progress in the broker and at the sandbox."""

    def __init__(self, ctx: Context, http: aiohttp.ClientSession, operator_key: str) -> None:
        self.ctx = ctx
        self.http = http
        self.url = f"{ctx.stack.url('api')}/v1/settings"
        self.headers = {"Authorization": f"Bearer {operator_key}"}
        self.expected = 0
        self.sent = 0
        self.stalled = False
        self._before = dict.fromkeys(PROVIDERS, 0)

    async def settings(self) -> dict[str, dict[str, Any]]:
        async with self.http.get(self.url, headers=self.headers) as resp:
            resp.raise_for_status()
            providers = (await resp.json())["providers"]
        return {name: providers[name] for name in PROVIDERS}

    async def patch(self, providers: ProviderSettings) -> None:
        body = {"providers": {name: dict(s) for name, s in providers.items()}}
        async with self.http.patch(self.url, json=body, headers=self.headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"PATCH /v1/settings: {resp.status} {await resp.text()}")

    async def apply(self, providers: ProviderSettings) -> float:
        """Put ``providers`` in force; once every consumer process has applied them (if they
        change anything), how long that took."""
        unchanged = in_force(await self.settings()) == in_force(providers)
        t0 = time.time()
        await self.patch(providers)
        waiting = {} if unchanged else {n: f"{self.ctx.stack.url(n)}/metrics" for n in CONSUMERS}
        while waiting:
            for name, url in list(waiting.items()):
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with self.http.get(url) as resp:
                        found = _APPLIED.search(await resp.text())
                    if found and float(found.group(1)) >= t0:
                        del waiting[name]
            if waiting and time.time() - t0 > APPLY_WITHIN:
                raise RuntimeError(f"{sorted(waiting)} did not apply {providers} in time")
            await asyncio.sleep(0.05)
        return time.time() - t0

    def start(self, sends: Mapping[str, Mapping[str, int]], expected: int) -> None:
        """The flood of ``expected`` recipients starts; the sandbox had accepted ``sends``."""
        self._before = {p: sends[p]["recipients"] for p in PROVIDERS}
        self.expected = expected

    async def split(self) -> float:
        """Wait until every batch of the flood waits in SendGrid's queue as a chunk job;
        how long that took."""
        stack, t0 = self.ctx.stack, time.time()
        queue = stack.topology.provider_queue("sg")
        last_report = last_change = t0
        seen = 0
        while (depth := await stack.depth(queue)) < self.expected:
            now = time.time()
            if depth != seen:
                last_change, seen = now, depth
            elif now - last_change > STALL:
                raise RuntimeError(f"splitting stalled at {depth:,}/{self.expected:,} chunks")
            if now - last_report >= REPORT_EVERY:
                self.ctx.printer(f"split: {depth:,}/{self.expected:,} chunk jobs waiting")
                last_report = now
            await asyncio.sleep(0.2)
        self.ctx.printer(f"split {self.expected:,} batches in {time.time() - t0:.1f}s")
        return time.time() - t0

    async def watch(self, end: float, step: str) -> None:
        """Follow the sends until ``end`` (epoch seconds), or until the flood has all arrived,
        or nothing arrives for :data:`STALL` seconds."""
        stack = self.ctx.stack
        t0 = last_report = last_change = time.time()
        seen = self.sent
        while not self.stalled and self.sent < self.expected and time.time() < end:
            sends = await stack.sandbox_sends()
            by = {p: sends[p]["recipients"] - self._before[p] for p in PROVIDERS}
            self.sent, now = sum(by.values()), time.time()
            if self.sent != seen:
                last_change, seen = now, self.sent
            elif now - last_change > STALL:
                self.ctx.printer(f"no call for {STALL:.0f}s: stopping at {self.sent:,}")
                self.stalled = True
            if now - last_report >= REPORT_EVERY:
                self.ctx.printer(
                    f"{step} {now - t0:4.1f}s: {self.sent:,}/{self.expected:,} sent (SendGrid "
                    f"{by['sendgrid']:,}, Mailgun {by['mailgun']:,})"
                )
                last_report = now
            await asyncio.sleep(0.2)

    async def arrivals(self, since: float) -> dict[str, list[float]]:
        """When each call reached each provider since ``since`` (the sandbox's clock)."""
        url = f"{self.ctx.stack.url('sandbox')}/_control/sends"
        params = {"times": "1", "email": "nobody@bench.invalid", "recent": "0"}
        async with self.http.get(url, params=params) as resp:
            resp.raise_for_status()
            body = await resp.json()
        return {p: [t for t in body[p]["arrivals"] if t >= since] for p in PROVIDERS}
