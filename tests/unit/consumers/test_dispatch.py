"""The provider senders' shell (dispatch, calls, follow-ups, resolution, splitter) over the
in-memory twins: what reaches the providers and what each recipient ends as, whatever the
providers answer and wherever a delivery stops."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import FrozenInstanceError
from datetime import timedelta

import orjson
import pytest

from services.consumers import protocol
from services.consumers.dispatch import decode
from shared.core.errors import (
    DependencyUnavailable,
    PermanentProviderError,
    ProviderMisconfigured,
    PublishError,
    TransientProviderError,
)
from shared.core.models import ChunkJob, LogJob
from shared.delivery.attempts import chunk_line, recipient_line
from shared.delivery.recipients import Report, Selection, log_id_for
from shared.infra.settle import Delivery, Poison
from shared.infra.topology import batch_key, dispatch_key, log_key, parse_routing_key
from shared.providers.base import Receipt
from tests.fakes.broker import FakeMessage
from tests.fakes.world import World, answered, refused

A, B, C = "a@example.org", "b@example.org", "c@example.org"


class Died(BaseException):
    """The process died here (not an Exception: nothing in the process may handle it)."""


async def _die(point: str, job: protocol.Job) -> None:
    raise Died(point)


async def test_an_accepted_chunk_leaves_every_recipient_sent_through_the_first_provider() -> None:
    w = World()
    batch = await w.accept(A, B, C, chunk_size=2)
    await w.settle()
    assert sorted(w.providers["sg"].emails()) == [A, B, C]
    assert w.providers["mg"].sent == []
    rows = await w.rows(batch)
    assert {r["event"] for r in rows.values()} == {"sent"}
    assert {tuple(r["evidence"]) for r in rows.values()} == {("c.0",)}  # type: ignore[arg-type]
    header = await w.batches.header(batch.batch_id)
    assert header is not None and header.status == "dispatched"
    assert w.counter("recipients_sent", provider="sg") == 3
    assert w.counter("chunks_sent", provider="sg") == 2


async def test_chunks_carry_their_attempt_tag_to_the_provider() -> None:
    w = World()
    await w.accept(A)
    w.providers["sg"].answers.append(refused("sg"))
    await w.settle()
    assert [c.attempt for c in w.providers["sg"].sent] == ["c.0"]
    assert [c.attempt for c in w.providers["mg"].sent] == ["c.1"]


async def test_a_refused_call_fails_over_to_the_next_provider_once() -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(answered("sg", 429))
    await w.settle()
    assert sorted(w.providers["mg"].emails()) == [A, B]
    rows = await w.rows(batch)
    assert dict(rows[A]["providers"]) == {"sg": "failed: HTTP 429", "mg": "sent"}  # type: ignore[call-overload]
    keys = [m.routing_key for m in w.broker.take()]
    assert dispatch_key("mg", batch.batch_id, 1) in keys
    assert w.counter("attempts_failed", provider="sg", kind="transient") == 1


async def test_a_bulk_batch_is_split_into_the_bulk_lane_and_sent() -> None:
    """A bulk batch's chunks travel as ``bulk.<ns>.<uuid>`` to the provider's bulk queue."""
    w = World()
    batch = await w.accept(A, B, C, chunk_size=2, priority="bulk")
    assert await w.step()  # the splitter

    t = w.broker.topology
    assert len(w.broker.queues[t.bulk_queue("sg")]) == 2
    assert not w.broker.queues[t.provider_queue("sg")]
    await w.settle()
    assert sorted(w.providers["sg"].emails()) == [A, B, C]
    keys = {m.routing_key for m in w.broker.take()}
    assert dispatch_key("sg", batch.batch_id, 0, "bulk") in keys
    assert dispatch_key("sg", batch.batch_id, 0) not in keys


async def test_a_bulk_chunk_fails_over_and_is_checked_in_the_bulk_lane() -> None:
    """Failover to the next provider and the delayed checks of an unknown outcome keep the
    chunk in the bulk lane."""
    w = World()
    await w.accept(A, B, priority="bulk")
    w.providers["sg"].answers.append(refused("sg"))
    w.providers["mg"].answers.append(
        TransientProviderError("mg", "read timeout", outcome_unknown=True)
    )
    w.providers["mg"].found = frozenset({A, B})
    await w.settle()

    assert sorted(w.providers["mg"].emails()) == [A, B]
    dispatched = [
        parse_routing_key(m.routing_key)
        for m in w.broker.take()
        if not m.routing_key.startswith("batch.")
    ]
    assert {(k.provider, k.attempt) for k in dispatched} == {("sg", 0), ("mg", 1)}
    assert {k.lane for k in dispatched} == {"bulk"}
    assert len(dispatched) > 2  # the checks of mg's unknown outcome were queued too


async def test_when_every_attempt_fails_the_recipients_end_failed_with_the_reason() -> None:
    w = World(max_attempts=3)
    batch = await w.accept(A, B)
    for code in ("sg", "mg"):
        w.providers[code].answers += [refused(code)] * 3
    await w.settle()
    assert len(w.providers["sg"].sent) + len(w.providers["mg"].sent) == 3
    rows = await w.rows(batch)
    assert await w.states(batch) == {A: "failed", B: "failed"}
    assert rows[A]["gave_up_reason"]
    assert await w.counts(batch) == {"queued": 2, "failed": 2}
    for email in (A, B):
        assert (await w.stat_row(batch, email) or {})["outcome"] == "failed"
    assert w.counter("recipients_failed") == 2


@pytest.mark.parametrize(
    ("operation", "applied"),
    [("stats.outcomes", False), ("stats.outcomes", True), ("recipients.give_up", True)],
)
async def test_a_chunk_given_up_through_an_outage_counts_each_recipient_once(
    operation: str, applied: bool
) -> None:
    """The outcome rows of a chunk given up are written before its state: a write lost (or
    whose outcome is unknown) leaves the recipients queued for the retry, which writes both
    again, and the stats count each recipient once."""
    w = World(max_attempts=2)
    batch = await w.accept(A, B)
    for code in ("sg", "mg"):
        w.providers[code].answers.append(refused(code))
    w.db.fail(operation, DependencyUnavailable("cassandra", "timeout"), applied=applied)
    await w.settle()
    # Retried until the state is in (a give-up that was stored finds nobody left to give up).
    assert w.db.calls.count("recipients.give_up") == (1 if operation == "recipients.give_up" else 2)
    assert await w.states(batch) == {A: "failed", B: "failed"}
    assert await w.counts(batch) == {"queued": 2, "failed": 2}
    assert {r["own"] for r in (await w.rows(batch)).values()} == {False}  # the chunk's row


async def test_a_recipient_given_up_by_its_own_line_counts_once_through_an_outage() -> None:
    w = World(max_attempts=2)
    batch = await w.sent(A, B)
    w.providers["mg"].answers += [refused("mg")] * 2
    w.db.fail("recipients.give_up", DependencyUnavailable("cassandra", "timeout"))
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0,
        log_id=log_id_for(batch.batch_id, B), cause="c.0", failed="sg", why="dropped",
    )  # fmt: skip
    await w.settle()
    assert w.db.calls.count("recipients.give_up") == 2  # the lost write, then its retry
    assert await w.states(batch) == {A: "queued", B: "failed"}
    assert await w.counts(batch) == {"queued": 2, "failed": 1}
    rows = await w.rows(batch)
    assert (rows[A]["own"], rows[B]["own"]) == (False, True)


async def test_a_permanent_refusal_by_every_provider_gives_up_without_cycling() -> None:
    w = World(max_attempts=6)
    batch = await w.accept(A)
    for code in ("sg", "mg"):
        w.providers[code].answers.append(PermanentProviderError(code, "payload too large"))
    await w.settle()
    assert (len(w.providers["sg"].sent), len(w.providers["mg"].sent)) == (1, 1)
    assert await w.states(batch) == {A: "failed"}


async def test_a_provider_missing_from_the_adapters_is_a_misconfiguration_not_a_send() -> None:
    w = World(unconfigured=("sg",))
    batch = await w.sent(A)
    assert w.providers["mg"].emails() == [A]
    (first, _) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert first.error is not None and first.error.startswith("misconfigured|")


async def test_a_redelivered_job_after_acceptance_calls_no_provider_again() -> None:
    w = World()
    batch = await w.sent(A)
    job = ChunkJob(batch_id=batch.batch_id, chunk=0).encode()
    for _ in range(3):
        await w.deliver(FakeMessage(dispatch_key("sg", batch.batch_id, 0), job))
    assert len(w.providers["sg"].sent) == 1
    assert w.broker.take()[-1].routing_key == dispatch_key("sg", batch.batch_id, 0)


@pytest.mark.parametrize("point", ["read", "calling", "before_call"])
async def test_a_process_dying_before_the_provider_answers_sends_once_later(point: str) -> None:
    w = World()
    batch = await w.accept(A)
    await w.step()  # the splitter
    w.fault_points[point] = _die
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    with pytest.raises(Died):
        await w.deliver(message)
    del w.fault_points[point]
    w.clock.advance(w.settings.call_lease + 1)  # the dead process's lease runs out
    await w.deliver(FakeMessage(message.routing_key, message.body))  # the broker redelivers
    await w.settle()
    sends = len(w.providers["sg"].sent) + len(w.providers["mg"].sent)
    assert await w.states(batch) == {A: "queued"}
    assert (await w.rows(batch))[A]["event"] == "sent"
    # Before "calling" nothing was sent; from "calling" on the outcome is unknown and the
    # evidence (the query API, told of nothing) decides: sent exactly once either way.
    assert sends == 1


@pytest.mark.parametrize("point", ["answered", "recorded", "effects"])
async def test_a_process_dying_after_the_provider_answered_never_calls_it_again(
    point: str,
) -> None:
    w = World()
    batch = await w.accept(A)
    await w.step()
    w.fault_points[point] = _die
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    with pytest.raises(Died):
        await w.deliver(message)
    del w.fault_points[point]
    w.providers["sg"].found = frozenset({A})  # what the query API will say it accepted
    w.clock.advance(w.settings.call_lease + 1)
    await w.deliver(FakeMessage(message.routing_key, message.body))
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    assert w.providers["mg"].sent == []
    assert (await w.rows(batch))[A]["event"] == "sent"


async def test_an_unknown_outcome_is_resolved_by_the_query_api_without_a_second_send() -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        TransientProviderError("sg", "read timeout", outcome_unknown=True)
    )
    w.providers["sg"].found = frozenset({A, B})
    await w.settle()
    assert sorted(w.providers["sg"].emails()) == [A, B]
    assert w.providers["mg"].sent == []
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.resolution) == ("resolved", "accepted")
    assert {tuple(r["evidence"]) for r in (await w.rows(batch)).values()} == {("c.0",)}  # type: ignore[arg-type]
    assert w.counter("ambiguous", provider="sg") == 1
    assert w.counter("lookups", provider="sg", result="answered") >= 1


async def test_recipients_without_evidence_go_to_the_next_provider_and_the_rest_do_not() -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        TransientProviderError("sg", "connection reset", outcome_unknown=True)
    )
    w.providers["sg"].found = frozenset({A})
    await w.settle()
    assert w.providers["mg"].emails() == [B]
    (first, second) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.resolution, first.decision, second.provider) == ("partial", "retry", "mg")
    assert (await w.rows(batch))[B]["evidence"] == frozenset({"c.1"})


async def test_without_a_query_api_the_resend_waits_for_the_webhook_window() -> None:
    w = World(webhook_window=600, resolve_interval=30)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(TransientProviderError("sg", "timeout", outcome_unknown=True))
    w.providers["sg"].found = None
    start = w.clock.now
    await w.settle(rounds=60)
    assert w.providers["mg"].emails() == [A]
    (first, _) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert first.resolution == "not_accepted"
    assert first.finished_at is not None
    assert (w.clock.now - start).total_seconds() >= 600
    assert w.counter("lookups", provider="sg", result="unsupported") >= 1


async def test_a_failing_query_api_is_asked_again_rather_than_guessed() -> None:
    w = World(query_after=1)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(TransientProviderError("sg", "timeout", outcome_unknown=True))
    w.providers["sg"].found = TransientProviderError("sg", "activity API 503")
    for _ in range(4):
        while await w.step():
            pass
        w.clock.advance(30)
        w.broker.expire()
    assert w.providers["mg"].sent == []
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.state == "ambiguous"
    assert len(w.providers["sg"].lookups) >= 2
    w.providers["sg"].found = frozenset({A})
    await w.settle()
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.resolution == "accepted"
    assert w.providers["mg"].sent == []


async def test_a_webhooks_evidence_settles_an_unknown_outcome_before_the_query_api() -> None:
    w = World(query_after=600)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(TransientProviderError("sg", "timeout", outcome_unknown=True))
    while await w.step():
        pass
    await w.recipients.accepted(
        batch.batch_id, Selection.one(0, log_id_for(batch.batch_id, A)), provider="sg", tag="c.0",
        when=w.clock.now, message_id=None,
    )  # fmt: skip  # what ingest writes for an event tagged c.0
    await w.settle()
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.resolution == "accepted"
    assert w.providers["sg"].lookups == []
    assert w.providers["mg"].sent == []


async def test_a_late_answer_after_a_presumed_death_still_settles_the_attempt() -> None:
    """The call outlives its lease: another delivery marks it ambiguous; the answer that then
    arrives is the truth and resolves the attempt (no second send)."""
    w = World()
    batch = await w.accept(A)
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def presumed_dead(point: str, job: protocol.Job) -> None:
        w.clock.advance(w.settings.call_lease + 1)
        other = Delivery()
        step = protocol.next_step(
            job,
            await w.attempts.line(job.batch_id, job.line),
            me=other.owner,
            called=False,
            now=w.clock.now,
            lease=w.dispatcher.lease,
        )
        assert isinstance(step, protocol.Expire)
        assert await w.dispatcher._expire(job, step)

    w.fault_points["answered"] = presumed_dead
    await w.deliver(message)
    del w.fault_points["answered"]
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    assert w.providers["mg"].sent == []
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.resolution) == ("resolved", "accepted")
    assert (await w.rows(batch))[A]["event"] == "sent"


async def test_a_late_refusal_after_a_presumed_death_fails_over() -> None:
    w = World()
    batch = await w.accept(A)
    w.providers["sg"].answers.append(answered("sg", 429))
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def presumed_dead(point: str, job: protocol.Job) -> None:
        (attempt,) = await w.attempts.line(job.batch_id, job.line)
        assert await w.attempts.transition(
            job.batch_id, job.line, job.attempt, expect={"state": "calling"},
            values={"state": "ambiguous", "checks": attempt.checks + 1},
        )  # fmt: skip

    w.fault_points["answered"] = presumed_dead
    await w.deliver(message)
    del w.fault_points["answered"]
    await w.settle()
    (first, second) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (first.resolution, second.provider) == ("not_accepted", "mg")
    assert w.providers["mg"].emails() == [A]


async def test_a_second_delivery_during_a_live_call_waits_for_the_lease() -> None:
    w = World()
    batch = await w.accept(A)
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def duplicate(point: str, job: protocol.Job) -> None:
        del w.fault_points["during_call"]
        await w.deliver(FakeMessage(message.routing_key, message.body))  # a relay duplicate

    w.fault_points["during_call"] = duplicate
    await w.deliver(message)
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    checks = [m for m in w.broker.take() if b'"check":1' in m.body]
    lease = w.broker.topology.delay_tier_for(w.settings.call_lease)
    assert [m.delay for m in checks] == [lease]  # one check, when the caller's lease ends
    assert (await w.rows(batch))[A]["event"] == "sent"


async def test_the_answer_is_stored_through_a_cassandra_outage() -> None:
    """Cassandra stops answering once the provider has answered: the answer, which exists
    only in this process, is written again until it is stored; nothing is sent twice."""
    w = World()
    batch = await w.accept(A)

    async def outage(point: str, job: protocol.Job) -> None:
        for _ in range(2):
            w.db.fail("attempts.transition", DependencyUnavailable("cassandra", "timeout"))

    w.fault_points["answered"] = outage
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    assert w.providers["mg"].sent == []
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.state == "accepted"
    assert (await w.rows(batch))[A]["event"] == "sent"
    assert w.db.calls.count("attempts.transition") == 3  # three tries to record


async def test_a_chunk_accepted_on_its_first_call_takes_two_attempt_writes() -> None:
    """The claim starts the call in one conditional write, and the outcome is the second."""
    w = World()
    await w.accept(A, B)
    await w.settle()
    assert w.providers["sg"].emails() == [A, B]
    writes = [c for c in w.db.calls if c in ("attempts.create", "attempts.transition")]
    assert writes == ["attempts.create", "attempts.transition"]


async def test_a_claim_that_lost_to_another_delivery_never_calls() -> None:
    """Two deliveries of one job race for the claim: one call, one accepted attempt."""
    w = World()
    batch = await w.accept(A)
    await w.step()  # the splitter
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    copy = FakeMessage(message.routing_key, message.body)
    await asyncio.gather(w.deliver(message), w.deliver(copy))
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.state == "accepted"


async def test_a_claim_whose_outcome_is_unknown_is_read_back_and_honoured() -> None:
    w = World()
    batch = await w.accept(A)
    w.db.fail("attempts.create", DependencyUnavailable("cassandra", "timeout"), applied=True)
    await w.settle()
    assert w.providers["sg"].emails() == [A]
    assert (await w.rows(batch))[A]["event"] == "sent"


async def test_a_job_for_a_batch_that_does_not_exist_is_dead_lettered() -> None:
    w = World()
    missing = uuid.uuid1()
    job = FakeMessage(dispatch_key("sg", missing, 0), ChunkJob(batch_id=missing, chunk=0).encode())
    assert await w.deliver(job) == "reject"
    assert w.providers["sg"].sent == []


U1, U2, U3 = uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3)


@pytest.mark.parametrize(
    ("key", "body", "why"),
    [
        (batch_key(U1), b"{}", "not a dispatch key"),
        (dispatch_key("sg", U1, 2), ChunkJob(batch_id=U1, chunk=0).encode(), "disagree"),
        (dispatch_key("sg", U1, 0), ChunkJob(batch_id=U2, chunk=0).encode(), "disagree"),
        (log_key("sg", U1, 1), LogJob(batch_id=U3, chunk=0, log_id=U1).encode(), "disagree"),
        (log_key("sg", U1, 0), LogJob(batch_id=U3, chunk=0, log_id=U2).encode(), "disagree"),
    ],
    ids=["not-dispatch", "attempt", "batch", "log-attempt", "log-id"],
)
def test_a_dispatch_job_whose_key_and_body_disagree_is_poison(
    key: str, body: bytes, why: str
) -> None:
    with pytest.raises(Poison, match=why):
        decode(FakeMessage(key, body))  # type: ignore[arg-type]


def test_an_undecodable_dispatch_job_is_refused() -> None:
    with pytest.raises(orjson.JSONDecodeError, match="invalid literal"):
        decode(FakeMessage(dispatch_key("sg", U1, 0), b"not json"))  # type: ignore[arg-type]


def test_a_log_job_decodes_to_the_recipients_own_line() -> None:
    log_id, batch_id = uuid.uuid1(), uuid.uuid1()
    body = LogJob(batch_id=batch_id, chunk=3, log_id=log_id, attempt=2, check=1).encode()
    job, deferral = decode(FakeMessage(log_key("mg", log_id, 2), body))  # type: ignore[arg-type]
    assert (job.line, job.chunk, job.attempt, job.provider, job.check, deferral) == (
        recipient_line(log_id),
        3,
        2,
        "mg",
        1,
        None,
    )


async def test_a_resend_job_sends_one_recipient_through_its_planned_provider() -> None:
    w = World()
    batch = await w.sent(A, B)
    b = log_id_for(batch.batch_id, B)
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0, log_id=b,
        cause="c.0", failed="sg", why="dropped: provider blocklist",
    )  # fmt: skip
    await w.settle()
    assert w.providers["mg"].emails() == [B]
    assert [c.attempt for c in w.providers["mg"].sent] == ["r.0"]
    row = (await w.rows(batch))[B]
    assert row["superseded"] == frozenset({"c.0"})
    assert "r.0" in row["evidence"]  # type: ignore[operator]


async def test_a_resend_refused_everywhere_gives_the_recipient_up() -> None:
    w = World(max_attempts=2)
    batch = await w.sent(A)
    w.providers["mg"].answers += [refused("mg")] * 2
    a = log_id_for(batch.batch_id, A)
    await w.dispatcher.handoff(
        batch_id=batch.batch_id, user_id=batch.user_id, chunk=0, log_id=a,
        cause="c.0", failed="sg", why="dropped",
    )  # fmt: skip
    await w.settle()
    assert await w.states(batch) == {A: "failed"}
    line = await w.attempts.line(batch.batch_id, recipient_line(a))
    assert [(x.provider, x.decision) for x in line] == [("mg", "retry"), ("mg", "give_up")]


async def _deferred(w: World, batch_id: uuid.UUID, log_id: uuid.UUID, user_id: uuid.UUID) -> None:
    await w.recipients.reported(Report(
        batch_id, user_id, 0, log_id, provider="sg", provider_result="deferred",
        message_id=None, stage_rank=2, rank=2, when=w.clock.now, event="deferred",
        state=None, reason="mailbox busy", evidence="c.0",
    ))  # fmt: skip


async def test_a_recipient_still_deferred_at_its_deadline_is_handed_to_the_next_provider() -> None:
    w = World()
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    await _deferred(w, batch.batch_id, a, batch.user_id)
    check = LogJob(batch_id=batch.batch_id, chunk=0, log_id=a, deferral="c.0").encode()
    await w.deliver(FakeMessage(log_key("sg", a), check))
    await w.settle()
    assert w.providers["mg"].emails() == [A]
    await w.deliver(FakeMessage(log_key("sg", a), check))  # the check again
    await w.settle()
    assert w.providers["mg"].emails() == [A]


async def test_a_recipient_no_longer_deferred_at_its_deadline_stays_put() -> None:
    w = World()
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    check = LogJob(batch_id=batch.batch_id, chunk=0, log_id=a, deferral="c.0").encode()
    assert await w.deliver(FakeMessage(log_key("sg", a), check)) == "ack"
    assert w.providers["mg"].sent == []
    missing = LogJob(batch_id=batch.batch_id, chunk=7, log_id=uuid.uuid1(), deferral="c.0")
    assert await w.deliver(FakeMessage(log_key("sg", missing.log_id), missing.encode())) == "reject"


async def test_the_splitter_publishes_each_chunk_once_per_fan_out() -> None:
    w = World()
    batch = await w.accept(A, B, C, chunk_size=1)
    batch_job = await w.broker.get(w.broker.topology.batches_queue)
    assert batch_job is not None
    assert await w.deliver(batch_job) == "ack"
    jobs = [m for m in w.broker.take() if m.routing_key.startswith("sg.")]
    assert sorted(m.message_id or "" for m in jobs) == [f"{batch.batch_id}:{n}:0" for n in range(3)]
    again = FakeMessage(batch_job.routing_key, batch_job.body)
    assert await w.deliver(again) == "ack"  # dispatched already: nothing more
    assert [m for m in w.broker.take() if m.routing_key.startswith("sg.")] == []


async def test_the_splitter_dead_letters_what_it_cannot_fan_out() -> None:
    w = World()
    missing = uuid.uuid1()
    assert (
        await w.deliver(FakeMessage(f"batch.{missing}", f'{{"batch_id":"{missing}"}}'.encode()))
        == "reject"
    )
    other = uuid.uuid1()
    assert (
        await w.deliver(FakeMessage(f"batch.{missing}", f'{{"batch_id":"{other}"}}'.encode()))
        == "reject"
    )
    assert await w.deliver(FakeMessage(f"batch.{missing}", b"[]")) == "reject"


async def test_a_provider_that_accepts_nothing_new_is_not_called() -> None:
    """Every recipient of the chunk already has evidence from this attempt: nothing to send."""
    w = World()
    batch = await w.accept(A)
    await w.recipients.accepted(
        batch.batch_id, Selection.one(0, log_id_for(batch.batch_id, A)), provider="sg", tag="c.0",
        when=w.clock.now, message_id=None,
    )  # fmt: skip
    await w.settle()
    assert w.providers["sg"].sent == []
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert attempt.state == "accepted"


async def test_misconfigured_and_permanent_errors_are_recorded_by_kind() -> None:
    w = World(max_attempts=2)
    batch = await w.accept(A)
    w.providers["sg"].answers.append(ProviderMisconfigured("sg", "bad key", status=401))
    w.providers["mg"].answers.append(PermanentProviderError("mg", "bad payload", status=400))
    await w.settle()
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [a.error for a in line] == ["misconfigured|bad key", "permanent|bad payload"]
    assert w.counter("attempts_failed", provider="sg", kind="misconfigured") == 1
    assert w.counter("attempts_failed", provider="mg", kind="permanent") == 1
    assert await w.states(batch) == {A: "failed"}


def test_a_dispatchers_parts_cannot_be_swapped_after_it_is_built() -> None:
    """Its collaborators were built with its parts: a part swapped in later would reach
    none of them, so the dispatcher refuses it (the World takes its parts up front)."""
    w = World()
    with pytest.raises(FrozenInstanceError):
        w.dispatcher.user_hooks = None  # type: ignore[misc]


async def test_header_reads_are_cached_per_process() -> None:
    w = World()
    batch = await w.accept(A, B, C, chunk_size=1)
    await w.settle()
    reads = w.db.calls.count("batches.header")
    assert reads == 2  # the splitter's, then one for all three chunks
    assert await w.dispatcher.follow.header(batch.batch_id) is not None
    assert w.db.calls.count("batches.header") == reads


async def test_an_accepted_receipt_without_status_counts_no_send() -> None:
    w = World()
    await w.accept(A)
    w.providers["sg"].answers.append(Receipt("sg", 0, None))
    await w.settle()
    assert w.counter("chunks_sent", provider="sg") == 0


async def test_a_deadline_hand_off_whose_confirm_was_lost_is_marked_by_the_checks_redelivery() -> (
    None
):
    w = World()
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    await _deferred(w, batch.batch_id, a, batch.user_id)
    check = LogJob(batch_id=batch.batch_id, chunk=0, log_id=a, deferral="c.0").encode()
    w.broker.fail(PublishError("not confirmed"), delivered=True)
    job, cause = decode(FakeMessage(log_key("sg", a), check))  # type: ignore[arg-type]
    assert cause is not None
    with pytest.raises(PublishError):  # and the process dies before it retries
        await w.dispatcher.deferral_check(job, cause)
    await w.settle()  # the re-send job was out: Mailgun sends it
    assert w.providers["mg"].emails() == [A]
    assert (await w.rows(batch))[A]["superseded"] is None
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, a, provider="mg", provider_result="delivered",
        message_id=None, stage_rank=3, rank=3, when=w.clock.now + timedelta(seconds=5),
        event="delivered", state="success", reason=None, evidence="r.0",
    ))  # fmt: skip  # Mailgun delivered it before the check came back
    await w.deliver(FakeMessage(log_key("sg", a), check))  # the check, redelivered
    await w.settle()
    assert (await w.rows(batch))[A]["superseded"] == frozenset({"c.0"})
    assert w.providers["mg"].emails() == [A]


async def test_a_deadline_hand_off_that_never_went_out_is_sent_when_its_check_returns() -> None:
    """The deadline check planned the re-send and died before publishing it; a provider-side
    drop was then recorded (and its own hand-off cut short). The check's redelivery finds the
    recipient queued and no longer deferred: it publishes the planned re-send and marks the
    cause, rather than marking a hand-off that never left."""
    w = World()
    batch = await w.sent(A)
    a = log_id_for(batch.batch_id, A)
    await _deferred(w, batch.batch_id, a, batch.user_id)
    check = LogJob(batch_id=batch.batch_id, chunk=0, log_id=a, deferral="c.0").encode()
    job, cause = decode(FakeMessage(log_key("sg", a), check))  # type: ignore[arg-type]
    assert cause is not None
    w.broker.fail(PublishError("connection lost"))
    with pytest.raises(PublishError):
        await w.dispatcher.deferral_check(job, cause)
    await w.recipients.reported(Report(
        batch.batch_id, batch.user_id, 0, a, provider="sg", provider_result="dropped",
        message_id=None, stage_rank=5, rank=0, when=w.clock.now + timedelta(seconds=5),
        event="dropped", state=None, reason="provider blocklist", evidence=None,
    ))  # fmt: skip
    await w.deliver(FakeMessage(log_key("sg", a), check))
    await w.settle()
    assert w.providers["mg"].emails() == [A]
    assert (await w.rows(batch))[A]["superseded"] == frozenset({"c.0"})


async def test_a_refused_chunk_reads_its_recipients_to_send_them_and_to_carry_out_only() -> None:
    """A chunk whose call is refused reads its recipients' rows twice: for the call, and for
    the events and the next job once the decision is stored; deciding reads none."""
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(refused("sg"))
    await w.step()  # the split
    before = w.db.calls.count("recipients.chunk_rows")
    await w.step()  # the call to SendGrid, refused
    assert w.db.calls.count("recipients.chunk_rows") - before == 2
    (attempt,) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.decision, attempt.next_provider) == ("rejected", "retry", "mg")
    await w.settle()
    assert sorted(w.providers["mg"].emails()) == [A, B]
