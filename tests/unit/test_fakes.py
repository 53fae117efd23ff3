"""The in-memory twins offer what the production stores offer, called the same way (their
behaviour is held to the real stores' by ``tests/contracts``)."""

from __future__ import annotations

import inspect

import pytest

from services.api.contact_lists import ContactLists
from services.webhooks.webhook_tokens import WebhookTokens
from shared.accounts.ratelimit import RateWindows
from shared.audience.campaigns import CampaignStore
from shared.audience.suppressions import SuppressionStore
from shared.core.errors import DependencyUnavailable
from shared.delivery.attempts import AttemptStore
from shared.delivery.batchstore import BatchStore
from shared.delivery.recipients import RecipientStore
from shared.delivery.schedule_store import ScheduleStore
from shared.delivery.stats import StatsStore
from shared.ingest.timeline import Timeline
from shared.templates.canary_store import CanaryStore
from shared.templates.templates import TemplateStore
from tests.fakes.accounts import FakePreferences, FakeQuota, FakeRateWindows
from tests.fakes.api import FakeContactLists, FakeRecentMail
from tests.fakes.audience import FakeCampaigns, FakeSuppressions
from tests.fakes.cassandra import OPERATIONS, FakeCassandra
from tests.fakes.delivery import (
    FakeAttempts,
    FakeBatches,
    FakeOutbox,
    FakeRecipients,
    FakeSchedule,
    FakeStats,
)
from tests.fakes.templates import FakeCanary, FakeTemplates
from tests.fakes.webhooks import FakeTimeline, FakeWebhookTokens
from tests.fakes.world import World, new_batch

#: Twins of every public operation of their store.
COMPLETE: list[tuple[type, type]] = [
    (BatchStore, FakeBatches),
    (RecipientStore, FakeRecipients),
    (StatsStore, FakeStats),
    (ContactLists, FakeContactLists),
    (TemplateStore, FakeTemplates),
    (ScheduleStore, FakeSchedule),
    (CanaryStore, FakeCanary),
    (CampaignStore, FakeCampaigns),
]
#: Twins of the operations the services' shells use.
PARTIAL: list[tuple[type, type]] = [
    (AttemptStore, FakeAttempts),
    (SuppressionStore, FakeSuppressions),
    (Timeline, FakeTimeline),
    (WebhookTokens, FakeWebhookTokens),
    (RateWindows, FakeRateWindows),
]


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def _calling(method: object) -> list[tuple[str, object, object]]:
    """How a method is called: each parameter's name, kind and default."""
    params = list(inspect.signature(method).parameters.values())[1:]  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in params]


@pytest.mark.parametrize(("real", "fake"), COMPLETE)
def test_a_twin_offers_every_operation_of_its_store(real: type, fake: type) -> None:
    assert _public(real) <= _public(fake)


@pytest.mark.parametrize(("real", "fake"), COMPLETE + PARTIAL)
def test_a_twins_operations_are_called_as_its_stores(real: type, fake: type) -> None:
    for name in _public(fake):
        assert name in _public(real), f"{fake.__name__}.{name} is no operation of {real.__name__}"
        mine, theirs = getattr(fake, name), getattr(real, name)
        assert _calling(mine) == _calling(theirs), name
        assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(theirs), name


def test_a_fault_can_only_be_injected_where_there_is_one() -> None:
    with pytest.raises(ValueError, match="no fault point"):
        FakeCassandra().fail("batches.locate", DependencyUnavailable("cassandra", "down"))


@pytest.mark.parametrize("applied", [False, True])
async def test_a_fault_fails_the_next_call_before_or_after_it_takes_effect(applied: bool) -> None:
    w = World()
    batch = new_batch("a@example.org")
    w.db.fail("batches.write", DependencyUnavailable("cassandra", "timeout"), applied=applied)
    with pytest.raises(DependencyUnavailable):
        await w.batches.write(batch)
    assert (await w.batches.owner(batch.batch_id) is not None) is applied
    await w.batches.write(batch)  # the next call goes through
    assert await w.batches.owner(batch.batch_id) == batch.user_id
    assert w.db.calls.count("batches.write") == 2


def test_every_fault_point_names_an_operation_of_a_twin() -> None:
    twins = {
        "attempts": FakeAttempts,
        "batches": FakeBatches,
        "outbox": FakeOutbox,
        "quota": FakeQuota,
        "rate": FakeRateWindows,
        "recipients": FakeRecipients,
        "stats": FakeStats,
        "suppressions": FakeSuppressions,
        "timeline": FakeTimeline,
        "tokens": FakeWebhookTokens,
        "recent": FakeRecentMail,
        "preferences": FakePreferences,
    }
    # The quota's round trips: its counter's update, its reads, its refunds' sum; a rate
    # window's update and read back, both in one take; a batch's
    # content, written before its header; a delivery's stat rows, written before its states.
    internal = {
        "quota.add": "_add",
        "quota.read": "used",
        "quota.refunded": "_refunded",
        "rate.add": "take",
        "rate.read": "take",
        "batches.content": "_content",
        "recipients.reported_many.stats": "reported_many",
        "recipients.reported_many.states": "reported_many",
    }
    for point in OPERATIONS:
        store, _, name = point.partition(".")
        method = internal.get(point, name)
        assert method in _public(twins[store]) or hasattr(twins[store], method), point
