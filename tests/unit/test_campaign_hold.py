"""Holding a paused campaign's chunks, over the World (the real splitter and dispatcher, the
campaign twin, the World's clock): a chunk held for a simulated week comes back unchanged a
bounded number of times and writes nothing (no attempt, no recipient row), is sent once
within :data:`HOLD_MAX` of the resume, and ends failed with the reason if the campaign is
cancelled instead; a lost publish confirm while holding sends nothing twice."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from typing import Any

import pytest

from services.consumers import protocol
from services.consumers.campaign_hold import (
    FRESH_FOR,
    HOLD_MAX,
    HOLD_SECONDS,
    CampaignHold,
    again,
    hold_delay,
)
from services.consumers.dispatch import decode
from shared.audience.campaigns import METADATA_KEY, Campaign
from shared.core.batch_ids import accepted_at
from shared.core.models import BatchJob
from shared.delivery.attempts import chunk_line
from shared.delivery.batchstore import NewBatch
from shared.delivery.precedence import visible
from shared.infra.topology import Topology, batch_key
from tests.fakes.audience import FakeCampaigns
from tests.fakes.broker import FakeMessage
from tests.fakes.world import Clock, World, new_batch

WEEK = 7 * 24 * 3600
TO = ("ann@example.com", "bob@example.com")


class Shop:
    """A World whose dispatcher holds campaigns' chunks, with one campaign in it."""

    def __init__(self) -> None:
        clock = Clock()
        self.store = FakeCampaigns("t")
        # The twin stands in for the concrete CampaignStore (no Protocol for it yet).
        self.hold = CampaignHold(self.store, clock=lambda: clock.now.timestamp())
        self.world = World(clock=clock, campaigns=self.hold)
        self.deliveries = 0

    async def campaign(self) -> Campaign:
        made = await self.store.create(
            uuid.uuid4(), "autumn", uuid.uuid1(), uuid.uuid1(), {}, {}, 100, None
        )
        assert await self.store.move(made, "scheduled")
        return await self.move(made, "sending")

    async def move(self, campaign: Campaign, to: Any) -> Campaign:
        read = await self.store.get(campaign.user_id, campaign.campaign_id)
        assert read is not None and await self.store.move(read, to)
        moved = await self.store.get(campaign.user_id, campaign.campaign_id)
        assert moved is not None
        return moved

    async def accept(self, campaign: Campaign) -> NewBatch:
        """A batch of the campaign, stored and published as the API does."""
        batch = new_batch(*TO, user_id=campaign.user_id)
        message = batch.message.model_copy(
            update={"metadata": {METADATA_KEY: str(campaign.campaign_id)}}
        )
        batch = dataclasses.replace(batch, message=message)
        stamp = accepted_at(batch.batch_id) + timedelta(milliseconds=1)
        self.world.clock.now = max(self.world.clock.now, stamp)
        await self.world.batches.write(batch)
        await self.world.batches.index(batch)
        await self.world.broker.publish(
            batch_key(batch.batch_id), BatchJob(batch_id=batch.batch_id).encode()
        )
        return batch

    async def run(self, seconds: float, *, limit: int = 10_000) -> None:
        """``seconds`` of the World's time: deliver what is ready, then move the clock to the
        next delayed message due (at most ``limit`` deliveries: a bound on the work)."""
        until = self.world.clock.now + timedelta(seconds=seconds)
        while True:
            while await self.world.step():
                self.deliveries += 1
                assert self.deliveries <= limit, f"more than {limit} deliveries"
            due = self.world.broker.next_due()
            if due is None or due > until:
                self.world.clock.now = max(self.world.clock.now, until)
                return
            self.world.clock.now = max(self.world.clock.now, due)
            self.world.broker.expire(until=self.world.clock.now)

    async def line(self, batch: NewBatch) -> list[Any]:
        return list(await self.world.attempts.line(batch.batch_id, chunk_line(0)))


@pytest.fixture
async def shop() -> Shop:
    return Shop()


async def _held(shop: Shop) -> tuple[Campaign, NewBatch, list[FakeMessage]]:
    """A paused campaign's batch, split: its chunk's job, the one that is held."""
    campaign = await shop.campaign()
    batch = await shop.accept(campaign)
    campaign = await shop.move(campaign, "paused")
    shop.world.broker.take()
    assert await shop.world.step()  # the splitter publishes the chunk's job
    jobs = shop.world.broker.take()
    assert [m.routing_key for m in jobs] == [f"sg.{batch.batch_id}"]
    return campaign, batch, jobs


async def test_a_chunk_held_for_a_week_writes_nothing_and_goes_once_after_the_resume(
    shop: Shop,
) -> None:
    """A bounded number of cheap republishes of the same job (it used to add an attempt, a
    providers-map entry and a webhook event per recipient every 5 s: 120,000 a week)."""
    campaign, batch, jobs = await _held(shop)
    rows = await shop.world.rows(batch)

    await shop.run(3600)
    assert await shop.line(batch) == []  # (what used to be 720 attempts by now)
    await shop.run(WEEK - 3600, limit=WEEK // int(HOLD_MAX) + 50)

    assert await shop.line(batch) == []
    assert await shop.world.rows(batch) == rows
    assert shop.world.providers["sg"].sent == []
    copies = shop.world.broker.take()
    assert {(m.routing_key, m.body) for m in copies} == {(jobs[0].routing_key, jobs[0].body)}
    assert WEEK // HOLD_MAX <= len(copies) <= WEEK // HOLD_MAX + 50
    assert max(m.delay or 0 for m in copies) == HOLD_MAX

    resumed_at = shop.world.clock.now
    await shop.move(campaign, "sending")
    await shop.run(HOLD_MAX + 1)

    line = await shop.line(batch)
    assert [(a.state, a.provider) for a in line] == [("accepted", "sg")]
    assert line[0].calling_at is not None
    assert line[0].calling_at - resumed_at <= timedelta(seconds=HOLD_MAX + FRESH_FOR)
    assert shop.world.providers["sg"].emails() == list(TO)


async def test_a_pause_landing_after_the_look_costs_one_held_attempt_and_no_more(
    shop: Shop,
) -> None:
    """The job was let through just before the pause; the call's own look holds it (one
    attempt recorded as held, no attempt used), and its next attempt is held unclaimed."""
    campaign = await shop.campaign()
    batch = await shop.accept(campaign)

    async def pause(point: str, job: protocol.Job) -> None:
        shop.world.fault_points.clear()
        await shop.move(campaign, "paused")
        shop.world.clock.advance(FRESH_FOR + 0.1)  # the state read before is stale by now

    shop.world.fault_points["before_call"] = pause
    await shop.run(WEEK, limit=WEEK // int(HOLD_MAX) + 50)
    held = await shop.line(batch)
    await shop.move(campaign, "sending")
    await shop.run(HOLD_MAX + 1)

    assert [(a.state, (a.error or "").split("|")[0]) for a in held] == [("rejected", "held")]
    line = await shop.line(batch)
    assert [(a.attempt, a.state) for a in line] == [(0, "rejected"), (1, "accepted")]
    assert shop.world.providers["sg"].emails() == list(TO)


async def test_a_held_chunk_of_a_cancelled_campaign_ends_failed_with_the_reason(
    shop: Shop,
) -> None:
    campaign, batch, _ = await _held(shop)
    await shop.run(3600)

    await shop.move(campaign, "cancelled")
    await shop.run(HOLD_MAX + 1)

    assert shop.world.providers["sg"].sent == []
    states = {e: visible(r) for e, r in (await shop.world.rows(batch)).items()}
    assert {(v.state, v.reason) for v in states.values()} == {
        ("failed", "its campaign was cancelled")
    }
    assert [a.decision for a in await shop.line(batch)] == ["give_up"]


@pytest.mark.parametrize("delivered", [False, True])
async def test_a_hold_whose_publish_confirm_is_lost_sends_the_chunk_once(
    shop: Shop, delivered: bool
) -> None:
    """Not delivered: the delivery is retried and publishes it again (one copy goes on).
    Delivered: two copies go on, and after the resume the second finds the work done."""
    campaign, batch, _ = await _held(shop)
    shop.world.broker.fail(delivered=delivered)
    await shop.run(60)

    await shop.move(campaign, "sending")
    await shop.run(HOLD_MAX + 1)

    assert shop.world.providers["sg"].emails() == list(TO)
    assert [a.state for a in await shop.line(batch)] == ["accepted"]
    assert shop.world.dead == []


async def test_a_campaign_not_paused_is_not_held(shop: Shop) -> None:
    campaign = await shop.campaign()
    batch = await shop.accept(campaign)

    await shop.run(60)

    assert shop.world.providers["sg"].emails() == list(TO)
    assert [a.state for a in await shop.line(batch)] == ["accepted"]


async def test_a_check_of_an_attempt_started_before_the_pause_is_not_held(shop: Shop) -> None:
    """It settles what was begun (a call in flight, an ambiguous outcome)."""
    _, batch, _ = await _held(shop)
    header = await shop.world.batches.header(batch.batch_id)
    assert header is not None
    job = protocol.Job(batch.batch_id, chunk_line(0), 0, None, 0, "sg", check=1)

    held = await shop.hold.held(job, header.user_id, header.message, shop.world.broker)  # type: ignore[arg-type]

    assert not held and shop.world.broker.take() == []


def test_holds_grow_with_the_pause_from_five_seconds_to_the_cap() -> None:
    tiers = Topology().all_delay_tiers  # 5, 30, 120, 600

    waits = [hold_delay(t, tiers) for t in (0, 5, 29, 30, 119, 120, 3600, WEEK)]

    assert waits == [HOLD_SECONDS, 5, 5, 30, 30, HOLD_MAX, HOLD_MAX, HOLD_MAX]
    assert hold_delay(0, (30, 600)) == 30  # no tier short enough: the shortest


@pytest.mark.parametrize(
    "job",
    [
        protocol.Job(uuid.uuid1(), chunk_line(3), 3, None, 0, "sg"),
        protocol.Job(uuid.uuid1(), chunk_line(1), 1, None, 2, "mg", lane="bulk"),
        protocol.Job(uuid.uuid1(), "log", 4, uuid.uuid1(), 1, "sg"),
    ],
)
def test_a_held_job_is_published_again_as_it_came(job: protocol.Job) -> None:
    key, body, _ = again(job)

    decoded, deferral = decode(FakeMessage(key, body))  # type: ignore[arg-type]

    if job.log_id is not None:
        job = dataclasses.replace(job, line=decoded.line)  # the line is derived from the id
    assert (decoded, deferral) == (job, None)
