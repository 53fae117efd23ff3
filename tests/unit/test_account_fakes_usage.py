"""Accepting a batch (``services.api.sending.Sending``) over the account-side twins: how the
Idempotency-Key claim and the suppression list shape the answer, without HTTP or Cassandra.
Also ``Managing.unsuppress``'s handling of blank input over the suppression twin."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from services.api.idempotency import Existing
from services.api.managing import Managing
from shared.core.errors import DependencyUnavailable
from shared.delivery import validation
from shared.infra.http import ApiError
from tests.fakes.audience import FakeSuppressionStore
from tests.unit.sending_desk import TIMEOUT, A, B, Desk, body_of, new_desk


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    """Leases of 30 s: a claim stays in progress for the whole test."""
    made = await new_desk(lease=30.0)
    yield made
    await made.sending.background.drain()


@pytest.fixture
async def lapsed() -> AsyncIterator[Desk]:
    """Leases of 0 s: every claim can be taken over at once (its holder is presumed dead)."""
    made = await new_desk(lease=0.0)
    yield made
    await made.sending.background.drain()


async def _refused(desk: Desk, body: dict[str, Any], key: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await desk.accept(body, key)
    return caught.value


async def test_a_repeat_with_its_key_gets_the_first_answer_and_no_second_batch(
    desk: Desk,
) -> None:
    key = uuid.uuid4().hex
    first = await desk.accept(body_of(A, B), key)

    again = await desk.accept(body_of(A, B), key)

    assert again == first and first["accepted"] == 2
    assert await desk.used() == 2
    assert len(desk.batches.db.headers) == 1


async def test_the_same_body_with_its_fields_reordered_is_a_repeat(desk: Desk) -> None:
    key = uuid.uuid4().hex
    first = await desk.accept(body_of(A), key)

    again = await desk.accept(dict(reversed(list(body_of(A).items()))), key)

    assert again["batch_id"] == first["batch_id"]


async def test_a_repeat_with_another_body_is_a_409_conflict(desk: Desk) -> None:
    key = uuid.uuid4().hex
    await desk.accept(body_of(A), key)

    error = await _refused(desk, body_of(A, subject="Changed"), key)

    assert (error.status, error.code) == (409, "idempotency_conflict")
    assert await desk.used() == 1 and len(desk.batches.db.headers) == 1


async def test_a_repeat_while_the_first_is_in_progress_waits_with_retry_after(
    desk: Desk,
) -> None:
    key, body = uuid.uuid4().hex, body_of(A)
    await desk.idempotency.claim(
        desk.user, key, validation.body_hash(body), uuid.uuid1(), uuid.uuid4()
    )

    error = await _refused(desk, body, key)

    assert (error.status, error.code) == (409, "idempotency_in_progress")
    assert 1 <= int((error.headers or {})["Retry-After"]) <= 30
    assert await desk.used() == 0 and desk.batches.db.headers == {}


async def test_a_repeat_after_the_lease_ran_out_finishes_the_claimed_batch_id(
    lapsed: Desk,
) -> None:
    key, body, claimed = uuid.uuid4().hex, body_of(A, B), uuid.uuid1()
    await lapsed.idempotency.claim(
        lapsed.user, key, validation.body_hash(body), claimed, uuid.uuid4()
    )

    answer = await lapsed.accept(body, key)

    assert answer["batch_id"] == str(claimed)
    stored = await lapsed.idempotency.claim(
        lapsed.user, key, validation.body_hash(body), uuid.uuid1(), uuid.uuid4()
    )
    assert isinstance(stored, Existing) and stored.response is not None
    assert orjson.loads(stored.response) == answer


async def test_a_quota_refusal_releases_the_key_so_a_retry_is_accepted(desk: Desk) -> None:
    key, body = uuid.uuid4().hex, body_of(A)
    desk.quota.daily_limit = 0

    error = await _refused(desk, body, key)
    desk.quota.daily_limit = 1000
    answer = await desk.accept(body, key)

    assert (error.status, error.code) == (429, "quota_exceeded")
    assert 1 <= int((error.headers or {})["Retry-After"]) <= 86_400
    assert answer["accepted"] == 1 and await desk.used() == 1
    assert await desk.status(answer["batch_id"]) == "accepted"


async def test_a_failed_store_under_a_key_leaves_the_batch_for_the_retry(desk: Desk) -> None:
    """The write landed but the answer was lost: the batch is not cancelled, and the
    client's retry gets exactly that batch at once (no waiting for the lease)."""
    key, body = uuid.uuid4().hex, body_of(A, B)
    desk.db.fail("batches.write", TIMEOUT, applied=True)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body, key)
    [batch_id] = list(desk.batches.db.headers)
    answer = await desk.accept(body, key)

    assert answer["batch_id"] == str(batch_id) and answer["accepted"] == 2
    assert await desk.status(answer["batch_id"]) == "accepted"
    assert len(desk.batches.db.headers) == 1


async def test_a_failed_store_without_a_key_cancels_the_batch_and_refunds(desk: Desk) -> None:
    """The client was told the batch failed, so a write that lands anyway must never send."""
    desk.db.fail("batches.write", TIMEOUT, applied=True)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body_of(A, B), None)

    [batch_id] = list(desk.batches.db.headers)
    assert await desk.status(str(batch_id)) == "cancelled"
    assert await desk.used() == 0
    assert await desk.relay(after=120) == 1 and desk.published() == []


async def test_a_batch_of_only_suppressed_recipients_is_422_and_claims_no_key(
    desk: Desk,
) -> None:
    key = uuid.uuid4().hex
    await desk.suppressions.add(desk.user, "ANN@example.com", reason="bounce", source="sg")

    error = await _refused(desk, body_of(A), key)
    answer = await desk.accept(body_of(B), key)  # the key is still unused

    assert (error.status, error.code) == (422, validation.NO_RECIPIENTS)
    assert error.fields is not None and "bounce" in error.fields[f"to.{A}"]
    assert answer["accepted"] == 1 and await desk.used() == 1


async def test_suppressed_recipients_are_dropped_and_named_in_the_answer(desk: Desk) -> None:
    await desk.suppressions.add(desk.user, A, reason="complaint", source="mg")

    answer = await desk.accept(body_of("Ann@Example.com", B), None)

    assert (answer["accepted"], answer["suppressed"]) == (
        1,
        ["Ann@example.com"],
    )  # normalised: the domain lower-cased
    assert await desk.used() == 1


async def test_another_users_suppressions_do_not_drop_recipients(desk: Desk) -> None:
    await desk.suppressions.add(uuid.uuid4(), A, reason="bounce", source="sg")

    answer = await desk.accept(body_of(A), None)

    assert (answer["accepted"], answer["suppressed"]) == (1, [])


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
async def test_unsuppressing_a_blank_address_is_false_and_keeps_the_list(blank: str) -> None:
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, A, reason="bounce", source="sg")
    managing = Managing(db=None, suppressions=store)  # type: ignore[arg-type]

    assert await managing.unsuppress(user, blank) is False
    assert await store.suppressed(user, [A]) == {A: "bounce"}


async def test_unsuppressing_trims_the_address_before_removing_it() -> None:
    store, user = FakeSuppressionStore(), uuid.uuid4()
    await store.add(user, A, reason="bounce", source="sg")
    managing = Managing(db=None, suppressions=store)  # type: ignore[arg-type]

    assert await managing.unsuppress(user, "  Ann@Example.com ") is True
    assert await store.suppressed(user, [A]) == {}
