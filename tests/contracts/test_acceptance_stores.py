"""The contract of what accepting a batch writes besides the batch, asserted identically of
the twins (``tests/fakes/acceptance.py``) and the real stores on Cassandra: the outbox, the
daily recipient quota, recent mail for the cooldown, and the users' preferences."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.batchstore import BatchStore, NewBatch, new_batch_id
from shared.cooldown import RecentMail
from shared.db import Database
from shared.models import Address, Message, Recipient
from shared.outbox import Outbox, minute_of, shard_of
from shared.precedence import accepted_at
from shared.preferences import Preferences, PreferenceStore
from shared.ratelimit import RecipientQuota
from shared.recipients import log_id_for
from tests.contracts.conftest import IMPLEMENTATIONS
from tests.fakes.acceptance import FakeOutbox, FakePreferences, FakeQuota, FakeRecentMail
from tests.fakes.stores import FakeBatches, FakeCassandra


@dataclass
class Side:
    outbox: Any
    batches: Any
    quota: Any
    recent: Any
    preferences: Any


@pytest.fixture(params=IMPLEMENTATIONS)
def side(request: pytest.FixtureRequest) -> Side:
    namespace = f"n{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        db = FakeCassandra()
        return Side(
            FakeOutbox(db, namespace),
            FakeBatches(db),
            FakeQuota(db, 10),
            FakeRecentMail(db),
            FakePreferences(db),
        )
    real: Database = request.getfixturevalue("db")
    return Side(
        Outbox(real, namespace),
        BatchStore(real),
        RecipientQuota(real, 10),
        RecentMail(real),
        PreferenceStore(real),
    )


def _batch(*emails: str) -> NewBatch:
    batch_id = new_batch_id(datetime.now(UTC).timestamp())
    return NewBatch(
        batch_id=batch_id,
        user_id=uuid.uuid4(),
        message=Message(sender=Address(email="news@example.com"), subject="Hi", text="Hello"),
        recipients=[
            Recipient(log_id=log_id_for(batch_id, e), email=e, name=None, substitutions={})
            for e in emails
        ],
        chunk_size=10,
    )


async def _unpublished(side: Side, batch_id: uuid.UUID) -> list[uuid.UUID]:
    minute = minute_of(accepted_at(batch_id))
    return await side.outbox.unpublished(minute, shard_of(batch_id))


async def test_an_outbox_row_written_with_its_batch_is_unpublished_until_done(side: Side) -> None:
    batch = _batch("a@example.org")
    await side.batches.write(
        batch, also=[await side.outbox.statement(batch.batch_id, batch.user_id)]
    )

    assert await _unpublished(side, batch.batch_id) == [batch.batch_id]
    await side.outbox.done(batch.batch_id)
    assert await _unpublished(side, batch.batch_id) == []


async def test_writing_a_batch_again_marks_its_outbox_row_unpublished_again(side: Side) -> None:
    """A retried acceptance writes the same rows: the relay looks at the batch once more."""
    batch = _batch("a@example.org")
    row = await side.outbox.statement(batch.batch_id, batch.user_id)
    await side.batches.write(batch, also=[row])
    await side.outbox.done(batch.batch_id)
    await side.batches.write(
        batch, also=[await side.outbox.statement(batch.batch_id, batch.user_id)]
    )

    assert await _unpublished(side, batch.batch_id) == [batch.batch_id]


async def test_the_quota_charges_up_to_its_limit_and_gives_back_what_is_refunded(
    side: Side,
) -> None:
    user = uuid.uuid4()
    first, day = await side.quota.consume(user, 6)
    second, _ = await side.quota.consume(user, 6)

    assert (first.allowed, second.allowed) == (True, False)
    assert await side.quota.used(user, day) == 6  # the refused charge was taken back
    await side.quota.refund(user, 6, day)
    assert await side.quota.used(user, day) == 0


async def test_recent_mail_cools_an_address_for_other_batches_until_its_cooldown_passes(
    side: Side,
) -> None:
    user, mine, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    at = datetime.now(UTC)
    await side.recent.record(user, ["Ann@Example.org"], ("",), 60, mine, at)

    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, exclude=other) == {
        "ann@example.org"
    }
    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, exclude=mine) == set()
    later = at + timedelta(seconds=61)
    assert await side.recent.cooling(user, ["ann@example.org"], ("",), 60, now=later) == set()
    assert await side.recent.cooling(user, ["ann@example.org"], ("news",), 60) == set()


async def test_preferences_read_back_as_written_and_default_when_never_set(side: Side) -> None:
    user = uuid.uuid4()
    assert await side.preferences.get(user) == Preferences()
    prefs = Preferences(track_opens=True, cooldown_seconds=600, cooldown_per_category=True)
    await side.preferences.put(user, prefs)

    assert await side.preferences.get(user, fresh=True) == prefs
