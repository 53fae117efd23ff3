"""Delivering one endpoint's queue: take its lease, send its waiting events in order, stop
at the first failure and schedule the next try with a delayed wake-up.

Two workers never send to one endpoint at once: the lease is a lightweight transaction,
renewed before each send, and a worker that lost it stops. A worker that dies mid-send
leaves the event not done: whoever takes the lease next (once it lapses) sends it again
under the same webhook-id (at-least-once, never skipped). Every attempt is logged; an
endpoint failing long enough (``outbound_retry.should_disable``) is disabled and its user
told, once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import aio_pika.abc
import orjson

from services.hooks.schedule import after_attempt, in_order, low_water, may_try
from shared.infra.broker import Broker
from shared.infra.config import HooksSettings
from shared.infra.metrics import HookMetrics
from shared.infra.settle import Delivery as MessageDelivery
from shared.infra.settle import Poison
from shared.outbound import outbound_retry
from shared.outbound.hook_delivery import Deliverer, Outcome
from shared.outbound.hook_queue import QUEUE_DAYS, Cursor, Deliveries, Delivery, Pending
from shared.outbound.hook_store import Endpoint, Endpoints
from shared.outbound.user_hooks import wake

log = logging.getLogger(__name__)

#: An idle endpoint's low-water mark is moved once it lags this much (not on every sweep:
#: each move is a lightweight transaction).
IDLE_MOVE = timedelta(minutes=10)
#: Told when an endpoint was disabled (the user's mail): ``(endpoint, reason)``.
Notify = Callable[[Endpoint, str], Awaitable[None]]
#: Test seam: awaited at named points of a pass (``sent``: after a send, before it is marked).
Probe = Callable[[str, Pending], Awaitable[None]]


async def _nothing(point: str, item: Pending) -> None:
    return None


async def _no_notice(endpoint: Endpoint, reason: str) -> None:
    return None


@dataclass
class Worker:
    store: Endpoints
    queue: Deliveries
    broker: Broker
    deliverer: Deliverer
    settings: HooksSettings
    notify: Notify = _no_notice
    lease_seconds: int = 60
    probe: Probe = _nothing
    batch: int = 100
    metrics: HookMetrics | None = None

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def handle(
        self, message: aio_pika.abc.AbstractIncomingMessage, _: MessageDelivery
    ) -> None:
        """A wake-up from the queue (``settling`` acks it once this returns)."""
        try:
            body = orjson.loads(message.body)
            user_id, endpoint_id = uuid.UUID(body["user_id"]), uuid.UUID(body["endpoint_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise Poison(f"not a webhook wake-up: {exc}") from exc
        await self.run(user_id, endpoint_id)

    async def run(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> int:
        """Deliver what the endpoint has waiting; returns how many events were delivered.

        Does nothing when another worker holds the endpoint: the holder looks at the queue
        again after it lets go, so an event queued during its pass is not left behind (and
        a dead holder's endpoint resumes at the next wake-up or sweep after its lease
        lapses)."""
        delivered = 0
        while True:
            # An owner per pass, not per process: two passes of one process (two wake-ups of
            # one endpoint, one of them stalled past its lease) must exclude each other too.
            owner = uuid.uuid4()
            if not await self.queue.take_lease(endpoint_id, owner, self.lease_seconds):
                return delivered
            try:
                count, finished = await self._pass(user_id, endpoint_id, owner)
            finally:
                await self.queue.release_lease(endpoint_id, owner)
            delivered += count
            if finished is None:
                # More waits: a wake-up of its own continues, sent once the lease is free
                # (a wake-up arriving while it is held would find it taken and be dropped).
                await wake(self.broker, user_id, endpoint_id)
                return delivered
            if not finished or not await self._waiting(endpoint_id):
                return delivered

    async def _waiting(self, endpoint_id: uuid.UUID) -> bool:
        cursor = await self.queue.cursor(endpoint_id)
        since = cursor.since or self.now() - timedelta(days=QUEUE_DAYS)
        return bool(await self.queue.pending(endpoint_id, since, limit=1))

    async def has_work(self, endpoint_id: uuid.UUID) -> bool:
        """Whether the endpoint has events waiting and may be tried now."""
        cursor = await self.queue.cursor(endpoint_id)
        if not may_try(cursor.next_try, self.now()):
            return False
        return await self._waiting(endpoint_id)

    async def _pass(
        self, user_id: uuid.UUID, endpoint_id: uuid.UUID, owner: uuid.UUID
    ) -> tuple[int, bool | None]:
        """(events delivered, whether the queue was emptied: False when the pass stopped at
        a failure, for a disabled endpoint, or having lost its lease; None when more waits
        for another pass)."""
        endpoint = await self.store.endpoint(user_id, endpoint_id)
        if endpoint is None or not endpoint.enabled:
            return 0, False
        cursor = await self.queue.cursor(endpoint_id)
        if not may_try(cursor.next_try, self.now()):
            return 0, False  # failing: its delayed wake-up comes
        since = cursor.since or endpoint.created_at
        delivered = 0
        window = timedelta(seconds=self.settings.order_window)
        waiting = await self.queue.pending(endpoint_id, since, limit=self.batch)
        if waiting and self.now() - waiting[0].at < window:
            # The oldest is that recent: give every emitter the window to queue what happened
            # before it, then read again (the lease is held meanwhile, for under the window).
            await asyncio.sleep((window - (self.now() - waiting[0].at)).total_seconds())
            waiting = await self.queue.pending(endpoint_id, since, limit=self.batch)
        ready, held = in_order(waiting, self.now(), window)
        for index, item in enumerate(ready):
            if not await self.queue.renew_lease(endpoint_id, owner, self.lease_seconds):
                log.warning("lost the lease of webhook endpoint %s", endpoint_id)
                return delivered, False
            ok, cursor, endpoint = await self._attempt(endpoint, cursor, item)
            delivered += int(ok)
            if cursor.next_try is not None:
                # Stopped at a failure; the next pass starts from the oldest event not sent.
                oldest = min(i.at for i in [*ready[index:], *held])
                await self.queue.move(
                    endpoint_id,
                    owner,
                    Cursor(low_water(oldest, self.now()), cursor.attempts, cursor.next_try),
                )
                return delivered, False
        if len(waiting) == self.batch or held:
            # More waits (or came in within the window): a wake-up of its own continues from
            # here, so no delivery of the wake-up queue stays unacknowledged for long.
            rest = min((i.at for i in held), default=waiting[-1].at)
            await self.queue.move(endpoint_id, owner, Cursor(low_water(rest, self.now()), 0))
            return delivered, None
        mark = low_water(None, self.now())
        if delivered or cursor.attempts or not cursor.since or mark - cursor.since > IDLE_MOVE:
            await self.queue.move(endpoint_id, owner, Cursor(mark, 0))
        return delivered, True

    async def _attempt(
        self, endpoint: Endpoint, cursor: Cursor, item: Pending
    ) -> tuple[bool, Cursor, Endpoint]:
        now = self.now()
        outcome = await self.deliverer.send(
            endpoint.url, item.msg_id, item.body, endpoint.secrets_in_force(now), now.timestamp()
        )
        await self.probe("sent", item)
        ok = outbound_retry.answered(outcome.status)
        if self.metrics is not None:
            self.metrics.attempts.labels("ok" if ok else "failed").inc()
            self.metrics.seconds.observe(outcome.duration_ms / 1000)
        step = after_attempt(ok, cursor.attempts, self.settings.delay_tiers)
        await self.queue.log(
            endpoint.endpoint_id,
            Delivery(
                now,
                item.msg_id,
                item.type,
                cursor.attempts + 1,
                outcome.status,
                _error(outcome),
                outcome.duration_ms,
            ),
        )
        if step.done:
            await self.queue.done(endpoint.endpoint_id, item)
            if item.replay:
                await self.queue.replay_done(endpoint.endpoint_id, item.msg_id)
        endpoint = await self._health(endpoint, ok, now)
        if step.retry_in is None:
            return ok, Cursor(cursor.since, 0, None), endpoint
        if step.gave_up:
            log.warning("webhook %s: gave up on %s", endpoint.endpoint_id, item.msg_id)
        next_try = now + timedelta(seconds=step.retry_in)
        if endpoint.enabled:
            tier = self.broker.topology.delay_tier_for(step.retry_in)
            await wake(self.broker, endpoint.user_id, endpoint.endpoint_id, delay=tier)
        return ok, Cursor(cursor.since, step.attempts, next_try), endpoint

    async def _health(self, endpoint: Endpoint, ok: bool, now: datetime) -> Endpoint:
        if ok and endpoint.health == outbound_retry.Health():
            return endpoint
        health = outbound_retry.after(endpoint.health, ok, now)
        await self.store.set_health(endpoint, health)
        s = self.settings
        if not outbound_retry.should_disable(
            health,
            now,
            disable_after=timedelta(seconds=s.disable_after),
            min_failures=s.disable_min_failures,
        ):
            return _with(endpoint, health)
        reason = (
            f"{health.failures} deliveries in a row failed since "
            f"{health.failing_since.isoformat() if health.failing_since else now.isoformat()}"
        )
        if await self.store.disable(endpoint, reason, now):
            log.warning("webhook endpoint %s disabled: %s", endpoint.endpoint_id, reason)
            if self.metrics is not None:
                self.metrics.disabled.inc()
            await self.notify(endpoint, reason)
        disabled = await self.store.endpoint(endpoint.user_id, endpoint.endpoint_id)
        return disabled or _with(endpoint, health)


def _with(endpoint: Endpoint, health: outbound_retry.Health) -> Endpoint:
    return replace(endpoint, health=health)


def _error(outcome: Outcome) -> str | None:
    if outcome.error is not None:
        return outcome.error
    if outcome.status is not None and not outbound_retry.answered(outcome.status):
        return f"answered {outcome.status}"
    return None
