"""Exactly once under faults, on the send path: real RabbitMQ, Cassandra, sandbox and webhooks.

A consumer process is killed (``Crash`` from the send path's hooks, then its connection is
dropped unacked) at every point where it can die; a job is delivered to two consumers at
once; the provider accepts a request and the answer never arrives; our own conditional write
times out having applied. In every case each recipient is accepted by a provider exactly
once and ends with its true outcome.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from services.consumers import protocol
from services.consumers.main import build_dispatcher
from shared.delivery.attempts import AttemptStore, chunk_line
from shared.infra import settle
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.db import Database
from shared.infra.resources import Resources, topology_for
from shared.providers.registry import close_all
from tests.integration.faults import FaultyDatabase, after, before
from tests.integration.harness import eventually
from tests.integration.stack import Stack, crash_at, emails, fast_settings, full_stack

#: A case the World carries (``make simulate``: every fault at every step, the invariant in
#: the README's table): ``make test`` leaves it out, ``make chaos`` still runs it here.
SIMULATED = pytest.mark.simulated

#: Every point of the send path where a consumer can die, in order.
POINTS = (
    "read",
    "calling",
    "before_call",
    "admitted",
    "during_call",
    "answered",
    "recorded",
    "effects",
)


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


async def _sent_once_and_delivered(stack: Stack, batch_id: str, to: list[str]) -> None:
    logs = await stack.final(batch_id, len(to))
    for email in to:
        assert logs[email]["state"] == "success", logs[email]
        assert sum((await stack.accepted(email)).values()) == 1, email
    stats = await stack.batch_stats(batch_id)
    assert (stats["queued"], stats["success"], stats["failed"]) == (len(to), len(to), 0)


@pytest.mark.parametrize(
    "point", [p if p == "calling" else pytest.param(p, marks=SIMULATED) for p in POINTS]
)
async def test_a_consumer_killed_anywhere_on_the_send_path_sends_once(
    stack: Stack, point: str
) -> None:
    """Killed at any await of the send path, the job is redelivered and finished by another
    consumer: every recipient is accepted exactly once and delivered."""
    to = emails(3)
    batch_id = await stack.submit(to)
    await stack.split(batch_id)
    if point == "during_call":
        await stack.fault("sendgrid", latency_ms=300, count=1)  # the call is in flight

    died = await stack.doomed(stack.queue("sg"), crash_at(point))

    assert died == point
    async with stack.consuming():
        await _sent_once_and_delivered(stack, batch_id, to)


async def test_one_job_delivered_to_two_consumers_at_once_is_sent_once(stack: Stack) -> None:
    """Two deliveries of one job, interleaved step by step, call the provider once."""
    to = emails(2)
    batch_id = await stack.submit(to)
    await stack.split(batch_id)
    await stack.duplicate_job(batch_id)
    arrived: list[str] = []
    both = asyncio.Event()

    async def in_step(point: str, job: protocol.Job) -> None:
        if point == "read" and not both.is_set():
            arrived.append(point)
            if len(arrived) >= 2:
                both.set()
            await asyncio.wait_for(both.wait(), 10)

    async with stack.consuming(in_step):
        await _sent_once_and_delivered(stack, batch_id, to)
    assert both.is_set()


@pytest.mark.parametrize(
    "webhooks",
    [
        pytest.param(True, id="webhook-evidence"),
        pytest.param(False, id="query-api", marks=SIMULATED),
    ],
)
async def test_accepted_then_no_answer_is_resolved_by_evidence(
    stack: Stack, webhooks: bool
) -> None:
    """SendGrid accepts but its answer never comes (the call times out): the attempt is
    resolved by its webhooks or, without them, by its query API; nothing is resent."""
    to = emails(2)
    await stack.fault("sendgrid", accept=True, latency_ms=4000, webhooks=webhooks, count=1)
    async with stack.consuming():
        batch_id = await stack.submit(to)
        await _attempt_resolved(stack, batch_id)
        if webhooks:
            await _sent_once_and_delivered(stack, batch_id, to)
        else:
            # No webhook ever comes, so the recipients stay ``sent``.
            logs = await stack.logs(batch_id)
            for email in to:
                assert (logs[email]["state"], logs[email]["event"]) == ("queued", "sent")
                assert await stack.accepted(email) == {"sendgrid": 1, "mailgun": 0}
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.state, a.resolution) for a in line] == [("resolved", "accepted")]


async def _attempt_resolved(stack: Stack, batch_id: str, attempt: int = 0) -> None:
    async def settled() -> bool:
        line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
        return len(line) > attempt and line[attempt].state == "resolved"

    await eventually(settled, timeout=60)


@SIMULATED
async def test_accepted_then_connection_reset_is_not_sent_twice(stack: Stack) -> None:
    """SendGrid accepts the whole request and the connection breaks before its answer: the
    outcome is unknown, not a failure, and evidence shows it was accepted."""
    to = emails(2)
    await stack.fault("sendgrid", accept=True, reset=True, count=1)
    async with stack.consuming():
        batch_id = await stack.submit(to)
        await _sent_once_and_delivered(stack, batch_id, to)


@pytest.mark.parametrize(
    ("provider", "status", "webhooks"),
    [
        pytest.param("sendgrid", 500, True, id="sendgrid-500-webhook-evidence", marks=SIMULATED),
        pytest.param("sendgrid", 500, False, id="sendgrid-500-query-api"),
        pytest.param("mailgun", 504, True, id="mailgun-504-webhook-evidence", marks=SIMULATED),
        pytest.param("mailgun", 504, False, id="mailgun-504-query-api", marks=SIMULATED),
    ],
)
async def test_accepted_then_a_5xx_is_not_sent_twice(
    stack: Stack, provider: str, status: int, webhooks: bool
) -> None:
    """The provider accepts the whole request and answers a 5xx (as Mailgun did with 504):
    the outcome is unknown, not a refusal, and its webhooks or, without them, its query API
    show it accepted: every recipient is accepted exactly once."""
    to = emails(2)
    if provider == "mailgun":
        await stack.fault("sendgrid", status=429, count=1)  # refused: the chunk goes to Mailgun
    await stack.fault(provider, accept=True, status=status, webhooks=webhooks, count=1)
    async with stack.consuming():
        batch_id = await stack.submit(to)
        if webhooks:
            await _sent_once_and_delivered(stack, batch_id, to)
        await _attempt_resolved(stack, batch_id, attempt=1 if provider == "mailgun" else 0)
    other = "mailgun" if provider == "sendgrid" else "sendgrid"
    for email in to:
        assert await stack.accepted(email) == {provider: 1, other: 0}
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert (line[-1].state, line[-1].resolution) == ("resolved", "accepted")


async def test_connection_broken_before_acceptance_fails_over_once(stack: Stack) -> None:
    """The connection breaks and SendGrid accepted nothing: after the query API's window
    shows no trace, the chunk goes to Mailgun, once."""
    to = emails(2)
    await stack.fault("sendgrid", reset=True, count=1)
    async with stack.consuming():
        batch_id = await stack.submit(to)
        logs = await stack.final(batch_id, 2)
    for email in to:
        assert logs[email]["state"] == "success"
        assert await stack.accepted(email) == {"sendgrid": 0, "mailgun": 1}
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.provider, a.state) for a in line] == [("sg", "resolved"), ("mg", "accepted")]
    assert line[0].resolution == "not_accepted"


async def test_a_claim_that_timed_out_but_applied_is_not_ambiguous(stack: Stack) -> None:
    """Our claim's LWT times out having applied: the retry reads it back at SERIAL, finds it
    is ours, and calls the provider once (it was never called)."""
    to = emails(2)
    batch_id = await stack.submit(to)
    await stack.split(batch_id)
    faulty = FaultyDatabase(stack.db, after("INSERT INTO send_attempts"))

    await _deliver_once(stack, faulty)

    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.state, a.resolution) for a in line] == [("accepted", None)]
    assert faulty.rules[0].fired == 1
    async with stack.consuming():
        await _sent_once_and_delivered(stack, batch_id, to)


async def test_a_record_write_timeout_after_acceptance_is_retried_not_guessed(
    stack: Stack,
) -> None:
    """Cassandra times out recording that SendGrid accepted: the consumer still knows the
    answer and records it once Cassandra answers; the attempt is ``accepted``, not
    ambiguous, and nothing is resent."""
    to = emails(2)
    batch_id = await stack.submit(to)
    await stack.split(batch_id)
    faulty = FaultyDatabase(stack.db, before("UPDATE send_attempts SET state = ?", times=2))

    await _deliver_once(stack, faulty)

    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [a.state for a in line] == ["accepted"]
    async with stack.consuming():
        await _sent_once_and_delivered(stack, batch_id, to)


async def _deliver_once(stack: Stack, db: Database) -> None:
    """One delivery of the next sg job through ``settle.run`` (retries in place, then acks)."""
    broker = Broker(
        stack.settings.amqp.url.get_secret_value(), topology_for(stack.settings), name="faulty"
    )
    await broker.connect()
    dispatcher = build_dispatcher(stack.settings, Resources(db, broker))
    try:
        message = await eventually(lambda: broker.get(stack.queue("sg")), timeout=20)
        await settle.run(dispatcher.process, message)
    finally:
        await broker.close()
        await close_all(dispatcher.providers)


@pytest.fixture
async def two_attempts(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    """A stack whose chunks get two attempts, one per provider: each failing 5xx waits for
    the query API's window, so more attempts would only add that wait."""
    async with full_stack(fast_settings(settings, max_attempts=2), db) as s:
        yield s


async def test_give_up_is_outranked_by_a_late_delivery(two_attempts: Stack) -> None:
    """Every provider fails, the recipient ends ``failed``; then the provider's word arrives
    that it delivered after all: the recipient is ``success``, counted once, not failed."""
    stack = two_attempts
    (email,) = emails(1)
    await stack.fault("sendgrid", status=503)
    await stack.fault("mailgun", status=503)
    async with stack.consuming():
        batch_id = await stack.submit([email])
        logs = await stack.final(batch_id, 1)
    assert logs[email]["state"] == "failed"
    assert (await stack.batch_stats(batch_id))["failed"] == 1

    resp = await stack.sendgrid_event(batch_id, email, "delivered")

    assert resp.status_code == 200, resp.text
    logs = await stack.logs(batch_id)
    assert (logs[email]["state"], logs[email]["event"]) == ("success", "delivered")
    stats = await stack.batch_stats(batch_id)
    assert (stats["success"], stats["failed"]) == (1, 0)
