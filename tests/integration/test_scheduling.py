"""Scheduled batches on real services: accepted as ``scheduled``, sent at their ``send_at``
(within a few seconds, not before), cancellable until then and not after, kept through a
scheduler that dies part-way, and never sent twice by two schedulers."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.consumers.scheduler import Scheduler
from shared.accounts import accounts
from shared.core.errors import DependencyUnavailable
from shared.delivery.batchstore import BatchStore
from shared.delivery.schedule_store import ScheduleStore
from shared.delivery.stats import StatsStore
from shared.infra.config import Settings
from shared.infra.db import Database
from tests.conftest import unique
from tests.integration.faults import FaultyDatabase, before
from tests.integration.harness import eventually
from tests.integration.stack import Stack, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def _batch(stack: Stack, batch_id: str) -> dict[str, Any]:
    resp = await stack.api.get(f"/v1/batches/{batch_id}", headers=stack.auth)
    assert resp.status_code == 200, resp.text
    found: dict[str, Any] = resp.json()
    return found


async def _sent_at(stack: Stack, email: str, timeout: float = 40) -> datetime:
    async def check() -> datetime | None:
        resp = await stack.sandbox.get("/_control/messages", params={"to": email})
        found = resp.json() if resp.status_code == 200 else []
        return datetime.now(UTC) if found else None

    when: datetime = await eventually(check, timeout=timeout, interval=0.2)
    return when


async def test_a_scheduled_batch_waits_and_goes_at_its_time(stack: Stack) -> None:
    to = emails(2)
    send_at = datetime.now(UTC) + timedelta(seconds=6)

    async with stack.consuming():
        resp = await stack.post(to, send_at=send_at.isoformat())
        assert resp.status_code == 202, resp.text
        batch_id = resp.json()["batch_id"]
        before = await _batch(stack, batch_id)
        arrived = await _sent_at(stack, to[0])

    assert resp.json()["status"] == "scheduled"
    assert before["status"] == "scheduled"
    assert datetime.fromisoformat(before["send_at"]) - send_at < timedelta(milliseconds=1)
    # Never early; the upper bound is generous (the scheduler's pass, the send, a loaded
    # machine): how late is a figure, not this test's claim.
    assert send_at - timedelta(seconds=0.5) <= arrived <= send_at + timedelta(seconds=20)


async def test_a_cancelled_batch_is_never_sent_and_its_quota_comes_back(
    stack: Stack, db: Database
) -> None:
    to = emails(3)
    async with stack.consuming():
        # 10 s away: the schedule and its cancel land first even on a loaded machine.
        batch_id = await stack.submit(to, send_at=_at(10))
        resp = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)
        again = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)
        await asyncio.sleep(13)  # past its time, with the scheduler running
        sent = await stack.sandbox.get("/_control/messages", params={"to": to[0]})

    assert resp.status_code == again.status_code == 200
    assert resp.json() == {"batch_id": batch_id, "status": "cancelled"}
    assert (await _batch(stack, batch_id))["status"] == "cancelled"
    assert sent.json() == []
    quota = stack.api_app.state.quota
    assert await quota.used(stack.user_id, datetime.now(UTC).date()) == 0


async def test_a_cancel_whose_stats_write_timed_out_is_finished_by_its_retry(
    stack: Stack, db: Database
) -> None:
    """The cancel's transaction applies, then its stats write times out: 503. The retry
    finds the batch cancelled and answers 200 only once the stats count nothing and the
    quota has the recipients back (once, however often the cancel is repeated)."""
    to = emails(3)
    batch_id = await stack.submit(to, send_at=_at(600))
    api = stack.api_app.state
    faulty = FaultyDatabase(api.resources.db, before("SET queued = ?"))
    faulty_batches = BatchStore(faulty, StatsStore(faulty, stack.settings.stats.buckets))
    api.batches = faulty_batches
    api.acceptance = dataclasses.replace(api.acceptance, batches=faulty_batches)
    api.sending = dataclasses.replace(
        api.sending, batches=faulty_batches, acceptance=api.acceptance
    )
    quota, today = api.quota, datetime.now(UTC).date()
    assert await quota.used(stack.user_id, today) == 3

    first = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)
    again = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)
    third = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)

    assert faulty.rules[0].fired == 1
    assert (first.status_code, again.status_code, third.status_code) == (503, 200, 200)
    assert (await _batch(stack, batch_id))["status"] == "cancelled"
    assert (await stack.batch_stats(batch_id))["queued"] == 0
    assert await quota.used(stack.user_id, today) == 0


async def test_a_batch_that_started_cannot_be_cancelled(stack: Stack) -> None:
    async with stack.consuming():
        batch_id = await stack.submit(emails(1))  # no send_at: it starts at once
        resp = await stack.api.post(f"/v1/batches/{batch_id}/cancel", headers=stack.auth)

    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "batch_started"


async def test_another_users_batch_cannot_be_cancelled(stack: Stack, db: Database) -> None:
    batch_id = await stack.submit(emails(1), send_at=_at(600))
    other = await accounts.ensure_user(db, unique("other"))
    key = await accounts.create_key(db, other, "other")
    resp = await stack.api.post(
        f"/v1/batches/{batch_id}/cancel", headers={"Authorization": f"Bearer {key}"}
    )

    assert resp.status_code == 404
    assert (await _batch(stack, batch_id))["status"] == "scheduled"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("tomorrow", "RFC 3339"),
        ("2026-12-01T09:00:00", "time zone"),
        ("2020-01-01T00:00:00Z", "in the past"),
        ("2099-01-01T00:00:00Z", "ahead"),
    ],
)
async def test_a_bad_send_at_is_a_422_naming_it(stack: Stack, value: str, words: str) -> None:
    resp = await stack.post(emails(1), send_at=value)

    assert resp.status_code == 422
    assert words in resp.json()["error"]["fields"]["send_at"]


async def test_a_scheduler_dying_after_the_transition_hands_the_batch_on_again(
    stack: Stack,
) -> None:
    """Dying between the scheduled→accepted transition and the publish: the next holder
    publishes it (the batch is not lost in ``accepted``)."""
    to = emails(1)
    batch_id = uuid.UUID(await stack.submit(to, send_at=_at(1)))
    await asyncio.sleep(1.5)
    res = stack.api_app.state.resources
    store = ScheduleStore(res.db, stack.settings.amqp.exchange)
    batches = BatchStore(res.db)

    class Dying(Scheduler):
        async def hand_on(self, batch_id: uuid.UUID) -> str | None:
            await self.batches.start_scheduled(batch_id)
            raise DependencyUnavailable("rabbitmq", "died before publishing (injected)")

    first = Dying(store, batches, res.broker)
    with pytest.raises(DependencyUnavailable):
        await first.pass_once()
    await store.release_lease(first.owner)  # (its lease lapses)
    async with stack.consuming():
        await _sent_at(stack, to[0])
        logs = await stack.final(str(batch_id), 1)

    assert logs[to[0]]["state"] == "success"


async def test_two_schedulers_hand_a_batch_on_once(stack: Stack) -> None:
    batch_id = uuid.UUID(await stack.submit(emails(1), send_at=_at(1)))
    await asyncio.sleep(1.5)
    res = stack.api_app.state.resources
    store = ScheduleStore(res.db, stack.settings.amqp.exchange)
    batches = BatchStore(res.db)
    one, two = Scheduler(store, batches, res.broker), Scheduler(store, batches, res.broker)

    handed = await asyncio.gather(one.pass_once(), two.pass_once())
    again = await asyncio.gather(one.pass_once(), two.pass_once())

    assert sorted(handed) == [0, 1]  # one held the lease; the other waited
    assert list(again) == [0, 0]
    assert (await batches.header(batch_id)) is not None
    await store.release_lease(one.owner)
    await store.release_lease(two.owner)
