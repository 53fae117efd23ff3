"""Providers answering recipient by recipient, on real RabbitMQ and Cassandra: the API accepts
the batch, real consumers' deliveries (the real dispatcher, splitter and settlement) call an
in-memory provider that answers per recipient, and each answer settles its recipient once:
accepted, handed to the next provider, failed (suppressed when the answer says so), or, when
unknown, resolved and re-sent alone; a consumer killed between recording the answers and
applying them applies them once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from services.consumers.dispatch import Dispatcher
from services.consumers.faults import FaultPoints, no_faults
from services.consumers.main import build_dispatcher
from services.consumers.splitter import Splitter
from shared.audience.suppressions import SuppressionStore
from shared.core.models import Chunk
from shared.delivery.attempts import AttemptStore, chunk_line, recipient_line
from shared.delivery.batchstore import BatchStore
from shared.delivery.handoff import Routing
from shared.delivery.recipient_answers import ACCEPTED_BY_RELAY
from shared.delivery.recipients import log_id_for
from shared.infra import settle
from shared.infra.broker import Broker
from shared.infra.config import Settings
from shared.infra.current import Current
from shared.infra.db import Database
from shared.infra.resources import Resources, topology_for
from shared.infra.settle import Delivery
from shared.providers.base import Outcome, Receipt, RecipientAnswer
from shared.providers.registry import close_all
from tests.fakes.world import ScriptedProvider
from tests.integration.harness import eventually
from tests.integration.stack import Crash, Stack, crash_at, emails, fast_settings, full_stack


@pytest.fixture
async def stack(settings: Settings, db: Database) -> AsyncIterator[Stack]:
    async with full_stack(fast_settings(settings), db) as s:
        yield s


def per_recipient(
    outcomes: Mapping[str, Outcome], *, final: bool = True, suppress: bool = False
) -> Callable[[Chunk], Awaitable[Receipt]]:
    """A provider's answer for each recipient of the chunk it is sent (as a relay answers
    each RCPT): ``outcomes`` by address, accepted for any other."""

    async def answer(chunk: Chunk) -> Receipt:
        answers = []
        for r in chunk.recipients:
            outcome = outcomes.get(r.email, "accepted")
            code = {"refused_transient": 451, "refused_permanent": 550}.get(outcome, 250)
            answers.append(RecipientAnswer(r.email, outcome, code, "said", suppress=suppress))
        return Receipt("sg", 250, f"relay-{chunk.attempt}", recipients=tuple(answers), final=final)

    return answer


def providers() -> dict[str, ScriptedProvider]:
    return {"sg": ScriptedProvider("sg", "SendGrid"), "mg": ScriptedProvider("mg", "Mailgun")}


@contextlib.asynccontextmanager
async def consumer(
    stack: Stack,
    scripted: Mapping[str, ScriptedProvider],
    fault_points: FaultPoints = no_faults,
) -> AsyncIterator[tuple[Broker, Dispatcher]]:
    """A consumer's connection and dispatcher, its providers the scripted ones."""
    broker = Broker(
        stack.settings.amqp.url.get_secret_value(), topology_for(stack.settings), name="answers"
    )
    await broker.connect()
    built = build_dispatcher(stack.settings, Resources(stack.db, broker), fault_points=fault_points)
    await close_all(built.providers)
    try:
        yield broker, dataclasses.replace(built, providers=scripted)
    finally:
        await broker.close()


async def work(
    stack: Stack,
    scripted: Mapping[str, ScriptedProvider],
    done: Callable[[], Awaitable[bool]],
    timeout: float = 60,
) -> None:
    """Consume the batch and send queues (the chain's providers, both kinds of line) until
    ``done``."""
    t = topology_for(stack.settings)
    queues = [t.batches_queue]
    for code in stack.settings.providers.chain_codes:
        queues += [t.provider_queue(code), t.log_queue(code)]
    async with consumer(stack, scripted) as (broker, dispatcher):
        splitter = Splitter(
            broker, BatchStore(stack.db), Current(Routing.start(stack.settings.providers))
        )
        deadline = asyncio.get_running_loop().time() + timeout
        while not await done():
            assert asyncio.get_running_loop().time() < deadline, "the work never finished"
            took = False
            for name in queues:
                message = await broker.get(name)
                if message is not None:
                    took = True
                    process = splitter.process if name == t.batches_queue else dispatcher.process
                    await settle.run(process, message)
            if not took:
                await asyncio.sleep(0.2)


async def doomed(stack: Stack, scripted: Mapping[str, ScriptedProvider], point: str) -> str:
    """One delivery of the first sg job that dies at ``point`` (never acked: redelivered)."""
    async with consumer(stack, scripted, crash_at(point)) as (broker, dispatcher):
        message = await eventually(lambda: broker.get(stack.queue("sg")), timeout=20)
        try:
            await dispatcher.process(message, Delivery())
        except Crash as crash:
            return str(crash)
        await message.ack()
        return "survived"


def settled(stack: Stack, batch_id: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        logs = await stack.logs(batch_id)
        return len(logs) == count and all(r["state"] != "queued" for r in logs.values())

    return check


async def test_recipients_a_relay_accepted_are_delivered_through_it_once(stack: Stack) -> None:
    to = emails(2)
    scripted = providers()
    scripted["sg"].answers.append(per_recipient({}))
    batch_id = await stack.submit(to)
    await work(stack, scripted, settled(stack, batch_id, 2))
    logs = await stack.logs(batch_id)
    outcomes = {e: (r["state"], r["event"]) for e, r in logs.items()}
    assert outcomes == dict.fromkeys(to, ("success", "delivered"))
    assert scripted["sg"].emails() == to
    assert scripted["mg"].sent == []
    stats = await stack.batch_stats(batch_id)
    assert (stats["success"], stats["failed"]) == (2, 0)


async def test_a_transient_refusal_is_handed_to_the_next_provider_once(stack: Stack) -> None:
    to = emails(2)
    scripted = providers()
    scripted["sg"].answers.append(per_recipient({to[1]: "refused_transient"}))
    batch_id = await stack.submit(to)

    async def done() -> bool:
        logs = await stack.logs(batch_id)
        return logs.get(to[0], {}).get("state") == "success" and bool(scripted["mg"].sent)

    await work(stack, scripted, done)
    await work(stack, scripted, _true, timeout=5)
    assert scripted["mg"].emails() == [to[1]]
    assert [c.attempt for c in scripted["mg"].sent] == ["r.0"]
    log_id = log_id_for(uuid.UUID(batch_id), to[1])
    resends = await AttemptStore(stack.db).line(uuid.UUID(batch_id), recipient_line(log_id))
    assert [(a.provider, a.state, a.cause) for a in resends] == [("mg", "accepted", "c.0")]
    logs = await stack.logs(batch_id)
    assert logs[to[1]]["state"] == "queued"  # sent through mg, whose events are to come


async def _true() -> bool:
    return True


@pytest.mark.parametrize("suppress", [True, False])
async def test_a_permanent_refusal_fails_and_suppresses_when_the_answer_says_so(
    stack: Stack, suppress: bool
) -> None:
    to = emails(2)
    scripted = providers()
    scripted["sg"].answers.append(per_recipient({to[1]: "refused_permanent"}, suppress=suppress))
    batch_id = await stack.submit(to)
    await work(stack, scripted, settled(stack, batch_id, 2))
    logs = await stack.logs(batch_id)
    assert logs[to[0]]["state"] == "success"
    assert logs[to[1]]["state"] == "failed"
    assert scripted["mg"].sent == []
    found = await SuppressionStore(stack.db).suppressed(stack.user_id, to)
    assert set(found) == ({to[1]} if suppress else set())
    stats = await stack.batch_stats(batch_id)
    assert (stats["success"], stats["failed"]) == (1, 1)


async def test_only_the_recipient_whose_answer_is_unknown_is_resolved_and_resent(
    stack: Stack,
) -> None:
    to = emails(2)
    scripted = providers()
    scripted["sg"].answers.append(per_recipient({to[1]: "unknown"}))
    batch_id = await stack.submit(to)

    async def resent() -> bool:
        return bool(scripted["mg"].sent)

    await work(stack, scripted, resent)
    assert scripted["mg"].emails() == [to[1]]
    assert [q.emails for q in scripted["sg"].lookups] == [frozenset({to[1]})]
    line = await AttemptStore(stack.db).line(uuid.UUID(batch_id), chunk_line(0))
    assert [(a.provider, a.state, a.resolution) for a in line] == [
        ("sg", "resolved", "not_accepted"),
        ("mg", "accepted", None),
    ]
    logs = await stack.logs(batch_id)
    assert (logs[to[0]]["state"], logs[to[1]]["state"]) == ("success", "queued")


@pytest.mark.parametrize("point", ["recorded", "answers"])
async def test_a_consumer_killed_between_recording_and_applying_applies_the_answers_once(
    stack: Stack, point: str
) -> None:
    to = emails(3)
    scripted = providers()
    scripted["sg"].answers.append(
        per_recipient({to[1]: "refused_transient", to[2]: "refused_permanent"}, suppress=True)
    )
    batch_id = await stack.submit(to)
    await stack.split(batch_id)

    assert await doomed(stack, scripted, point) == point

    async def done() -> bool:
        logs = await stack.logs(batch_id)
        states = [logs.get(e, {}).get("state") for e in (to[0], to[2])]
        return states == ["success", "failed"] and bool(scripted["mg"].sent)

    await work(stack, scripted, done)
    await work(stack, scripted, _true, timeout=5)
    assert scripted["sg"].emails() == to  # called once
    assert scripted["mg"].emails() == [to[1]]  # handed over once
    stats = await stack.batch_stats(batch_id)
    assert (stats["queued"], stats["success"], stats["failed"]) == (3, 1, 1)
    found = await SuppressionStore(stack.db).suppressed(stack.user_id, to)
    assert set(found) == {to[2]}
    log_id = log_id_for(uuid.UUID(batch_id), to[1])
    resends = await AttemptStore(stack.db).line(uuid.UUID(batch_id), recipient_line(log_id))
    assert [(a.provider, a.state) for a in resends] == [("mg", "accepted")]
    timeline = await _timeline(stack, batch_id, to[0])
    assert [(t["kind"], t["detail"]) for t in timeline] == [("delivered", ACCEPTED_BY_RELAY)]


async def _timeline(stack: Stack, batch_id: str, email: str) -> list[dict[str, Any]]:
    log_id = log_id_for(uuid.UUID(batch_id), email)
    return await stack.db.rows(
        "SELECT kind, detail, event_id FROM log_events WHERE batch_id = ? AND log_id = ?",
        (uuid.UUID(batch_id), log_id),
    )
