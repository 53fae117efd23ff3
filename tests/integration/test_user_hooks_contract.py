"""The contract of ``UserHooks.emit``, run over the real emitter (Cassandra and RabbitMQ)
and its in-memory twin: what is queued for whom, in which order, under which id."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import pytest

from shared.infra.broker import Broker
from shared.infra.db import Database
from shared.outbound.hook_queue import Queued
from shared.outbound.hook_store import Endpoint
from shared.outbound.user_hooks import FakeUserHooks, HookEmitter, UserHooks
from tests.integration.hookstack import event


class Harness(Protocol):
    @property
    def hooks(self) -> UserHooks: ...

    async def endpoint(self, user_id: uuid.UUID, events: frozenset[str]) -> uuid.UUID: ...

    async def queued(self, endpoint_id: uuid.UUID) -> list[Queued]: ...


@dataclass
class _Fake:
    hooks: FakeUserHooks

    async def endpoint(self, user_id: uuid.UUID, events: frozenset[str]) -> uuid.UUID:
        ep = Endpoint(user_id, uuid.uuid4(), "https://h.example/", events, "whsec_x", _now())
        self.hooks.add(user_id, ep)
        return ep.endpoint_id

    async def queued(self, endpoint_id: uuid.UUID) -> list[Queued]:
        return self.hooks.queued.get(endpoint_id, [])


@dataclass
class _Real:
    hooks: HookEmitter

    async def endpoint(self, user_id: uuid.UUID, events: frozenset[str]) -> uuid.UUID:
        now = _now()
        created = await self.hooks.store.create(user_id, "https://h.example/", events, now)
        await self.hooks.queue.start(created.endpoint_id, now)
        return created.endpoint_id

    async def queued(self, endpoint_id: uuid.UUID) -> list[Queued]:
        found = await self.hooks.queue.pending(endpoint_id, _now() - timedelta(minutes=5))
        return [Queued(endpoint_id, p.msg_id, p.type, p.body) for p in found]


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture(params=["fake", "real"])
async def harness(
    request: pytest.FixtureRequest, db: Database, broker: Broker
) -> AsyncIterator[Harness]:
    if request.param == "fake":
        yield _Fake(FakeUserHooks())
    else:
        yield _Real(HookEmitter(db, broker, cache_seconds=0))


async def test_a_user_without_endpoints_queues_nothing(harness: Harness) -> None:
    """emit answers 0."""
    assert await harness.hooks.emit(uuid.uuid4(), [event("recipient.sent", "a@example.com")]) == 0


async def test_a_user_listens_once_an_endpoint_of_theirs_exists(harness: Harness) -> None:
    """Callers build events only for users who will get them."""
    user = uuid.uuid4()
    before = await harness.hooks.listening(user)
    await harness.endpoint(user, frozenset({"recipient.bounced"}))

    assert (before, await harness.hooks.listening(user)) == (False, True)


async def test_events_are_queued_in_order_for_endpoints_that_want_them(harness: Harness) -> None:
    """Each endpoint gets the types it asked for, in the order emitted."""
    user = uuid.uuid4()
    everything = await harness.endpoint(user, frozenset())
    bounces = await harness.endpoint(user, frozenset({"recipient.bounced"}))
    events = [
        event("recipient.sent", "b@example.com", 0),
        event("recipient.bounced", "b@example.com", 1),
    ]

    count = 0
    for e in events:
        count += await harness.hooks.emit(user, [e])

    assert count == 3
    assert [q.type for q in await harness.queued(everything)] == [
        "recipient.sent",
        "recipient.bounced",
    ]
    assert [q.type for q in await harness.queued(bounces)] == ["recipient.bounced"]


async def test_the_same_event_emitted_twice_has_one_webhook_id(harness: Harness) -> None:
    """A source emitted again (a provider retrying its webhook) is the same message."""
    user = uuid.uuid4()
    endpoint = await harness.endpoint(user, frozenset())
    once = event("recipient.delivered", "c@example.com")

    await harness.hooks.emit(user, [once])
    await harness.hooks.emit(user, [once])

    ids = [q.msg_id for q in await harness.queued(endpoint)]
    assert len(ids) == 2 and ids[0] == ids[1]
