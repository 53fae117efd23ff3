"""Accepting a batch (``services.api.sending.Sending``) over the account-side twins: how the
Idempotency-Key claim and the suppression list shape the answer, without HTTP or Cassandra.
Also ``Managing.unsuppress``'s handling of blank input over the suppression twin."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.api.managing import Managing
from services.api.sending import Sending
from shared import validation
from shared.background import Background
from shared.batchstore import BatchHeader, NewBatch
from shared.config import ApiSettings, ProviderSettings, Settings
from shared.errors import DependencyUnavailable
from shared.http import ApiError
from shared.idempotency import Existing
from shared.metrics import ApiMetrics
from shared.ratelimit import Verdict
from tests.fakes.account_stores import FakeIdempotencyStore, FakeSuppressionStore
from tests.fakes.stores import FakeBatches, FakeCassandra

A, B = "ann@example.com", "bob@example.com"


def _body(*to: str, subject: str = "Hi") -> dict[str, Any]:
    return {"from": "shop@example.com", "to": list(to), "subject": subject, "text": "Hello"}


class _Acceptance:
    """Stands in for :class:`shared.acceptance.Acceptance` over the batch twin (no outbox
    table, no broker: every publish is confirmed)."""

    def __init__(self, batches: FakeBatches) -> None:
        self.batches = batches
        self.outbox = self
        self.failures: list[bool] = []
        """Next stores to fail, each ``True`` when its write lands before the error."""

    async def store(self, batch: NewBatch, *, also: Sequence[object] = ()) -> None:
        landed = self.failures.pop(0) if self.failures else None
        if landed is False:
            raise DependencyUnavailable("cassandra", "WriteTimeout (injected)")
        await self.batches.write(batch)
        await self.batches.index(batch)
        if landed:
            raise DependencyUnavailable("cassandra", "WriteTimeout (injected)")

    async def publish(self, batch_id: uuid.UUID) -> bool:
        return True

    async def finish(self, batch_id: uuid.UUID) -> BatchHeader | None:
        header = await self.batches.header(batch_id)
        return None if header is None or header.status == "cancelled" else header

    async def done(self, batch_id: uuid.UUID) -> None:
        return None


@dataclass
class _Quota:
    """Stands in for :class:`shared.ratelimit.RecipientQuota`: refuses the next ``refusals``
    batches, counts what it charged and refunded."""

    daily_limit: int = 1000
    refusals: int = 0
    used: int = 0
    refunds: list[int] = field(default_factory=list)

    async def consume(self, user_id: uuid.UUID, recipients: int) -> tuple[Verdict, date]:
        today = datetime.now(UTC).date()
        if self.refusals:
            self.refusals -= 1
            return Verdict(False, 3600), today
        self.used += recipients
        return Verdict(True), today

    async def refund(self, user_id: uuid.UUID, recipients: int, day: date) -> None:
        self.used -= recipients
        self.refunds.append(recipients)


@dataclass
class Desk:
    """A ``Sending`` over twins, and the twins to inspect."""

    sending: Sending
    acceptance: _Acceptance
    batches: FakeBatches
    quota: _Quota
    suppressions: FakeSuppressionStore
    idempotency: FakeIdempotencyStore
    user: uuid.UUID = field(default_factory=uuid.uuid4)

    async def accept(self, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        return await self.sending.accept(self.user, body, key)

    async def status(self, batch_id: str) -> str | None:
        status: str | None = await self.batches.status(uuid.UUID(batch_id))
        return status


async def _desk(lease: float) -> Desk:
    batches = FakeBatches(FakeCassandra())
    acceptance, quota = _Acceptance(batches), _Quota()
    suppressions, idempotency = FakeSuppressionStore(), FakeIdempotencyStore(lease=lease)
    sending = Sending(
        settings=Settings(api=ApiSettings(sender_domains="any"), providers=ProviderSettings()),
        acceptance=acceptance,  # type: ignore[arg-type]
        batches=batches,  # type: ignore[arg-type]
        suppressions=suppressions,  # type: ignore[arg-type]
        idempotency=idempotency,  # type: ignore[arg-type]
        quota=quota,  # type: ignore[arg-type]
        metrics=ApiMetrics.create(CollectorRegistry()),
        background=Background(),
    )
    return Desk(sending, acceptance, batches, quota, suppressions, idempotency)


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    """Leases of 30 s: a claim stays in progress for the whole test."""
    made = await _desk(lease=30.0)
    yield made
    await made.sending.background.drain()


@pytest.fixture
async def lapsed() -> AsyncIterator[Desk]:
    """Leases of 0 s: every claim can be taken over at once (its holder is presumed dead)."""
    made = await _desk(lease=0.0)
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
    first = await desk.accept(_body(A, B), key)

    again = await desk.accept(_body(A, B), key)

    assert again == first and first["accepted"] == 2
    assert desk.quota.used == 2
    assert len(desk.batches.db.headers) == 1


async def test_the_same_body_with_its_fields_reordered_is_a_repeat(desk: Desk) -> None:
    key = uuid.uuid4().hex
    first = await desk.accept(_body(A), key)

    again = await desk.accept(dict(reversed(list(_body(A).items()))), key)

    assert again["batch_id"] == first["batch_id"]


async def test_a_repeat_with_another_body_is_a_409_conflict(desk: Desk) -> None:
    key = uuid.uuid4().hex
    await desk.accept(_body(A), key)

    error = await _refused(desk, _body(A, subject="Changed"), key)

    assert (error.status, error.code) == (409, "idempotency_conflict")
    assert desk.quota.used == 1 and len(desk.batches.db.headers) == 1


async def test_a_repeat_while_the_first_is_in_progress_waits_with_retry_after(
    desk: Desk,
) -> None:
    key, body = uuid.uuid4().hex, _body(A)
    await desk.idempotency.claim(
        desk.user, key, validation.body_hash(body), uuid.uuid1(), uuid.uuid4()
    )

    error = await _refused(desk, body, key)

    assert (error.status, error.code) == (409, "idempotency_in_progress")
    assert 1 <= int((error.headers or {})["Retry-After"]) <= 30
    assert desk.quota.used == 0 and desk.batches.db.headers == {}


async def test_a_repeat_after_the_lease_ran_out_finishes_the_claimed_batch_id(
    lapsed: Desk,
) -> None:
    key, body, claimed = uuid.uuid4().hex, _body(A, B), uuid.uuid1()
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
    key, body = uuid.uuid4().hex, _body(A)
    desk.quota.refusals = 1

    error = await _refused(desk, body, key)
    answer = await desk.accept(body, key)

    assert (error.status, error.code, (error.headers or {})["Retry-After"]) == (
        429,
        "quota_exceeded",
        "3600",
    )
    assert answer["accepted"] == 1 and desk.quota.used == 1
    assert await desk.status(answer["batch_id"]) == "accepted"


async def test_a_failed_store_under_a_key_leaves_the_batch_for_the_retry(desk: Desk) -> None:
    """The write landed but the answer was lost: the batch is not cancelled, and the
    client's retry gets exactly that batch at once (no waiting for the lease)."""
    key, body = uuid.uuid4().hex, _body(A, B)
    desk.acceptance.failures.append(True)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body, key)
    [batch_id] = list(desk.batches.db.headers)
    answer = await desk.accept(body, key)

    assert answer["batch_id"] == str(batch_id) and answer["accepted"] == 2
    assert await desk.status(answer["batch_id"]) == "accepted"
    assert len(desk.batches.db.headers) == 1


async def test_a_failed_store_without_a_key_cancels_the_batch_and_refunds(desk: Desk) -> None:
    """The client was told the batch failed, so a write that lands anyway must never send."""
    desk.acceptance.failures.append(True)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(_body(A, B), None)

    [batch_id] = list(desk.batches.db.headers)
    assert await desk.status(str(batch_id)) == "cancelled"
    assert desk.quota.used == 0


async def test_a_batch_of_only_suppressed_recipients_is_422_and_claims_no_key(
    desk: Desk,
) -> None:
    key = uuid.uuid4().hex
    await desk.suppressions.add(desk.user, "ANN@example.com", reason="bounce", source="sg")

    error = await _refused(desk, _body(A), key)
    answer = await desk.accept(_body(B), key)  # the key is still unused

    assert (error.status, error.code) == (422, validation.NO_RECIPIENTS)
    assert error.fields is not None and "bounce" in error.fields[f"to.{A}"]
    assert answer["accepted"] == 1 and desk.quota.used == 1


async def test_suppressed_recipients_are_dropped_and_named_in_the_answer(desk: Desk) -> None:
    await desk.suppressions.add(desk.user, A, reason="complaint", source="mg")

    answer = await desk.accept(_body("Ann@Example.com", B), None)

    assert (answer["accepted"], answer["suppressed"]) == (
        1,
        ["Ann@example.com"],
    )  # normalised: the domain lower-cased
    assert desk.quota.used == 1


async def test_another_users_suppressions_do_not_drop_recipients(desk: Desk) -> None:
    await desk.suppressions.add(uuid.uuid4(), A, reason="bounce", source="sg")

    answer = await desk.accept(_body(A), None)

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
