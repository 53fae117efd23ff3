"""HTTP load generator for ``POST /v1/batches``, run as a child process (aiohttp on uvloop).

``{"mode": "closed", "concurrency": C, ...}`` -- C connections, each sending its next request
as soon as the previous one is answered: the maximum throughput.

``{"mode": "open", "rate": R, ...}`` -- requests are due at fixed times ``R`` per second
(:class:`bench.schedule.RateSchedule`) and each is sent when due, on its own connection if
needed, however slow the earlier ones are. Latency is measured from the *scheduled* time, so
a stalled server is charged for every request it delayed (no coordinated omission); the gap
between scheduled and actual send (``lag``) shows whether this generator kept up.

Both count only requests started after ``warmup`` seconds, for ``duration`` seconds, and
only answers that are the expected one: a 202 whose body says how many recipients it
accepted (``services.api.sending.answer``). Recipients are what those bodies accepted, not
requests times N: an answer that accepted fewer (or none) did less work, and counting it
whole is how a headline can outrun its own raw baseline (issue 34).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench import child
from bench.schedule import RateSchedule
from bench.stats import latency_summary, percentile
from bench.workload import encoded_bodies

#: Seconds between progress lines.
REPORT_EVERY = 2.0
#: Connections the open-loop generator may hold; beyond that, requests wait (and it shows).
OPEN_LOOP_CONNECTIONS = 1024
#: The status of an answer that counts: the batch is stored and will be sent.
ACCEPTED = "202"
#: The label of a 202 whose body does not say how many recipients it accepted.
UNCOUNTED = "202 without a count"


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request's answer counts as: its status label and the recipients it accepted
    (0 unless the label is :data:`ACCEPTED`)."""

    status: str
    accepted: int = 0


def answer_of(status: int, body: bytes) -> Answer:
    """Read one answer (pure): a 202 counts with the ``accepted`` of its body; a 202 that
    does not say what it accepted showed no work, so it is labelled apart and counts none."""
    if str(status) != ACCEPTED:
        return Answer(str(status))
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer(UNCOUNTED)
    accepted = decoded.get("accepted") if isinstance(decoded, dict) else None
    if type(accepted) is not int or accepted < 0:
        return Answer(UNCOUNTED)
    return Answer(ACCEPTED, accepted)


@dataclass(frozen=True, slots=True)
class Tally:
    """Answers so far, in the window or not: the progress lines' counts."""

    accepted: int = 0
    recipients: int = 0
    other: int = 0


def progress_line(
    label: str, phase: str, before: Tally, after: Tally, seconds: float, p99_ms: float
) -> str:
    """One progress line: accepted requests and recipients per second between two tallies,
    and how many other answers came meanwhile (they are no throughput)."""
    seconds = max(seconds, 1e-9)
    accepted = (after.accepted - before.accepted) / seconds
    recipients = (after.recipients - before.recipients) / seconds
    return (
        f"{label} {phase}: {accepted:,.0f} accepted/s ({recipients:,.0f} recipients/s), "
        f"{after.other - before.other:,} other answers, p99 {p99_ms:.1f} ms"
    )


class Recorder:
    """Latencies and answers of the requests that started inside the measured window."""

    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start = window_start
        self.window_end = window_end
        self.latencies_ms: list[float] = []
        self.by_second: dict[int, list[tuple[float, float]]] = {}
        self.lags_ms: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.recipients = 0
        self.tally = Tally()
        self.outstanding = 0
        self.max_outstanding = 0

    def counts(self, started: float) -> bool:
        return self.window_start <= started < self.window_end

    def record(self, started: float, latency: float, answer: Answer, lag: float = 0.0) -> None:
        ok = answer.status == ACCEPTED
        self.tally = Tally(
            self.tally.accepted + int(ok),
            self.tally.recipients + answer.accepted,
            self.tally.other + int(not ok),
        )
        if ok and started < self.window_end:
            # Warm-up seconds too (negative): whether a slow second follows the window's
            # start or the load's.
            second = math.floor(started - self.window_start)
            self.by_second.setdefault(second, []).append((latency * 1000, lag * 1000))
        if self.counts(started):
            self.statuses[answer.status] += 1
            self.recipients += answer.accepted
            if ok:
                self.latencies_ms.append(latency * 1000)
            self.lags_ms.append(lag * 1000)

    def result(self, duration: float) -> dict[str, Any]:
        ok = self.statuses.get(ACCEPTED, 0)
        return {
            "window_start": self.window_start,
            "window_end": self.window_end,
            "ok": ok,
            # Warm-up included: what the Cassandra operations of the whole run are divided by.
            "accepted_all": self.tally.accepted,
            "statuses": dict(self.statuses),
            "errors": sum(v for k, v in self.statuses.items() if k != ACCEPTED),
            "ok_per_s": ok / duration,
            "recipients": self.recipients,
            "recipients_per_s": self.recipients / duration,
            "latency_ms": latency_summary(self.latencies_ms),
            "lag_ms": latency_summary(self.lags_ms),
            "max_outstanding": self.max_outstanding,
            "timeline": self.timeline(),
            "warmup_timeline": self.timeline(warmup=True),
        }

    def timeline(self, *, warmup: bool = False) -> list[dict[str, float | int]]:
        """Per second of the window (``warmup``: of the warm-up before it), by when requests
        were due: requests, median, p99 and worst latency, and the worst lag of this
        generator behind the schedule (ms); where the tail comes from (periodic stalls show
        as regularly spaced spikes, a stall of the generator itself as lag)."""
        out = []
        for second in sorted(s for s in self.by_second if (s < 0) == warmup):
            latencies = sorted(latency for latency, _ in self.by_second[second])
            out.append(
                {
                    "t": round(self.window_start + second, 3),
                    "second": second,
                    "n": len(latencies),
                    "p50": round(percentile(latencies, 50.0), 1),
                    "p99": round(percentile(latencies, 99.0), 1),
                    "max": round(latencies[-1], 1),
                    "lag_max": round(max(lag for _, lag in self.by_second[second]), 1),
                }
            )
        return out


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> Answer:
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            return answer_of(resp.status, await resp.read())
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Answer(type(exc).__name__)


async def _progress(rec: Recorder, label: str) -> None:
    last, last_t = rec.tally, time.time()
    while True:
        await asyncio.sleep(REPORT_EVERY)
        now, tally = time.time(), rec.tally
        recent = rec.latencies_ms[-2000:]
        p99 = sorted(recent)[int(len(recent) * 0.99)] if recent else float("nan")
        phase = "warm-up" if now < rec.window_start else "measuring"
        line = progress_line(label, phase, last, tally, now - last_t, p99)
        child.progress(f"{line}, in flight {rec.outstanding}")
        last, last_t = tally, now


async def closed(
    spec: dict[str, Any], session: aiohttp.ClientSession, bodies: list[bytes]
) -> Recorder:
    url, headers = spec["url"], _headers()
    start = time.time()
    rec = Recorder(start + spec["warmup"], start + spec["warmup"] + spec["duration"])
    counter = iter(range(10**12))

    async def worker() -> None:
        while time.time() < rec.window_end:
            body = bodies[next(counter) % len(bodies)]
            t0 = time.time()
            rec.outstanding += 1
            answer = await _post(session, url, body, headers)
            rec.outstanding -= 1
            rec.record(t0, time.time() - t0, answer)

    rec.max_outstanding = int(spec["concurrency"])
    reporter = asyncio.create_task(_progress(rec, f"closed c={spec['concurrency']}"))
    await asyncio.gather(*(worker() for _ in range(int(spec["concurrency"]))))
    reporter.cancel()
    return rec


async def open_loop(
    spec: dict[str, Any], session: aiohttp.ClientSession, bodies: list[bytes]
) -> Recorder:
    url, headers = spec["url"], _headers()
    schedule = RateSchedule(float(spec["rate"]), time.time() + 0.05)
    warmup, duration = float(spec["warmup"]), float(spec["duration"])
    rec = Recorder(schedule.start + warmup, schedule.start + warmup + duration)
    total = schedule.count(warmup + duration)
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int) -> None:
        due = schedule.at(index)
        lag = time.time() - due
        rec.outstanding += 1
        rec.max_outstanding = max(rec.max_outstanding, rec.outstanding)
        answer = await _post(session, url, bodies[index % len(bodies)], headers)
        rec.outstanding -= 1
        rec.record(due, time.time() - due, answer, lag)

    reporter = asyncio.create_task(_progress(rec, f"open {spec['rate']:.0f}/s"))
    sent = 0
    while sent < total:
        due = min(schedule.due_by(time.time()), total)
        while sent < due:
            task = asyncio.create_task(one(sent))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        await asyncio.sleep(max(0.0, schedule.at(sent) - time.time()))
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    reporter.cancel()
    return rec


def _headers() -> dict[str, str]:
    return {
        "Authorization": f"Bearer {os.environ['BENCH_API_KEY']}",
        "Content-Type": "application/json",
    }


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    bodies = encoded_bodies(int(spec["recipients"]))
    limit = int(spec["concurrency"]) if spec["mode"] == "closed" else OPEN_LOOP_CONNECTIONS
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        runner = closed if spec["mode"] == "closed" else open_loop
        rec = await runner(spec, session, bodies)
    result = rec.result(float(spec["duration"]))
    result.update(mode=spec["mode"], recipients_per_request=int(spec["recipients"]))
    result["concurrency"] = spec.get("concurrency")
    result["rate"] = spec.get("rate")
    return result


if __name__ == "__main__":
    child.run(main)
