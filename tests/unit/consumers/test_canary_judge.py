"""The canary judge's pass (``services.consumers.canary_judge``) over the in-memory twins: a
rollout is left alone until its window has passed, then promoted or rolled back from what
its batches' recipients came to (the verdict applied to the template and audited), kept
waiting while too few came back before its deadline, and dropped without a verdict when the
user published another since."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from services.consumers.canary_judge import JUDGE_EVERY, LIST_EVERY, CanaryJudge, next_wait
from shared.core.models import TemplateCopy, TemplateUse
from shared.delivery.recipients import Report, Selection, log_id_for
from shared.ops.alerts import Alert
from shared.templates.canary import Counts, Margins
from shared.templates.canary_store import Outcome, Rollout, verdict_of, verdict_text
from shared.templates.templates import Template
from tests.fakes.cassandra import FakeCassandra
from tests.fakes.delivery import FakeAttempts, FakeBatches, FakeRecipients
from tests.fakes.templates import CanaryTables, FakeCanary, FakeTemplates
from tests.fakes.wire import Kind, Loopback, Trip
from tests.fakes.world import new_batch

CANARY, LIVE = "canary@example.org", "live@example.org"
WINDOW, DEADLINE = timedelta(minutes=30), timedelta(hours=2)


@dataclass
class Setting:
    """A template with version 1 live and 2 in canary, and the judge's clock."""

    db: FakeCassandra = field(default_factory=FakeCassandra)
    templates: FakeTemplates = field(default_factory=FakeTemplates)
    store: FakeCanary = field(default_factory=lambda: FakeCanary("ns"))
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __post_init__(self) -> None:
        self.batches = FakeBatches(self.db)
        self.recipients = FakeRecipients(self.db)
        self.judge = CanaryJudge(
            self.store,
            self.templates,
            self.batches,
            self.recipients,
            Margins(min_sent=1),
            WINDOW,
            DEADLINE,
            clock=lambda: self.now,
        )

    async def rollout(self) -> tuple[Template, Rollout]:
        """Publish a canary; its rollout as the API records it."""
        user = uuid.uuid4()
        template_id = await self.templates.create(user, "t", "S1", None, "t1", {})
        template = await self.templates.get(user, template_id)
        assert template is not None
        await self.templates.add_version(template, "S2", None, "t2", {})
        live = await self.templates.publish(template, 1)
        await self.templates.publish(live, 2, canary_percent=50)
        canary = await self.templates.get(user, template_id)
        assert canary is not None and canary.canary_since is not None
        return canary, Rollout(template_id, canary.canary_since, user, 2, 1)

    async def sent(self, rollout: Rollout, *, canary_event: str | None = "sent") -> uuid.UUID:
        """A batch carrying the rollout: chunk 0 the canary's recipient, chunk 1 the live
        version's, both taken by the provider (the canary's then reported ``canary_event``;
        None: nothing went out yet)."""
        use = TemplateUse(
            id=rollout.template_id,
            version=1,
            canary=TemplateCopy(version=2, subject="S2", text="t2"),
            canary_chunks=1,
            canary_since=rollout.since,
        )
        plain = new_batch(CANARY, LIVE, chunk_size=1)
        batch = replace(plain, message=plain.message.model_copy(update={"template": use}))
        await self.batches.write(batch)
        self.db.apply(await self.store.statements(rollout, batch.batch_id))
        if canary_event is None:
            return batch.batch_id
        for chunk, email in enumerate((CANARY, LIVE)):
            log_id = log_id_for(batch.batch_id, email)
            await self.recipients.accepted(
                batch.batch_id,
                Selection(chunk, (log_id,)),
                provider="sg",
                tag="t",
                when=self.now,
                message_id=None,
            )
        if canary_event != "sent":
            await self.recipients.reported(
                Report(
                    batch.batch_id,
                    batch.user_id,
                    0,
                    log_id_for(batch.batch_id, CANARY),
                    provider="sg",
                    provider_result=canary_event,
                    message_id=None,
                    stage_rank=1,
                    rank=5,
                    when=self.now + timedelta(seconds=1),
                    event=canary_event,
                    state="failed",
                    reason="mailbox unknown",
                    evidence=None,
                )
            )
        return batch.batch_id

    async def template(self, rollout: Rollout) -> tuple[int | None, int | None]:
        found = await self.templates.get(rollout.user_id, rollout.template_id)
        assert found is not None
        return found.live_version, found.canary_version


async def test_a_rollout_inside_its_window_is_left_alone() -> None:
    s = Setting()
    _, rollout = await s.rollout()
    await s.sent(rollout, canary_event="bounced")
    s.now = rollout.since + WINDOW - timedelta(seconds=1)

    verdicts = await s.judge.pass_once()

    assert verdicts == []
    assert await s.store.rollouts() == [rollout]
    assert await s.template(rollout) == (1, 2)


async def test_recipients_are_counted_with_the_version_their_chunk_was_sent_with() -> None:
    """The canary's chunk went out with the live version (the canary was rolled back
    before it was sent): its recipient counts on the live side; without recorded versions
    it counts where the batch meant it to."""
    s = Setting()
    _, rollout = await s.rollout()
    batch_id = await s.sent(rollout, canary_event="bounced")
    attempts = FakeAttempts(s.db)
    for chunk in (0, 1):
        await attempts.create(
            batch_id, f"c{chunk}", 0, chunk=chunk, provider="sg", state="accepted",
            template_version=1,
        )  # fmt: skip

    recorded = await replace(s.judge, attempts=attempts).tally(rollout)
    planned = await s.judge.tally(rollout)

    assert (recorded.canary, recorded.live) == (Counts(), Counts(sent=2, hard_bounces=1))
    assert (planned.canary, planned.live) == (Counts(sent=1, hard_bounces=1), Counts(sent=1))


@dataclass
class Alerts:
    sent: list[Alert] = field(default_factory=list)

    async def send(self, alert: Alert) -> None:
        self.sent.append(alert)


async def test_a_canary_that_bounces_more_is_rolled_back_audited_and_alerted() -> None:
    s = Setting()
    s.judge.alerter = alerts = Alerts()  # type: ignore[assignment]
    _, rollout = await s.rollout()
    await s.sent(rollout, canary_event="bounced")
    s.now = rollout.since + WINDOW

    [verdict] = await s.judge.pass_once()

    assert verdict.decision == "rollback"
    assert await s.template(rollout) == (1, None)
    [audited] = await s.store.history(rollout.template_id)
    assert (audited.decision, audited.canary.sent, audited.canary.hard_bounces) == (
        "rollback",
        1,
        1,
    )
    assert (audited.live.sent, audited.live.hard_bounces) == (1, 0)
    assert await s.store.rollouts() == []
    assert [(a.kind, a.subject) for a in alerts.sent] == [
        ("canary_rollback", str(rollout.template_id))
    ]


async def test_a_canary_no_worse_than_live_is_promoted() -> None:
    s = Setting()
    _, rollout = await s.rollout()
    await s.sent(rollout)
    s.now = rollout.since + WINDOW

    [verdict] = await s.judge.pass_once()

    assert verdict.decision == "promote"
    assert await s.template(rollout) == (2, None)
    assert [o.decision for o in await s.store.history(rollout.template_id)] == ["promote"]


async def test_a_rollout_short_of_recipients_waits_and_is_counted_again_later() -> None:
    """Without recipients before its deadline it stays listed; the next count waits."""
    s = Setting()
    _, rollout = await s.rollout()
    await s.sent(rollout, canary_event=None)
    s.now = rollout.since + WINDOW

    [first] = await s.judge.pass_once()
    soon = await s.judge.pass_once()
    s.now += s.judge.recount_after
    [later] = await s.judge.pass_once()

    assert (first.decision, soon, later.decision) == ("wait", [], "wait")
    assert await s.store.rollouts() == [rollout]
    assert await s.store.history(rollout.template_id) == []
    assert await s.template(rollout) == (1, 2)


async def test_a_rollout_replaced_by_another_publish_is_dropped_without_a_verdict() -> None:
    s = Setting()
    canary, rollout = await s.rollout()
    await s.sent(rollout, canary_event="bounced")
    await s.templates.publish(canary, 1)  # the user rolled back by hand
    s.now = rollout.since + WINDOW

    await s.judge.pass_once()

    assert await s.store.rollouts() == []
    assert await s.store.history(rollout.template_id) == []
    assert await s.template(rollout) == (1, None)


class PublishedMeanwhile(FakeTemplates):
    """The user publishes version 1 between the judge's read and its conclusion."""

    async def conclude(self, template: Template, since: datetime, live: int, verdict: str) -> bool:
        current = await self.get(template.user_id, template.template_id)
        assert current is not None
        await self.publish(current, 1)
        return await super().conclude(template, since, live, verdict)


async def test_a_verdict_overtaken_by_a_publish_is_neither_audited_nor_alerted() -> None:
    s = Setting(templates=PublishedMeanwhile())
    s.judge.alerter = alerts = Alerts()  # type: ignore[assignment]
    _, rollout = await s.rollout()
    await s.sent(rollout, canary_event="bounced")
    s.now = rollout.since + WINDOW

    [verdict] = await s.judge.pass_once()

    assert verdict.decision == "wait"
    assert await s.store.history(rollout.template_id) == []
    assert alerts.sent == []
    assert await s.template(rollout) == (1, None)


class Unreadable(FakeCanary):
    """One template's rollout has batches the judge cannot read (a bug, an odd row)."""

    broken: uuid.UUID | None = None

    async def batches(self, rollout: Rollout) -> list[uuid.UUID]:
        if rollout.template_id == self.broken:
            raise ValueError("an unexpected row")
        return await super().batches(rollout)


async def test_a_rollout_that_cannot_be_judged_does_not_stop_the_others() -> None:
    s = Setting(store=Unreadable("ns"))
    _, broken = await s.rollout()
    _, fine = await s.rollout()
    await s.sent(broken)
    await s.sent(fine)
    s.store.broken = broken.template_id  # type: ignore[attr-defined]
    s.now = max(broken.since, fine.since) + WINDOW

    [verdict] = await s.judge.pass_once()

    assert verdict.decision == "promote"
    assert await s.template(fine) == (2, None)
    assert await s.template(broken) == (1, 2)
    assert await s.store.rollouts() == [broken]


async def test_a_verdict_applied_by_a_judge_that_died_is_audited_and_alerted_next_pass() -> None:
    """The judge died between its conditional update and the audit: the next pass finds the
    verdict kept on the template and finishes (audit, alert, off the list)."""
    s = Setting()
    s.judge.alerter = alerts = Alerts()  # type: ignore[assignment]
    canary, rollout = await s.rollout()
    await s.sent(rollout, canary_event="bounced")
    s.now = rollout.since + WINDOW
    died = Outcome(s.now, 2, 1, "rollback", "hard bounces: worse", Counts(10, 0, 5), Counts(10))
    assert await s.templates.conclude(canary, rollout.since, 1, verdict_text(rollout, died))

    [verdict] = await s.judge.pass_once()

    assert (verdict.decision, verdict.reason) == ("rollback", "hard bounces: worse")
    [audited] = await s.store.history(rollout.template_id)
    assert (audited.decision, audited.canary.hard_bounces) == ("rollback", 5)
    assert [a.kind for a in alerts.sent] == ["canary_rollback"]
    assert await s.store.rollouts() == []
    assert await s.template(rollout) == (1, None)


def test_a_kept_verdict_belongs_to_its_own_rollout_only() -> None:
    since = datetime(2026, 11, 26, 9, 0, 0, 123456, tzinfo=UTC)
    rollout = Rollout(uuid.uuid4(), since, uuid.uuid4(), 2, 1)
    outcome = Outcome(since, 2, 1, "promote", "fine", Counts(3, 1), Counts(4))
    text = verdict_text(rollout, outcome)
    stored = replace(rollout, since=since.replace(microsecond=123000))  # as Cassandra keeps it

    assert verdict_of(text, stored) == outcome
    assert verdict_of(text, replace(rollout, since=since + timedelta(seconds=1))) is None
    assert verdict_of(None, rollout) is None


# -- its schedule: the list once a minute while idle, a rollout at its window's end ------------


class _Logged(Loopback):
    """A loopback wire that keeps the op log."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    async def trip(self, op: str, kind: Kind) -> Trip:
        self.ops.append(op)
        return await super().trip(op, kind)


def test_the_wait_is_until_the_next_rollout_due_or_the_list_period() -> None:
    """Idle: LIST_EVERY (or the window, if shorter); a rollout due sooner: until then, but
    never under JUDGE_EVERY (pure)."""
    now = datetime(2026, 3, 4, 12, tzinfo=UTC)

    assert next_wait(now, [], WINDOW) == LIST_EVERY
    assert next_wait(now, [], timedelta(seconds=30)) == 30.0
    assert next_wait(now, [now + timedelta(seconds=25)], WINDOW) == 25.0
    assert next_wait(now, [now - timedelta(seconds=5)], WINDOW) == JUDGE_EVERY


async def test_an_idle_hour_reads_the_list_once_a_minute_and_a_rollout_is_judged_on_time() -> None:
    """With no rollout, the judge's schedule over a simulated hour reads the list 60 times
    (at JUDGE_EVERY it was 360); a rollout published then is read within LIST_EVERY and
    judged within JUDGE_EVERY of its window's end."""
    wire = _Logged()
    s = Setting(store=FakeCanary("ns", CanaryTables(wire=wire)))
    start = s.now = s.now - timedelta(hours=1)  # the hour before the publish (its clock's now)

    async def until(end: datetime) -> list[tuple[datetime, str]]:
        decided: list[tuple[datetime, str]] = []
        while s.now < end:
            decided += [(s.now, v.decision) for v in await s.judge.pass_once()]
            s.now += timedelta(seconds=s.judge.next_in())
        return decided

    await until(start + timedelta(hours=1))
    idle_reads = wire.ops.count("canary.rollouts")
    _, rollout = await s.rollout()
    await s.sent(rollout)
    [(at, decision)] = await until(s.now + WINDOW + timedelta(minutes=5))

    assert idle_reads == 60
    assert decision == "promote"
    assert rollout.since + WINDOW <= at <= rollout.since + WINDOW + timedelta(seconds=JUDGE_EVERY)
