"""The campaign runner over twins (campaigns, lists, templates, its lease; each slice
accepted by the real ``Sending`` and sent by the World's splitter and dispatcher): every
contact is mailed once and every slice recorded once, whatever happens at each await of a
slice (the process killed there, a write timing out having applied or not, two runners
racing after a lease lapsed), even when a contact or the template changed before the retry
or the slice's Idempotency-Key expired meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from services.api.campaign_runner import (
    ASK_EVERY,
    LEASE_SECONDS,
    PASS_EVERY,
    CampaignRunner,
    next_wait,
    pace,
)
from services.api.campaigns import Campaigns
from services.api.contacts_csv import Contact
from services.api.sending import Sending
from services.api.templated import TemplateBatches
from shared.accounts.ratelimit import Verdict
from shared.audience.campaigns import METADATA_KEY, Campaign
from shared.core.errors import DependencyUnavailable
from shared.delivery.acceptance import Acceptance
from shared.infra.background import Background
from shared.infra.config import ApiSettings, Settings
from shared.infra.leases import SCHEDULER_WAKE, wake
from shared.infra.metrics import ApiMetrics
from shared.templates.template_limits import Limit
from shared.templates.template_pool import RendererBusy
from shared.templates.template_render import LimitError, RendererCrashed
from tests.fakes.accounts import FakeQuota
from tests.fakes.api import FakeContactLists, FakeIdempotencyStore
from tests.fakes.audience import FakeCampaigns, FakeSuppressionStore
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeOutbox, FakeSchedule
from tests.fakes.renderer import InlineRenderer
from tests.fakes.templates import FakeTemplates
from tests.fakes.world import World

#: Seconds past the runner's lease (15 s).
LAPSE = 16


class Killed(Exception):
    """The runner's process dies here (nothing of the pass survives but what it wrote)."""


class _Quota(FakeQuota):
    """The quota twin, refusing the next ``refusals`` batches whatever it holds."""

    refusals = 0

    async def consume(
        self, user_id: uuid.UUID, recipients: int, *, now: datetime | None = None
    ) -> tuple[Verdict, Any]:
        if self.refusals:
            self.refusals -= 1
            return Verdict(False, 3600), (now or datetime.now(UTC)).date()
        return await super().consume(user_id, recipients, now=now)


@dataclass
class Desk:
    """A user's campaign of one list and one template, its runners, and what they sent."""

    world: World = field(default_factory=World)
    campaigns: FakeCampaigns = field(default_factory=lambda: FakeCampaigns("t"))
    lists: FakeContactLists = field(default_factory=FakeContactLists)
    templates: FakeTemplates = field(default_factory=FakeTemplates)
    renderer: InlineRenderer = field(default_factory=InlineRenderer)
    schedule: FakeSchedule = field(default_factory=lambda: FakeSchedule("t"))
    keys: FakeCassandra = field(default_factory=FakeCassandra)
    user: uuid.UUID = field(default_factory=uuid.uuid4)
    key_lease: float = 0.0
    """Seconds an Idempotency-Key claim is leased (0: a request that died can be taken over
    at once, as if its lease had run out by the retry)."""

    def __post_init__(self) -> None:
        self.quota = _Quota(self.world.db, daily_limit=1_000_000)
        self.acceptance = Acceptance(
            self.world.batches,
            FakeOutbox(self.world.db),
            self.world.broker,  # type: ignore[arg-type]
            refunds=self.quota,
        )
        self.idempotency = FakeIdempotencyStore(self.keys, lease=self.key_lease)
        self.sending = Sending(
            settings=Settings(api=ApiSettings(sender_domains="any"), providers=self.world.settings),
            acceptance=self.acceptance,
            batches=self.world.batches,
            suppressions=FakeSuppressionStore(self.world.db),
            idempotency=self.idempotency,
            quota=self.quota,  # type: ignore[arg-type]
            metrics=ApiMetrics.create(CollectorRegistry()),
            background=Background(),
            templates=TemplateBatches(self.templates, self.renderer),
        )
        self.runner = self.new_runner()

    def new_runner(self) -> CampaignRunner:
        return CampaignRunner(
            self.campaigns,
            self.lists,
            self.templates,
            self.sending,
            self.schedule,
        )

    async def start(self, contacts: dict[str, str], *, per_slice: int) -> Campaign:
        """A campaign of ``contacts`` (address -> first name), scheduled for now, sent in
        slices of ``per_slice``."""
        made = await self.lists.create(self.user, "members")
        await self.put(made.list_id, contacts)
        self.template = await self.templates.create(
            self.user, "news", "News for {{ first_name }}", "<p>Hi {{ first_name }}</p>", None, {}
        )
        template = await self.templates.get(self.user, self.template)
        assert template is not None
        await self.templates.publish(template, 1)
        rate = per_slice * 2  # a pass (half a second) releases one slice of ``per_slice``
        assert pace(rate) == (1, per_slice)
        campaign = await self.campaigns.create(
            self.user, "autumn", self.template, made.list_id, {"email": "news@example.com"}, {},
            rate, None,
        )  # fmt: skip
        assert await self.campaigns.move(campaign, "scheduled")
        return await self.read(campaign)

    async def put(self, list_id: uuid.UUID, contacts: dict[str, str]) -> None:
        """Import ``contacts`` (again: a re-import replaces their fields)."""
        await self.lists.put(
            list_id,
            [Contact(e, {"first_name": n} if n else {}) for e, n in contacts.items()],
        )

    async def publish(self, subject: str, html: str) -> None:
        """Make a new version of the template live."""
        template = await self.templates.get(self.user, self.template)
        assert template is not None
        number = await self.templates.add_version(template, subject, html, None, {})
        await self.templates.publish(template, number)

    async def read(self, campaign: Campaign) -> Campaign:
        found = await self.campaigns.get(campaign.user_id, campaign.campaign_id)
        assert found is not None
        return found

    def lapse(self) -> None:
        """Time passes beyond a dead runner's lease."""
        self.schedule.tables.clock.advance(LAPSE)

    async def run(self, campaign: Campaign, *, passes: int = 20) -> Campaign:
        """Passes of the runner until the campaign is no longer running. A pass that raised
        ``Killed`` was a runner that died: another takes over once its lease lapsed; one that
        raised ``DependencyUnavailable`` is retried by the same runner (as ``keep_running``
        does)."""
        for _ in range(passes):
            try:
                await self.runner.pass_once()
            except Killed:
                self.lapse()
                self.runner = self.new_runner()
            except DependencyUnavailable:
                self.lapse()
            found = await self.read(campaign)
            if found.state not in ("scheduled", "sending"):
                return found
        return await self.read(campaign)

    def mails(self) -> dict[str, int]:
        """How many copies each address was sent, through every provider."""
        counts: dict[str, int] = {}
        for provider in self.world.providers.values():
            for email in provider.emails():
                counts[email] = counts.get(email, 0) + 1
        return counts

    def names(self) -> dict[str, str]:
        """The first name each address's copy was given (its substitution's value, under
        whatever marker the template's parts use)."""
        return {
            r.email: next(iter(set(r.substitutions.values())), "")
            for provider in self.world.providers.values()
            for chunk in provider.sent
            for r in chunk.recipients
        }

    async def batches(self, campaign: Campaign) -> set[uuid.UUID]:
        """The campaign's batches that were stored."""
        found = set()
        for batch_id in list(self.world.db.headers):
            header = await self.world.batches.header(batch_id)
            named = header.message.metadata.get(METADATA_KEY) if header else None
            if named == str(campaign.campaign_id):
                found.add(batch_id)
        return found

    async def recorded(self, campaign: Campaign) -> dict[int, uuid.UUID]:
        return {s.slice: s.batch_id for s in await self.campaigns.slices(campaign.campaign_id)}


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    made = Desk()
    yield made
    await made.sending.background.drain()


@pytest.fixture
async def racing() -> AsyncIterator[Desk]:
    """Claims leased for 30 s: a request in progress stays so for the whole test."""
    made = Desk(key_lease=30.0)
    yield made
    await made.sending.background.drain()


CONTACTS = {"ann@example.com": "Ann", "bob@example.com": "Bob", "cy@example.com": ""}
SIX = {**CONTACTS, "dan@example.com": "Dan", "eve@example.com": "Eve", "fay@example.com": "Fay"}


async def _sent_once(desk: Desk, campaign: Campaign, contacts: dict[str, str]) -> None:
    """The campaign ended sent, each contact was mailed once, and each slice's stored batch
    is recorded once, under its slice."""
    done = await desk.read(campaign)
    await desk.world.settle()
    slices = -(-len(contacts) // pace(campaign.rate)[1])
    assert (done.state, done.reason) == ("sent", None)
    assert (done.slices, done.released, done.skipped) == (slices, len(contacts), 0)
    assert desk.mails() == dict.fromkeys(contacts, 1)
    recorded = await desk.recorded(campaign)
    assert sorted(recorded) == list(range(slices))
    assert set(recorded.values()) == await desk.batches(campaign)


async def test_a_campaign_goes_out_slice_by_slice_each_contact_once(desk: Desk) -> None:
    """Every staged slice is closed once the cursor moved past it (its request dropped)."""
    campaign = await desk.start(SIX, per_slice=3)

    await desk.run(campaign)

    await _sent_once(desk, campaign, SIX)
    staged = desk.campaigns.tables.staged[campaign.campaign_id]
    assert sorted(staged) == [0, 1] and all(s.closed for s in staged.values())
    assert desk.names() == SIX  # cy has no first name: it is sent empty


async def test_a_slice_retried_after_its_contacts_changed_goes_out_as_first_built(
    desk: Desk,
) -> None:
    """The runner dies after the slice's 202 and before moving the cursor; a re-import then
    changes a contact and a new live version no longer wants ``first_name``: the retry gets
    the first batch back (it used to be a 409 that paused the campaign on every resume)."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.campaigns.tables.fail("record", Killed())
    await desk.run(campaign, passes=1)
    await desk.put(campaign.list_id, {"ann@example.com": "Annie"})
    await desk.publish("News", "<p>Hello</p>")

    await desk.run(campaign)

    await _sent_once(desk, campaign, CONTACTS)
    assert desk.names()["ann@example.com"] == "Ann"


async def test_a_slice_resumed_after_its_key_expired_is_recorded_not_sent_again(
    desk: Desk,
) -> None:
    """Died after the 202, paused, resumed a day later with a contact changed: the slice's
    batch is found stored and recorded; nothing is accepted again (it used to be sent twice:
    three contacts, six mails, the first batch missing from the campaign's batches)."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.campaigns.tables.fail("record", Killed())
    await desk.run(campaign, passes=1)
    assert await desk.campaigns.move(await desk.read(campaign), "paused", reason="user")
    key = f"campaign.{campaign.campaign_id}.0"
    desk.idempotency.age(desk.user, key, remaining=0)
    await desk.put(campaign.list_id, {"bob@example.com": "Robert"})

    paused = await desk.read(campaign)
    assert await desk.campaigns.move(paused, "sending")
    await desk.run(campaign)

    await _sent_once(desk, campaign, CONTACTS)


async def test_a_campaign_whose_first_slice_the_quota_refuses_pauses_with_the_reason(
    desk: Desk,
) -> None:
    """Its pass started it (scheduled to sending) before the refusal: the pause still lands
    (it used to be tried from the state read before the start, and never applied)."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.quota.refusals = 1

    after = await desk.run(campaign, passes=1)

    assert (after.state, after.slices) == ("paused", 0)
    assert "daily quota" in (after.reason or "")


async def test_a_slice_the_quota_refused_is_sent_as_staged_when_resumed(desk: Desk) -> None:
    """The campaign pauses with the reason; contacts changed while it waited do not change
    the slice it resumes with."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.quota.refusals = 1

    paused = await desk.run(campaign)
    await desk.put(campaign.list_id, {"ann@example.com": "Annie"})
    assert await desk.campaigns.move(paused, "sending")
    await desk.run(campaign)

    assert paused.state == "paused" and "quota" in (paused.reason or "")
    await _sent_once(desk, campaign, CONTACTS)
    assert desk.names()["ann@example.com"] == "Ann"


#: Every await of a slice's release that can fail, as (twin, operation, applied): the
#: process killed there or the write timing out, before it took effect or after.
FAULTS = [
    ("campaigns", "staged", False),
    ("campaigns", "stage", False),
    ("campaigns", "stage", True),
    ("cassandra", "batches.header", False),
    ("acceptance", "batches.write", False),
    ("acceptance", "batches.write", True),
    ("campaigns", "record", False),
    ("campaigns", "record", True),
    ("campaigns", "advance", False),
    ("campaigns", "advance", True),
    ("campaigns", "close", False),
    ("campaigns", "close", True),
    ("campaigns", "get", False),
]


@pytest.mark.parametrize("error", ["killed", "timeout"])
@pytest.mark.parametrize(("twin", "operation", "applied"), FAULTS)
async def test_a_slice_interrupted_at_any_await_is_sent_once_and_recorded_once(
    desk: Desk, twin: str, operation: str, applied: bool, error: str
) -> None:
    """Whatever failed, and though a contact and the template changed before the retry."""
    campaign = await desk.start(SIX, per_slice=3)
    await desk.run(campaign, passes=1)  # slice 0 goes out untroubled
    failure: BaseException = (
        Killed() if error == "killed" else DependencyUnavailable("cassandra", "WriteTimeout")
    )
    if twin == "campaigns":
        desk.campaigns.tables.fail(operation, failure, applied=applied)
    elif twin == "cassandra":
        desk.world.db.fail(operation, failure, applied=applied)
    else:
        desk.world.db.fail("batches.write", failure, applied=applied)
    with pytest.raises(type(failure)):
        await desk.runner.pass_once()  # slice 1 fails part-way
    await desk.put(campaign.list_id, {"dan@example.com": "Daniel", "fay@example.com": ""})
    await desk.publish("Hello {{ first_name }}", "<p>Hello {{ first_name }}</p>")
    desk.lapse()
    if error == "killed":
        desk.runner = desk.new_runner()

    await desk.run(campaign)

    await _sent_once(desk, campaign, SIX)


async def test_two_runners_racing_on_one_slice_send_it_once(racing: Desk) -> None:
    """The first runner's lease lapsed mid-slice and another took over: both release the
    slice at once, interleaving at every round trip; one batch, recorded once, one move."""
    desk = racing
    campaign = await desk.start(SIX, per_slice=3)
    await desk.run(campaign, passes=1)
    read = await desk.read(campaign)
    other = desk.new_runner()

    results = await asyncio.gather(
        desk.runner.release(read, 3), other.release(read, 3), return_exceptions=True
    )

    moved = [r for r in results if not isinstance(r, BaseException) and r is not None]
    assert len(moved) <= 1, results
    assert (await desk.read(campaign)).slices == 2
    await desk.run(campaign)
    await _sent_once(desk, campaign, SIX)


async def test_a_runner_that_read_the_campaign_before_another_sent_the_slice_stops(
    desk: Desk,
) -> None:
    """It finds the slice closed: nothing is staged, accepted or recorded again."""
    campaign = await desk.start(SIX, per_slice=3)
    await desk.run(campaign, passes=1)
    stale = await desk.read(campaign)
    await desk.run(campaign, passes=1)  # slice 1 goes out
    await desk.put(campaign.list_id, {"dan@example.com": "Daniel"})

    again = await desk.new_runner().release(stale, 3)

    assert again is None
    await desk.run(campaign)
    await _sent_once(desk, campaign, SIX)


async def test_a_slice_whose_contacts_were_all_left_out_moves_on_without_a_batch(
    desk: Desk,
) -> None:
    """Counted skipped, and no batch recorded for it."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    for email in CONTACTS:
        await desk.sending.suppressions.add(desk.user, email, reason="bounce", source="test")

    done = await desk.run(campaign)

    assert (done.state, done.slices, done.released, done.skipped) == ("sent", 1, 0, 3)
    assert await desk.recorded(campaign) == {}
    assert await desk.batches(campaign) == set()


async def test_a_live_version_past_a_template_limit_pauses_the_campaign_naming_it(
    desk: Desk,
) -> None:
    """The slice's render is refused by a limit: the campaign pauses with the limit named
    (visible to its owner), is not retried pass after pass, and nothing was sent."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    await desk.publish("News", "<p>{{ (1).to_bytes(10**9, 'big') }}</p>")

    paused = await desk.run(campaign)
    jobs = len(desk.renderer.jobs)
    await desk.run(paused)

    assert paused.state == "paused"
    assert "result_size" in (paused.reason or "")
    assert len(desk.renderer.jobs) == jobs  # a paused campaign renders nothing more
    assert desk.mails() == {}


@pytest.mark.parametrize("job", ["per_recipient", "render_batch"])
@pytest.mark.parametrize(
    "breach",
    [
        LimitError(Limit.MEMORY, "the template needs too much memory"),
        LimitError(Limit.TIME, "compiling and rendering took longer than 5 s"),
        RendererCrashed("the process rendering the template died (signal SIGKILL)"),
    ],
)
async def test_a_breach_in_a_worker_pauses_the_campaign_and_a_resume_sends_the_slice_once(
    desk: Desk, job: str, breach: Exception
) -> None:
    """A worker killed over a limit, or dying mid-render, while the slice is staged or
    rendered: paused with why; resumed, the slice goes out as staged, each contact once."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.renderer.fail(breach, job=job)

    paused = await desk.run(campaign)
    assert paused.state == "paused"
    assert str(breach) in (paused.reason or "")
    assert await desk.campaigns.move(paused, "sending")
    await desk.run(campaign)

    await _sent_once(desk, campaign, CONTACTS)


@pytest.mark.parametrize("job", ["per_recipient", "render_batch"])
async def test_a_renderer_that_cannot_take_the_slice_now_leaves_the_campaign_sending(
    desk: Desk, job: str
) -> None:
    """Every worker busy (or the pool closing) is not the template's fault: the campaign
    keeps sending and the next pass sends the slice, each contact once."""
    campaign = await desk.start(CONTACTS, per_slice=3)
    desk.renderer.fail(RendererBusy("every template renderer stayed busy for 10 s"), job=job)

    waited = await desk.run(campaign, passes=1)
    await desk.run(campaign)

    assert (waited.state, waited.reason) == ("sending", None)
    await _sent_once(desk, campaign, CONTACTS)


# -- waking: an idle runner waits for its own next due time or a wake-up -----------------------


async def test_an_idle_runner_waits_for_its_lease_renewal_not_a_short_poll(desk: Desk) -> None:
    """With no campaign listed, the holder's next pass is its lease's renewal."""
    await desk.runner.pass_once()

    assert desk.runner.busy is False
    assert desk.runner.next_in() > PASS_EVERY
    assert next_wait(datetime.now(UTC), None, LEASE_SECONDS / 3, busy=False) == LEASE_SECONDS / 3


async def test_an_idle_runner_wakes_at_the_send_at_of_a_scheduled_campaign(desk: Desk) -> None:
    """A campaign scheduled for a time that has not come sets the next pass at that time, and
    the pass then starts it."""
    now = datetime(2026, 11, 29, 12, tzinfo=UTC)
    desk.runner.clock = lambda: now
    campaign = await desk.read(await desk.start(CONTACTS, per_slice=3))
    desk.campaigns.tables.campaigns[(campaign.user_id, campaign.campaign_id)] = replace(
        campaign, send_at=now + timedelta(seconds=2)
    )

    waited = await desk.runner.pass_once()
    wait = next_wait(now, desk.runner.next_due, LEASE_SECONDS / 3, busy=desk.runner.busy)
    now += timedelta(seconds=2)
    started = await desk.runner.pass_once()

    assert (waited, wait, started) == (0, 2.0, 1)
    assert (await desk.read(campaign)).state == "sending"


async def test_a_runner_with_a_sending_campaign_passes_again_soon(desk: Desk) -> None:
    """While a campaign sends, passes follow PASS_EVERY apart (its pace is counted so)."""
    await desk.start(SIX, per_slice=3)

    await desk.runner.pass_once()

    assert desk.runner.busy is True
    assert desk.runner.next_in() == PASS_EVERY


async def test_a_paused_campaign_leaves_the_runner_idle(desk: Desk) -> None:
    """A paused campaign has nothing to send until resumed: no short poll for it."""
    campaign = await desk.start(SIX, per_slice=3)
    await desk.campaigns.move(campaign, "sending")
    assert await desk.campaigns.move(await desk.read(campaign), "paused")

    await desk.runner.pass_once()

    assert desk.runner.busy is False


async def test_scheduling_or_resuming_a_campaign_wakes_every_runner(desk: Desk) -> None:
    """The use case announces a wake-up when a campaign becomes due to run; a pause does not."""
    campaign = await desk.start(SIX, per_slice=3)
    await desk.world.broker.listen(desk.runner.loop.heard)
    use = Campaigns(
        desk.campaigns,
        desk.templates,
        desk.lists,
        desk.world.batches,  # type: ignore[arg-type]
        desk.sending,
        None,  # type: ignore[arg-type]
    )
    await desk.campaigns.move(campaign, "sending")

    await use.act(desk.user, campaign.campaign_id, "pause", None)
    await desk.sending.background.drain()
    after_pause = await desk.runner.loop.alarm.wait(0)
    await use.act(desk.user, campaign.campaign_id, "resume", None)
    await desk.sending.background.drain()
    after_resume = await desk.runner.loop.alarm.wait(3600)

    assert (after_pause, after_resume) == (False, True)


async def test_a_wake_up_for_another_loop_does_not_ring_the_runner(desk: Desk) -> None:
    """Only the runners' own wake-up ends their wait."""
    await desk.world.broker.listen(desk.runner.loop.heard)

    await wake(desk.world.broker, SCHEDULER_WAKE)
    await desk.world.broker.announce(b'{"changed": ["providers.chain"]}')

    assert await desk.runner.loop.alarm.wait(0) is False


async def test_a_runner_without_the_lease_asks_again_after_the_renewal_period(
    desk: Desk,
) -> None:
    """A runner refused the lease (another holds it) waits ASK_EVERY, a third of the lease,
    not PASS_EVERY; its wake-up still ends the wait, and a holder that stops wakes it."""
    await desk.runner.pass_once()  # the holder
    other = desk.new_runner()
    await desk.world.broker.listen(other.loop.heard)

    refused = await other.pass_once()
    wait = other.next_in()
    loop = asyncio.create_task(desk.runner.loop.run())
    await asyncio.sleep(0)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    woken_up = await other.loop.alarm.wait(0)
    await other.pass_once()

    assert (refused, wait, woken_up, other.held) == (0, ASK_EVERY, True, True)
    assert ASK_EVERY == LEASE_SECONDS / 3
    assert next_wait(datetime.now(UTC), None, 0.0, busy=True, held=False) == ASK_EVERY
