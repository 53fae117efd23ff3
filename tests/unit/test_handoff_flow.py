"""``shared.delivery.handoff.HandOff`` driven directly (over the in-memory stores and broker): one
new attempt per provider-side failure however often it is reported, nothing for a recipient that
is final or unknown, a give-up when no provider is left, and a failed publish left for the
report's replay to finish."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from shared.core.errors import PublishError
from shared.delivery.attempts import recipient_line
from shared.delivery.precedence import visible
from shared.delivery.recipients import Report, log_id_for
from tests.fakes.broker import FakeMessage
from tests.fakes.world import World

A = "ann@example.org"


async def _report(w: World, batch_id: uuid.UUID, log_id: uuid.UUID, *, cause: str) -> None:
    """A provider-side failure of ``cause`` reported for the recipient, as ingest hands it."""
    header = await w.batches.header(batch_id)
    assert header is not None
    await w.dispatcher.handoff(
        batch_id=batch_id, user_id=header.user_id, chunk=0, log_id=log_id,
        cause=cause, failed="sg", why="dropped: provider blocklist",
    )  # fmt: skip


def _resends(w: World) -> list[FakeMessage]:
    return [m for m in w.broker.take() if m.routing_key.startswith("log.")]


async def test_a_report_repeated_plans_one_attempt_and_repeats_only_its_job() -> None:
    """The provider retries its webhook: the same job goes out again (same message id, which
    its consumer tells apart), never a second attempt."""
    w = World()
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    w.broker.take()

    for _ in range(3):
        await _report(w, batch.batch_id, log_id, cause="c.0")

    (attempt,) = await w.attempts.line(batch.batch_id, recipient_line(log_id))
    assert (attempt.attempt, attempt.provider, attempt.cause) == (0, "mg", "c.0")
    jobs = _resends(w)
    assert {m.routing_key for m in jobs} == {f"log.mg.{log_id}"}
    assert {m.message_id for m in jobs} == {f"{log_id}:0"}
    assert (await w.rows(batch))[A]["superseded"] == frozenset({"c.0"})


async def test_a_recipient_already_delivered_is_not_handed_over() -> None:
    w = World()
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, log_id, provider="sg", provider_result="delivered",
        message_id=None, stage_rank=3, rank=3, when=w.clock.now + timedelta(seconds=1),
        event="delivered", state="success", reason=None, evidence="c.0",
    ))  # fmt: skip
    w.broker.take()

    await _report(w, batch.batch_id, log_id, cause="c.0")

    assert await w.attempts.line(batch.batch_id, recipient_line(log_id)) == []
    assert _resends(w) == []
    assert await w.states(batch) == {A: "success"}


async def test_a_report_for_a_chunk_the_batch_does_not_have_changes_nothing() -> None:
    """Callers prove the log id belongs to the chunk; a chunk with no rows at all (a stale
    report of a batch stored differently) finds no recipient to hand over."""
    w = World()
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    w.broker.take()

    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=7, log_id=log_id,
        cause="c.0", failed="sg", why="dropped",
    )  # fmt: skip

    assert await w.attempts.line(batch.batch_id, recipient_line(log_id)) == []
    assert _resends(w) == []
    assert await w.states(batch) == {A: "queued"}


async def test_with_no_other_provider_the_recipient_is_given_up_once() -> None:
    w = World(chain="sg")
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    w.broker.take()

    await _report(w, batch.batch_id, log_id, cause="c.0")
    await _report(w, batch.batch_id, log_id, cause="c.0")  # the provider's retry

    row = (await w.rows(batch))[A]
    assert visible(row).state == "failed"
    assert "no other provider is left to try" in str(row["gave_up_reason"])
    assert row["superseded"] == frozenset({"c.0"})
    assert w.db.calls.count("recipients.give_up") == 1
    assert _resends(w) == []


async def test_a_failed_publish_leaves_the_cause_open_for_the_replay_to_finish() -> None:
    """The mark must mean "the job is out": when the publish fails the cause stays open, and
    the report's replay publishes the attempt already planned."""
    w = World()
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    w.broker.take()
    w.broker.fail(PublishError("connection lost"))

    with pytest.raises(PublishError):
        await _report(w, batch.batch_id, log_id, cause="c.0")

    assert (await w.rows(batch))[A]["superseded"] is None
    assert _resends(w) == []

    await _report(w, batch.batch_id, log_id, cause="c.0")

    assert [m.message_id for m in _resends(w)] == [f"{log_id}:0"]
    assert len(await w.attempts.line(batch.batch_id, recipient_line(log_id))) == 1
    assert (await w.rows(batch))[A]["superseded"] == frozenset({"c.0"})


async def test_finishing_a_cause_that_was_never_handed_over_does_nothing() -> None:
    w = World()
    batch = await w.sent(A)
    log_id = log_id_for(batch.batch_id, A)
    w.broker.take()

    await w.dispatcher.handoff.finish(
        batch_id=batch.batch_id, chunk=0, log_id=log_id, cause="c.0", failed="sg", why="x"
    )

    assert _resends(w) == []
    assert (await w.rows(batch))[A]["superseded"] is None
    assert await w.states(batch) == {A: "queued"}
