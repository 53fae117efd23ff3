"""In-process micro-measurement of the consumers' own CPU per recipient: the real splitter and
dispatcher (``services.consumers``) fanning out and sending ``make bench``'s batches (N = 100
personalised recipients, one chunk each) over the in-memory twins of ``tests.fakes.world``,
with the real SendGrid or Mailgun adapter posting to an ``httpx.MockTransport`` that answers
as the provider does.

    python -m bench.consumer_micro [--batches 300] [--provider sg|mg] [--profile FILE]

It prints the process's CPU (``time.process_time``, every thread) per recipient over the
splitting and sending of ``--batches`` batches accepted beforehand (acceptance is not
counted), the share of it spent inside the twins (their stores and broker: time the real
service spends in the Cassandra driver and aio-pika instead), and what is left: the consumer's
own work. ``--profile`` writes a cProfile of the measured run to FILE (``pstats`` format).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import inspect
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from bench.workload import BatchFactory
from shared.core.batch_ids import accepted_at
from shared.core.models import BatchJob
from shared.infra.byte_budget import ByteBudget
from shared.infra.config import ConsumerSettings
from shared.infra.gil import CpuLane
from shared.infra.topology import batch_key
from shared.providers.mailgun import MailgunProvider
from shared.providers.sendgrid import SendGridProvider
from tests.fakes.world import World

#: Recipients per batch, as ``make bench`` sends them.
N = 100


class TwinClock:
    """CPU seconds spent inside the twins' methods (the outermost call only: a twin calling
    another is counted once), on the event loop's thread, where they run."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    def wrap(self, twin: object) -> None:
        """Count every public coroutine method and function of ``twin``."""
        for name in dir(twin):
            if name.startswith("_"):
                continue
            method = getattr(twin, name)
            if inspect.iscoroutinefunction(method):
                setattr(twin, name, self._async(method))
            elif inspect.ismethod(method):
                setattr(twin, name, self._sync(method))

    def _async(self, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def timed(*args: Any, **kw: Any) -> Any:
            # A twin never really waits (nothing in it sleeps), so CPU between call and return
            # is the twin's own.
            if self._depth:
                return await method(*args, **kw)
            self._depth += 1
            start = time.thread_time()
            try:
                return await method(*args, **kw)
            finally:
                self.seconds += time.thread_time() - start
                self._depth -= 1

        return timed

    def _sync(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kw: Any) -> Any:
            if self._depth:
                return method(*args, **kw)
            self._depth += 1
            start = time.thread_time()
            try:
                return method(*args, **kw)
            finally:
                self.seconds += time.thread_time() - start
                self._depth -= 1

        return timed


def _answer(provider: str) -> Callable[[httpx.Request], httpx.Response]:
    counter = iter(range(1 << 62))

    def handle(request: httpx.Request) -> httpx.Response:
        n = next(counter)
        if provider == "sg":
            return httpx.Response(202, headers={"X-Message-Id": f"sg-{n}"})
        return httpx.Response(200, json={"id": f"<{n}@mg.example.com>", "message": "Queued."})

    return handle


def _world(provider: str, cpu: CpuLane) -> World:
    client = httpx.AsyncClient(transport=httpx.MockTransport(_answer(provider)))
    adapter: SendGridProvider | MailgunProvider
    if provider == "sg":
        adapter = SendGridProvider(
            api_key="SG.x.y", base_url="https://sg.test", timeout=5.0, client=client, cpu=cpu
        )
    else:
        adapter = MailgunProvider(
            api_key="key",
            domain="mg.example.com",
            base_url="https://mg.test",
            timeout=5.0,
            client=client,
            cpu=cpu,
        )
    # The production dispatcher's work budget (``services.consumers.main``): what a chunk's
    # recipients weigh is part of its work.
    return World(
        chain=provider,
        adapters={provider: adapter},
        cpu=cpu,
        work=ByteBudget(ConsumerSettings().work_budget_bytes),
    )


async def _accept(world: World, factory: BatchFactory, batches: int) -> None:
    user = uuid.uuid4()
    for seq in range(batches):
        batch = factory.new(seq, user)
        world.clock.now = max(world.clock.now, accepted_at(batch.batch_id))
        await world.batches.write(batch)
        await world.batches.index(batch)
        await world.broker.publish(
            batch_key(batch.batch_id), BatchJob(batch_id=batch.batch_id).encode()
        )


async def measure(provider: str, batches: int, profile: str | None) -> None:
    cpu = CpuLane()
    factory = BatchFactory(N, [provider])
    # A warm-up world first (imports, caches, the lane's thread), then the measured one.
    for label, count in (("warm-up", max(batches // 10, 5)), ("measured", batches)):
        world = _world(provider, cpu)
        await _accept(world, factory, count)
        twins = TwinClock()
        for twin in (
            world.batches,
            world.recipients,
            world.attempts,
            world.stats,
            world.suppressions,
            world.broker,
        ):
            twins.wrap(twin)
        target = profile if label == "measured" else None
        profiler = cProfile.Profile() if target else None
        start = time.process_time()
        if profiler is not None:
            profiler.enable()
        await world.settle()
        total = time.process_time() - start
        if profiler is not None and target:
            profiler.disable()
            profiler.dump_stats(target)
        sent = int(world.counter("recipients_sent", provider=provider))
        if sent != count * N:
            raise AssertionError(f"{sent} recipients sent, {count * N} expected")
        if label == "measured":
            per = 1e6 / sent
            print(
                f"{provider}: {total * per:6.1f} CPU µs/recipient in all, "
                f"{twins.seconds * per:6.1f} in the twins, "
                f"{(total - twins.seconds) * per:6.1f} the consumers' own "
                f"({count} batches of {N}{', profiled' if profiler else ''})"
            )
    await cpu.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--provider", choices=("sg", "mg"), default="sg")
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    asyncio.run(measure(args.provider, args.batches, args.profile))
