"""What the API decides about a batch, and when, over the twins (``tests/unit/sending_desk``):
a request with an Idempotency-Key is looked up before it is judged; a request without one is
decided durably (``pending``, then committed) so that a 503 means it is never sent; and a
cancelled batch's stats and quota are settled by whoever finds it cancelled, once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from services.api.idempotency import Existing
from services.api.sending import Extra, build_batch
from shared.core.batch_ids import accepted_at
from shared.core.errors import DependencyUnavailable
from shared.delivery import validation
from shared.delivery.batchstore import new_batch_id
from shared.delivery.stats import batch_day
from shared.infra.http import ApiError, error_response
from shared.infra.leases import SCHEDULER_WAKE, woken
from tests.unit.sending_desk import TIMEOUT, A, B, Desk, body_of, new_desk


@pytest.fixture
async def desk() -> AsyncIterator[Desk]:
    """Leases of 30 s: a claim stays in progress for the whole test."""
    made = await new_desk(lease=30.0, commit_budget=0.5)
    yield made
    await made.sending.background.drain()


@pytest.fixture
async def lapsed() -> AsyncIterator[Desk]:
    """Leases of 0 s: every claim can be taken over at once (its holder is presumed dead)."""
    made = await new_desk(lease=0.0, commit_budget=0.5)
    yield made
    await made.sending.background.drain()


async def _refused(desk: Desk, body: dict[str, Any], key: str | None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await desk.accept(body, key)
    return caught.value


def _iso(at: datetime) -> str:
    return at.isoformat()


async def _stored_long_ago(
    desk: Desk, key: str, body: dict[str, Any], *, ago: timedelta, answered: bool
) -> uuid.UUID:
    """What a request with ``key`` did ``ago``: claimed the key, stored its batch and, if
    ``answered``, recorded its 202 (its client never heard it either way)."""
    batch_id = new_batch_id((datetime.now(UTC) - ago).timestamp())
    claim = await desk.idempotency.claim(
        desk.user, key, validation.body_hash(body), batch_id, uuid.uuid4()
    )
    assert not isinstance(claim, Existing)
    plain = {k: v for k, v in body.items() if k != "send_at"}
    parsed = validation.parse_batch_request(plain, max_recipients=100)
    send_at = datetime.fromisoformat(body["send_at"]) if "send_at" in body else None
    extra = Extra(None, send_at)
    batch = build_batch(desk.sending.settings, desk.user, batch_id, parsed, extra=extra)
    await desk.acceptance.store(batch)
    if answered:
        await desk.idempotency.complete(desk.user, key, batch.response)
    return batch_id


# -- 1. an Idempotency-Key is looked up before anything is judged ---------------------------


async def test_a_repeat_after_its_only_recipient_bounced_gets_the_first_answer(
    desk: Desk,
) -> None:
    """The 202 was lost; the recipient bounced since: the repeat still names the batch that
    exists and was sent, rather than a 422 that would make the client send again."""
    key, body = uuid.uuid4().hex, body_of(A)
    first = await desk.accept(body, key)
    await desk.suppressions.add(desk.user, A, reason="bounce", source="sg")

    again = await desk.accept(body, key)

    assert again == first
    assert desk.published() == [first["batch_id"]]


@pytest.mark.parametrize("answered", [True, False], ids=["key-completed", "key-in-progress"])
async def test_a_scheduled_batch_retried_after_its_time_gets_the_first_answer(
    lapsed: Desk, answered: bool
) -> None:
    """Accepted for a time now ten minutes past (more than the five a new request may name):
    the repeat gets its batch, whether or not the key recorded the answer."""
    key = uuid.uuid4().hex
    body = body_of(A, send_at=_iso(datetime.now(UTC) - timedelta(minutes=10)))
    batch_id = await _stored_long_ago(
        lapsed, key, body, ago=timedelta(minutes=11), answered=answered
    )

    again = await lapsed.accept(body, key)

    assert again["batch_id"] == str(batch_id) and again["status"] == "scheduled"
    assert len(lapsed.batches.db.headers) == 1


async def test_a_repeat_with_another_body_is_a_409_whatever_changed(desk: Desk) -> None:
    """The other body would now be refused (its recipients bounced): it is still the key's
    conflict that is told, not a judgment of a body the key never accepted."""
    key = uuid.uuid4().hex
    await desk.accept(body_of(A, B), key)
    for email in (A, B):
        await desk.suppressions.add(desk.user, email, reason="bounce", source="sg")

    error = await _refused(desk, body_of(A), key)

    assert (error.status, error.code) == (409, "idempotency_conflict")


async def test_a_take_over_judges_send_at_as_of_the_first_claim(lapsed: Desk) -> None:
    """Its holder died before storing anything, ten minutes ago, asking for a time that has
    passed since: the retry takes the key over and sends the same batch id now, rather than
    refusing a time that was valid when the key was claimed."""
    key = uuid.uuid4().hex
    claimed_at = datetime.now(UTC) - timedelta(minutes=10)
    body = body_of(A, send_at=_iso(claimed_at + timedelta(minutes=1)))
    batch_id = new_batch_id(claimed_at.timestamp())
    await lapsed.idempotency.claim(
        lapsed.user, key, validation.body_hash(body), batch_id, uuid.uuid4()
    )

    answer = await lapsed.accept(body, key)

    assert answer["batch_id"] == str(batch_id) and "status" not in answer
    assert lapsed.published() == [str(batch_id)]


async def test_a_take_over_that_is_refused_keeps_the_key_on_its_batch(lapsed: Desk) -> None:
    """Its holder died; the recipient bounced since, so the take-over is refused. The key
    stays with the batch id it fixed: when the holder's write lands after all, the next
    retry gets that batch, never a second one."""
    key, body = uuid.uuid4().hex, body_of(A)
    batch_id = new_batch_id(datetime.now(UTC).timestamp())
    await lapsed.idempotency.claim(
        lapsed.user, key, validation.body_hash(body), batch_id, uuid.uuid4()
    )
    await lapsed.suppressions.add(lapsed.user, A, reason="bounce", source="sg")

    error = await _refused(lapsed, body, key)
    parsed = validation.parse_batch_request(body, max_recipients=100)
    await lapsed.acceptance.store(
        build_batch(lapsed.sending.settings, lapsed.user, batch_id, parsed)
    )
    again = await lapsed.accept(body, key)

    assert (error.status, error.code) == (422, validation.NO_RECIPIENTS)
    assert again["batch_id"] == str(batch_id)
    assert len(lapsed.batches.db.headers) == 1


async def test_a_fresh_key_refused_while_judging_is_released(desk: Desk) -> None:
    """Nothing can have been stored under a key this request claimed and then refused: the
    client may correct the body and send it with the same key at once."""
    key = uuid.uuid4().hex
    bad = {**body_of(A), "subject": ""}

    error = await _refused(desk, bad, key)
    answer = await desk.accept(body_of(A), key)

    assert error.status == 422
    assert answer["accepted"] == 1


# -- 2. without a key, a 503 means the batch is never sent ----------------------------------


async def test_a_503_without_a_key_is_never_sent_even_if_cancelling_it_fails_too(
    desk: Desk,
) -> None:
    """The store lands but times out, and the best-effort cancel fails in the same pause:
    the relay never publishes the batch (nothing committed it), cancels it once its request
    can no longer decide it, and gives its recipients back."""
    desk.db.fail("batches.write", TIMEOUT, applied=True)
    desk.db.fail("batches.cancel", TIMEOUT)

    with pytest.raises(DependencyUnavailable):
        await desk.accept(body_of(A, B), None)
    [batch_id] = list(desk.batches.db.headers)
    early = await desk.relay(after=5)
    late = await desk.relay(after=120)

    assert desk.published() == []
    assert (early, late) == (0, 1)
    assert await desk.status(str(batch_id)) == "cancelled"
    assert await desk.used() == 0
    assert desk.outbox.pending() == set()


async def test_a_batch_without_a_key_is_committed_before_its_202(desk: Desk) -> None:
    """Stored pending, committed, published: the relay then has nothing to do."""
    answer = await desk.accept(body_of(A), None)
    await desk.sending.background.drain()

    assert await desk.status(answer["batch_id"]) == "accepted"
    assert desk.published() == [answer["batch_id"]]
    assert await desk.relay(after=120) == 0 and desk.outbox.pending() == set()


async def test_a_commit_that_timed_out_having_applied_is_repeated_and_answered_202(
    desk: Desk,
) -> None:
    """The commit's outcome is unknown: repeating it reads what was decided (accepted)."""
    desk.db.fail("batches.commit", TIMEOUT, applied=True)

    answer = await desk.accept(body_of(A), None)

    assert await desk.status(answer["batch_id"]) == "accepted"
    assert desk.published() == [answer["batch_id"]]
    assert desk.db.calls.count("batches.commit") == 2


@pytest.mark.parametrize("applied", [True, False], ids=["committed", "not-committed"])
async def test_a_commit_unknown_past_the_budget_names_the_batch_and_the_relay_decides(
    desk: Desk, applied: bool
) -> None:
    """Cassandra never answers within the request's budget: a 503 that says the outcome is
    unknown and names the batch. What was durably decided then stands: a commit that applied
    is published by the relay; one that did not is cancelled, refunded and never sent."""
    desk.db.fail("batches.commit", TIMEOUT, applied=applied)
    for _ in range(50):
        desk.db.fail("batches.commit", TIMEOUT)

    error = await _refused(desk, body_of(A), None)
    assert (error.status, error.code) == (503, "acceptance_unknown")
    batch_id = error.batch_id
    assert batch_id is not None and batch_id in error.message
    desk.db.heal()
    await desk.relay(after=120)

    if applied:
        assert await desk.status(batch_id) == "accepted"
        assert desk.published() == [batch_id] and await desk.used() == 1
    else:
        assert await desk.status(batch_id) == "cancelled"
        assert desk.published() == [] and await desk.used() == 0


async def test_a_batch_the_relay_cancelled_first_is_a_plain_503_and_never_sent(
    desk: Desk,
) -> None:
    """The request stalled past its time and the relay cancelled its batch: the commit that
    comes after finds it cancelled, so the answer says it is not sent, and it is refunded."""
    parsed = validation.parse_batch_request(body_of(A, B), max_recipients=100)
    batch = build_batch(
        desk.sending.settings,
        desk.user,
        new_batch_id(datetime.now(UTC).timestamp()),
        parsed,
        pending=True,
    )
    await desk.quota.consume(desk.user, 2, now=accepted_at(batch.batch_id))
    await desk.acceptance.store(batch)
    await desk.relay(after=120)
    decision = await desk.acceptance.commit(batch, until=datetime.now(UTC))

    assert (decision.status, decision.accepted) == ("cancelled", False)
    assert desk.published() == [] and await desk.used() == 0


async def test_the_keyed_path_stores_accepted_and_commits_nothing(desk: Desk) -> None:
    """With a key the retry finishes the batch: no commit, one write, as before."""
    answer = await desk.accept(body_of(A), uuid.uuid4().hex)

    assert await desk.status(answer["batch_id"]) == "accepted"
    assert "batches.commit" not in desk.db.calls
    assert desk.db.calls.count("batches.write") == 1


async def test_a_scheduled_batch_without_a_key_is_committed_scheduled(desk: Desk) -> None:
    """Pending until committed, then scheduled; its outbox row is marked once committed."""
    at = datetime.now(UTC) + timedelta(hours=1)

    answer = await desk.accept(body_of(A, send_at=_iso(at)), None)
    await desk.sending.background.drain()

    assert answer["status"] == "scheduled"
    assert await desk.status(answer["batch_id"]) == "scheduled"
    assert desk.published() == [] and desk.outbox.pending() == set()


# -- 3. a cancel's follow-ups are done by whoever finds the batch cancelled, once ------------


async def _scheduled(desk: Desk, *to: str) -> uuid.UUID:
    at = datetime.now(UTC) + timedelta(hours=1)
    answer = await desk.accept(body_of(*to, send_at=_iso(at)), uuid.uuid4().hex)
    return uuid.UUID(answer["batch_id"])


async def _cancel(desk: Desk, batch_id: uuid.UUID) -> None:
    header = await desk.batches.header(batch_id)
    assert header is not None
    await desk.sending.cancel(header)


async def _queued(desk: Desk, batch_id: uuid.UUID) -> int:
    counts = await desk.batches.stats.day(desk.user, batch_day(batch_id))
    return counts.get("queued", 0)


@pytest.mark.parametrize("failing", ["stats.cancelled", "quota.refund"])
async def test_a_cancel_that_applied_and_failed_after_is_settled_by_its_retry(
    desk: Desk, failing: str
) -> None:
    """The cancel's transaction applies, then its stats write (or refund) times out: 503.
    The retry finds the batch cancelled and finishes both before it answers."""
    batch_id = await _scheduled(desk, A, B)
    assert (await _queued(desk, batch_id), await desk.used()) == (2, 2)
    desk.db.fail(failing, TIMEOUT)

    with pytest.raises(DependencyUnavailable):
        await _cancel(desk, batch_id)
    await _cancel(desk, batch_id)

    assert await desk.status(str(batch_id)) == "cancelled"
    assert (await _queued(desk, batch_id), await desk.used()) == (0, 0)


async def test_cancelling_again_refunds_once(desk: Desk) -> None:
    """However often a cancel is repeated, the quota gets the batch's recipients back once."""
    other = await _scheduled(desk, A)
    batch_id = await _scheduled(desk, A, B)

    for _ in range(3):
        await _cancel(desk, batch_id)

    assert await desk.used() == 1
    assert await desk.status(str(other)) == "scheduled"


async def test_a_started_batch_cannot_be_cancelled(desk: Desk) -> None:
    answer = await desk.accept(body_of(A), None)

    with pytest.raises(ApiError) as caught:
        await _cancel(desk, uuid.UUID(answer["batch_id"]))

    assert (caught.value.status, caught.value.code) == (409, "batch_started")
    assert await desk.used() == 1


def test_the_answer_of_an_unknown_outcome_carries_the_batch_id() -> None:
    """The error envelope names the batch, for the client to look it up."""
    made = ApiError(503, "acceptance_unknown", "may or may not", batch_id="b-1")

    assert orjson.loads(error_response(made).body)["error"]["batch_id"] == "b-1"


# -- waking the schedulers ------------------------------------------------------------------------


async def test_a_scheduled_batch_wakes_every_scheduler_and_a_sent_one_does_not(
    desk: Desk,
) -> None:
    """Storing a scheduled batch announces a scheduler wake-up (an idle scheduler waits for
    its own next due time otherwise); a batch sent at once announces nothing."""
    heard: list[str | None] = []
    await desk.broker.listen(lambda body: heard.append(woken(body)))

    await desk.accept(body_of(A), None)
    await desk.sending.background.drain()
    after_plain = list(heard)
    await desk.accept(body_of(B, send_at=_iso(datetime.now(UTC) + timedelta(seconds=3))), None)
    await desk.sending.background.drain()

    assert (after_plain, heard) == ([], [SCHEDULER_WAKE])
