"""The real emitter (``shared.outbound.user_hooks.HookEmitter``) and delivery worker
(``services.hooks.worker.Worker``) over the webhook stores' twins (``tests/fakes/outbound.py``),
the fake broker and an endpoint answering from a script, on the simulator's virtual clock
(``simulation.runtime.simulate``: the order window, retry delays and lease TTLs pass at once).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from services.hooks.worker import Probe, Worker
from shared.infra.config import HooksSettings
from shared.infra.settle import Delivery
from shared.infra.topology import Topology
from shared.outbound.hook_queue import Pending
from shared.outbound.hook_store import Endpoint
from shared.outbound.outbound_retry import Health
from shared.outbound.user_hooks import HookEmitter, HookEvent, message_id, payload
from simulation.runtime import VirtualClock, simulate
from tests.fakes.broker import FakeBroker
from tests.fakes.outbound import FakeDeliverer, FakeHookQueue, FakeHookStore, emitter_over
from tests.fakes.wire import LOOPBACK, Kind, Trip

T = TypeVar("T")

SETTINGS = HooksSettings(delays="5,30,120", order_window=2.0)


class Killed(BaseException):
    """The process died here: nothing after it runs (nothing catches a BaseException)."""


@dataclass
class Mortal:
    """A wire on which a process (here: a task) dies: every round trip it makes once it is
    dead ends it, its ``finally`` clauses' included."""

    dead: set[asyncio.Task[Any]] = field(default_factory=set)

    def kill(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.dead.add(task)
        raise Killed("killed")

    async def trip(self, op: str, kind: Kind) -> Trip:
        if asyncio.current_task() in self.dead:
            raise Killed(op)
        return await LOOPBACK.trip(op, kind)


@dataclass
class Hooks:
    """One user's endpoints, the emitter the send path calls, and the delivery worker."""

    store: FakeHookStore
    queue: FakeHookQueue
    broker: FakeBroker
    deliverer: FakeDeliverer
    emitter: HookEmitter
    user_id: uuid.UUID = field(default_factory=uuid.uuid4)

    @classmethod
    def create(cls, wire: Mortal | None = None) -> Hooks:
        store, queue = FakeHookStore(wire=wire or LOOPBACK), FakeHookQueue(wire=wire or LOOPBACK)
        broker = FakeBroker(Topology(exchange="t", delay_tiers=SETTINGS.delay_tiers))
        return cls(store, queue, broker, FakeDeliverer(), emitter_over(store, queue, broker))

    def worker(self, probe: Probe | None = None) -> Worker:
        extra = {} if probe is None else {"probe": probe}
        return Worker(
            self.store,
            self.queue,
            self.broker,  # type: ignore[arg-type]
            self.deliverer,  # type: ignore[arg-type]
            SETTINGS,
            **extra,  # type: ignore[arg-type]
        )

    async def endpoint(self, url: str) -> Endpoint:
        """A new endpoint, as the API creates it (from now on)."""
        now = datetime.now(UTC)
        created: Endpoint = await self.store.create(self.user_id, url, frozenset(), now)
        await self.queue.start(created.endpoint_id, now)
        return created

    async def settle(self, worker: Worker) -> None:
        """Run ``worker`` on every wake-up, letting time pass to each delayed one, until no
        wake-up is left."""
        while True:
            message = await self.broker.get(self.broker.topology.hooks_queue)
            if message is not None:
                await worker.handle(message, Delivery())  # type: ignore[arg-type]
                continue
            due = self.broker.next_due()
            if due is None:
                return
            await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
            self.broker.expire(datetime.now(UTC))


def event(kind: str, at: datetime, n: int) -> HookEvent:
    return HookEvent(kind, f"src-{n}", at, uuid.uuid1(), uuid.uuid4(), "ann@example.com")


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def on_the_clock(clock: VirtualClock) -> T:
        return await main()

    return simulate(on_the_clock, seed=11)


def test_emitted_events_reach_the_endpoint_in_the_order_they_happened() -> None:
    """Two emits (the first's events given out of order): each delivered once, by occurrence,
    signed with the endpoint's secret, each attempt logged."""

    async def main() -> None:
        hooks = Hooks.create()
        endpoint = await hooks.endpoint("https://a.example.com/in")
        t0 = datetime.now(UTC)
        first = [event("recipient.delivered", t0 + timedelta(seconds=1), 2)]
        first.insert(0, event("recipient.sent", t0, 1))
        later = event("recipient.opened", t0 + timedelta(seconds=2), 3)

        queued = await hooks.emitter.emit(hooks.user_id, list(reversed(first)))
        queued += await hooks.emitter.emit(hooks.user_id, [later])
        await hooks.settle(hooks.worker())

        sent = [*first, later]
        assert queued == 3
        assert hooks.deliverer.got(endpoint.url) == [message_id(e) for e in sent]
        assert [r.body for r in hooks.deliverer.requests] == [payload(e) for e in sent]
        assert {r.secrets for r in hooks.deliverer.requests} == {(endpoint.secret,)}
        log = await hooks.queue.deliveries(endpoint.endpoint_id, datetime.now(UTC).date())
        assert [(d.msg_id, d.attempt, d.status) for d in reversed(log)] == [
            (message_id(e), 1, 200) for e in sent
        ]
        assert not await hooks.worker().has_work(endpoint.endpoint_id)

    run(main)


def test_a_failing_endpoint_is_retried_after_each_delay_then_gets_the_rest_in_order() -> None:
    """A 500, then no answer: the head event is tried again after 5 s, then 30 s, and once
    it is answered the next follows; the endpoint's run of failures ends."""

    async def main() -> None:
        hooks = Hooks.create()
        endpoint = await hooks.endpoint("https://b.example.com/in")
        hooks.deliverer.script(endpoint.url, 500, "ConnectError: connection refused")
        t0 = datetime.now(UTC)
        one, two = event("recipient.sent", t0, 1), event("recipient.delivered", t0, 2)

        await hooks.emitter.emit(hooks.user_id, [one, two])
        await hooks.settle(hooks.worker())

        tried = [(r.msg_id, r.status) for r in hooks.deliverer.requests]
        at = [r.timestamp for r in hooks.deliverer.requests]
        log = await hooks.queue.deliveries(endpoint.endpoint_id, datetime.now(UTC).date())
        found = await hooks.store.endpoint(hooks.user_id, endpoint.endpoint_id)
        assert tried == [
            (message_id(one), 500),
            (message_id(one), None),
            (message_id(one), 200),
            (message_id(two), 200),
        ]
        assert at[1] - at[0] >= 5 - 1  # a second early counts (delay queues are not exact)
        assert at[2] - at[1] >= 30 - 1
        assert [(d.attempt, d.status, d.error) for d in reversed(log)] == [
            (1, 500, "answered 500"),
            (2, None, "ConnectError: connection refused"),
            (3, 200, None),
            (1, 200, None),
        ]
        assert found is not None and found.health == Health()
        assert not await hooks.worker().has_work(endpoint.endpoint_id)

    run(main)


def test_a_worker_killed_after_a_send_leaves_the_event_to_the_next_once_its_lease_lapses() -> None:
    """Killed before marking the event done (and before letting go of its lease): another
    worker finds the endpoint held, and once the lease lapsed sends that event again under
    the same webhook-id, then the rest."""

    async def main() -> None:
        wire = Mortal()
        hooks = Hooks.create(wire)
        endpoint = await hooks.endpoint("https://c.example.com/in")
        t0 = datetime.now(UTC)
        one, two = event("recipient.sent", t0, 1), event("recipient.delivered", t0, 2)
        await hooks.emitter.emit(hooks.user_id, [one, two])

        async def die(point: str, item: Pending) -> None:
            wire.kill()

        dying = hooks.worker(probe=die)
        with pytest.raises(Killed):
            await asyncio.create_task(dying.run(hooks.user_id, endpoint.endpoint_id))
        survivor = hooks.worker()
        while_held = await survivor.run(hooks.user_id, endpoint.endpoint_id)
        await asyncio.sleep(survivor.lease_seconds + 1)
        after = await survivor.run(hooks.user_id, endpoint.endpoint_id)

        assert (while_held, after) == (0, 2)
        assert hooks.deliverer.got(endpoint.url) == [message_id(e) for e in (one, one, two)]

    run(main)


def test_an_endpoint_deleted_while_its_delivery_fails_does_not_stop_the_users_others() -> None:
    """The worker records the failed attempt's health after the user deleted the endpoint:
    the user's next events are queued for her other endpoint alone, and delivered."""

    async def main() -> None:
        hooks = Hooks.create()
        gone = await hooks.endpoint("https://gone.example.com/in")
        kept = await hooks.endpoint("https://kept.example.com/in")
        hooks.deliverer.script(gone.url, 500)
        t0 = datetime.now(UTC)
        one, two = event("recipient.sent", t0, 1), event("recipient.delivered", t0, 2)
        await hooks.emitter.emit(hooks.user_id, [one])

        async def deleted_meanwhile(point: str, item: Pending) -> None:
            await hooks.store.delete(gone)

        await hooks.worker(probe=deleted_meanwhile).run(hooks.user_id, gone.endpoint_id)
        queued = await hooks.emitter.emit(hooks.user_id, [two])
        await hooks.settle(hooks.worker())

        assert queued == 1
        assert [e.endpoint_id for e in await hooks.store.endpoints(hooks.user_id)] == [
            kept.endpoint_id
        ]
        assert hooks.deliverer.got(gone.url, ok_only=False) == [message_id(one)]
        assert hooks.deliverer.got(kept.url) == [message_id(one), message_id(two)]

    run(main)
