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

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import aio_pika.abc
import orjson

from services.hooks.schedule import after_attempt, low_water, may_try
from shared import outbound_retry
from shared.broker import Broker
from shared.config import HooksSettings
from shared.hook_delivery import Deliverer, Outcome
from shared.hook_store import Cursor, Delivery, Endpoint, HookStore, Pending
from shared.settle import Delivery as MessageDelivery
from shared.settle import Poison
from shared.user_hooks import wake

log = logging.getLogger(__name__)

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
    store: HookStore
    broker: Broker
    deliverer: Deliverer
    settings: HooksSettings
    notify: Notify = _no_notice
    lease_seconds: int = 60
    probe: Probe = _nothing
    owner: uuid.UUID = field(default_factory=uuid.uuid4)
    batch: int = 100

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
        """One pass over an endpoint; returns how many events it delivered. Does nothing
        when another worker holds the endpoint (it re-reads the queue before it lets go)."""
        if not await self.store.take_lease(endpoint_id, self.owner, self.lease_seconds):
            # The holder may be finishing a pass that read the queue before this event came:
            # look again shortly.
            tier = self.broker.topology.delay_tier_for(1)
            await wake(self.broker, user_id, endpoint_id, delay=tier)
            return 0
        try:
            return await self._pass(user_id, endpoint_id)
        finally:
            await self.store.release_lease(endpoint_id, self.owner)

    async def _pass(self, user_id: uuid.UUID, endpoint_id: uuid.UUID) -> int:
        endpoint = await self.store.endpoint(user_id, endpoint_id)
        if endpoint is None or not endpoint.enabled:
            return 0
        cursor = await self.store.cursor(endpoint_id)
        if not may_try(cursor.next_try, self.now()):
            return 0  # failing: its delayed wake-up comes
        since = cursor.since or endpoint.created_at
        delivered = 0
        while True:
            waiting = await self.store.pending(endpoint_id, since, limit=self.batch)
            if not waiting:
                break
            for item in waiting:
                if not await self.store.renew_lease(endpoint_id, self.owner, self.lease_seconds):
                    log.warning("lost the lease of webhook endpoint %s", endpoint_id)
                    return delivered
                ok, cursor, endpoint = await self._attempt(endpoint, cursor, item)
                if ok:
                    delivered += 1
                if cursor.next_try is not None:
                    # Stopped at a failure; where the next pass starts from.
                    oldest = item.at if not ok or cursor.attempts else None
                    await self.store.move(
                        endpoint_id,
                        self.owner,
                        Cursor(low_water(oldest, self.now()), cursor.attempts, cursor.next_try),
                    )
                    return delivered
            if len(waiting) < self.batch:
                break
        await self.store.move(endpoint_id, self.owner, Cursor(low_water(None, self.now()), 0))
        return delivered

    async def _attempt(
        self, endpoint: Endpoint, cursor: Cursor, item: Pending
    ) -> tuple[bool, Cursor, Endpoint]:
        now = self.now()
        outcome = await self.deliverer.send(
            endpoint.url, item.msg_id, item.body, endpoint.secrets_in_force(now), now.timestamp()
        )
        await self.probe("sent", item)
        ok = outbound_retry.answered(outcome.status)
        step = after_attempt(ok, cursor.attempts, self.settings.delay_tiers)
        await self.store.log(
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
            await self.store.done(endpoint.endpoint_id, item)
            if item.replay:
                await self.store.replay_done(endpoint.endpoint_id, item.msg_id)
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
