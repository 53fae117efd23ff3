"""Providers answering recipient by recipient, over the in-memory twins: each answer settles
its recipient as the provider's webhook event would (accepted, handed to the next provider,
failed and suppressed), unknown answers alone are resolved, and a process dying between
recording the answers and applying them applies them once."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from services.consumers import protocol
from shared.core.webhook_events import ProviderEvent
from shared.delivery.attempts import chunk_line
from shared.delivery.domain_capacity import CapacityGate, CapacityRules
from shared.delivery.precedence import visible
from shared.delivery.recipients import log_id_for
from shared.providers.base import Outcome, Receipt, RecipientAnswer
from tests.fakes.broker import FakeMessage
from tests.fakes.delivery import FakeDomainVolumes
from tests.fakes.world import Died, World, new_batch

A, B, C = "a@example.org", "b@example.org", "c@example.org"


def _receipt(*answers: tuple[str, Outcome], final: bool = False, suppress: bool = False) -> Receipt:
    return Receipt(
        "sg",
        250,
        "relay-1",
        recipients=tuple(
            RecipientAnswer(
                email, outcome, 550 if "permanent" in outcome else None, "said", suppress=suppress
            )
            for email, outcome in answers
        ),
        final=final,
    )


async def _states(w: World, batch_id: uuid.UUID) -> dict[str, tuple[str, str | None]]:
    rows = await w.recipients.batch_rows(batch_id)
    return {r["email"]: (visible(r).state, visible(r).reason) for r in rows}


def _suppressed(w: World) -> set[str]:
    return {email for (_, email) in w.db.suppressions}


async def test_recipients_the_provider_accepted_are_sent_through_it_once() -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), (B, "accepted")))
    await w.settle()
    assert w.providers["sg"].emails() == [A, B]
    assert w.providers["mg"].sent == []
    rows = await w.rows(batch)
    assert {e: (r["event"], tuple(r["evidence"])) for e, r in rows.items()} == {  # type: ignore[arg-type]
        A: ("sent", ("c.0",)),
        B: ("sent", ("c.0",)),
    }


async def test_a_relay_with_no_events_has_its_acceptance_taken_as_delivered() -> None:
    w = World()
    batch = await w.accept(A)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), final=True))
    await w.settle()
    assert await _states(w, batch.batch_id) == {A: ("success", None)}
    assert (await w.counts(batch))["success"] == 1
    rows = await w.rows(batch)
    assert rows[A]["event"] == "delivered"
    assert rows[A]["reason_detail"] is None  # a delivery has no failure to explain
    events = [(k[3], v["kind"]) for k, v in w.db.events.items() if k[0] == batch.batch_id]
    assert [kind for _, kind in events] == ["delivered"]
    assert events[0][0].startswith("answer:sg:")


async def test_a_transient_refusal_hands_the_recipient_to_the_next_provider_once() -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    await w.settle()
    assert w.providers["sg"].emails() == [A, B]
    assert w.providers["mg"].emails() == [B]
    assert [c.attempt for c in w.providers["mg"].sent] == ["r.0"]
    states = await _states(w, batch.batch_id)
    assert states[A] == ("success", None)
    assert states[B][0] == "queued"  # sent through mg, whose events are still to come
    rows = await w.rows(batch)
    assert dict(rows[B]["providers"])["mg"] == "sent"  # type: ignore[call-overload]


@pytest.mark.parametrize("suppress", [True, False])
async def test_a_permanent_refusal_fails_the_recipient_and_suppresses_it_when_told(
    suppress: bool,
) -> None:
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_permanent"), suppress=suppress)
    )
    await w.settle()
    assert w.providers["mg"].sent == []
    states = await _states(w, batch.batch_id)
    assert states[B] == ("failed", "550 said")
    assert (await w.counts(batch))["failed"] == 1
    assert _suppressed(w) == ({B} if suppress else set())


async def test_only_the_recipients_whose_answer_is_unknown_are_resolved_and_resent() -> None:
    w = World()
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "unknown"), (C, "refused_permanent"), final=True)
    )
    await w.settle()
    assert w.providers["sg"].emails() == [A, B, C]
    assert w.providers["mg"].emails() == [B]  # after the query API found nothing of it
    assert [q.emails for q in w.providers["sg"].lookups] == [frozenset({B})]
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [(a.provider, a.state, a.resolution) for a in line] == [
        ("sg", "resolved", "not_accepted"),
        ("mg", "accepted", None),
    ]
    states = await _states(w, batch.batch_id)
    assert states[A] == ("success", None)
    assert states[C][0] == "failed"


async def test_an_answer_unknown_for_everyone_is_an_ambiguous_call() -> None:
    w = World()
    w.providers["sg"].found = frozenset({A})
    batch = await w.accept(A)
    w.providers["sg"].answers.append(_receipt((A, "unknown")))
    await w.settle()
    assert w.providers["mg"].sent == []
    line = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert [(a.state, a.resolution) for a in line] == [("resolved", "accepted")]


@pytest.mark.parametrize("point", ["recorded", "answers", "effects"])
async def test_dying_between_recording_the_answers_and_their_effects_applies_them_once(
    point: str,
) -> None:
    w = World()
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(
        _receipt(
            (A, "accepted"),
            (B, "refused_transient"),
            (C, "refused_permanent"),
            final=True,
            suppress=True,
        )
    )
    await w.crash_once(point)
    assert w.providers["sg"].emails() == [A, B, C]
    assert w.providers["mg"].emails() == [B]
    counts = await w.counts(batch)
    assert (counts["success"], counts["failed"]) == (1, 1)
    assert _suppressed(w) == {C}
    states = await _states(w, batch.batch_id)
    assert states[A] == ("success", None)
    assert states[C][0] == "failed"
    resends = await w.attempts.line(batch.batch_id, f"r{log_id_for(batch.batch_id, B)}")
    assert [(a.provider, a.state) for a in resends] == [("mg", "accepted")]


async def test_dying_before_the_answers_of_an_ambiguous_call_are_applied_loses_none() -> None:
    """Redelivered, the message finds the call ambiguous and applies them (and they count
    once: the resolution applies only what is still missing)."""
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), (B, "unknown"), final=True))
    await w.crash_once("recorded")
    assert w.providers["sg"].emails() == [A, B]
    assert w.providers["mg"].emails() == [B]
    assert (await _states(w, batch.batch_id))[A] == ("success", None)
    assert (await w.counts(batch))["success"] == 1
    assert _reported(w, "sg") == 1


def _reported(w: World, provider: str) -> int:
    """How many fates of ``provider``'s recipients its health was told of."""
    return sum(n for (code, _), (n, _, _) in w.ingest.reports.counts.items() if code == provider)


async def test_the_answers_of_an_ambiguous_call_count_once_when_it_is_resolved() -> None:
    """Applied when the call is recorded ambiguous; its resolution does not apply them again
    (the providers' health and domains' capacity would count them twice)."""
    w = World()
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_permanent"), (C, "unknown"), final=True)
    )
    await w.settle()
    assert w.providers["mg"].emails() == [C]
    (attempt, _) = await w.attempts.line(batch.batch_id, chunk_line(0))
    assert (attempt.state, attempt.resolution) == ("resolved", "not_accepted")
    assert _reported(w, "sg") == 2
    assert w.ingest.metrics.events.labels("sg", "delivered")._value.get() == 1


async def test_a_recipient_the_receipt_leaves_out_is_resolved_not_taken_as_sent() -> None:
    """An adapter's receipt names A and B only: C's fate is unknown, so the call is ambiguous
    for C, whom the query API does not find and the next provider gets."""
    w = World()
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), (B, "accepted"), final=True))
    await w.settle()
    assert [q.emails for q in w.providers["sg"].lookups] == [frozenset({C})]
    assert w.providers["mg"].emails() == [C]
    states = await _states(w, batch.batch_id)
    assert (states[A][0], states[B][0]) == ("success", "success")


async def _presumed_dead(w: World, receipt: Receipt) -> uuid.UUID:
    """A batch whose call's answers (``receipt``) arrive after another delivery marked the
    call ambiguous (its lease ran out); the world then runs to the end."""
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(receipt)
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def expired(point: str, job: protocol.Job) -> None:
        (attempt,) = await w.attempts.line(job.batch_id, job.line)
        assert await w.attempts.transition(
            job.batch_id, job.line, job.attempt, expect={"state": "calling"},
            values={"state": "ambiguous", "checks": attempt.checks + 1, "finished_at": w.clock.now},
        )  # fmt: skip
        await w.dispatcher.follow.check(job, attempt.checks + 1, 1.0)

    w.fault_points["answered"] = expired
    await w.deliver(message)
    del w.fault_points["answered"]
    await w.settle()
    return batch.batch_id


async def test_answers_heard_after_a_presumed_death_still_settle_their_recipients() -> None:
    w = World()
    receipt = _receipt((A, "accepted"), (B, "refused_transient"), (C, "unknown"), final=True)
    batch_id = await _presumed_dead(w, receipt)
    assert w.providers["sg"].emails() == [A, B, C]
    assert sorted(w.providers["mg"].emails()) == [B, C]  # B handed over, C resolved: once each
    assert [q.emails for q in w.providers["sg"].lookups] == [frozenset({C})]
    assert (await _states(w, batch_id))[A] == ("success", None)


async def test_answers_all_known_after_a_presumed_death_settle_the_attempt() -> None:
    w = World()
    receipt = _receipt((A, "accepted"), (B, "refused_transient"), (C, "refused_permanent"))
    batch_id = await _presumed_dead(w, receipt)
    assert w.providers["mg"].emails() == [B]
    (attempt,) = await w.attempts.line(batch_id, chunk_line(0))
    assert (attempt.state, attempt.resolution) == ("resolved", "accepted")
    states = await _states(w, batch_id)
    assert (states[A][0], states[C][0]) == ("queued", "failed")  # A: sent, its events to come


async def test_answers_all_known_after_a_presumed_death_survive_a_death_before_resolving() -> None:
    """The late delivery dies after hearing every answer and before its resolving write (its
    message redelivered): the refused recipients still go their ways, and the accepted one is
    delivered, not left queued."""
    w = World()
    batch = await w.accept(A, B, C)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), (C, "refused_permanent"),
                 final=True, suppress=True)
    )  # fmt: skip
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None

    async def expired(point: str, job: protocol.Job) -> None:
        (attempt,) = await w.attempts.line(job.batch_id, job.line)
        assert await w.attempts.transition(
            job.batch_id, job.line, job.attempt, expect={"state": "calling"},
            values={"state": "ambiguous", "checks": attempt.checks + 1, "finished_at": w.clock.now},
        )  # fmt: skip
        await w.dispatcher.follow.check(job, attempt.checks + 1, 1.0)

    caller = w.dispatcher.caller
    transition = caller.attempts.transition

    async def dies_resolving(*args: Any, **kwargs: Any) -> bool:
        if kwargs["values"].get("resolution") == "accepted":
            raise Died("resolving")
        return await transition(*args, **kwargs)

    w.fault_points["answered"] = expired
    caller.attempts.transition = dies_resolving  # type: ignore[method-assign]
    with pytest.raises(Died):
        await w.deliver(message)
    del w.fault_points["answered"]
    caller.attempts.transition = transition  # type: ignore[method-assign]
    again = FakeMessage(message.routing_key, message.body)
    again.deliveries = message.deliveries + 1
    w.broker.queues[w.broker.topology.provider_queue("sg")].append(again)
    await w.settle()

    assert w.providers["mg"].emails() == [B]
    assert C in _suppressed(w)
    states = await _states(w, batch.batch_id)
    assert (states[A][0], states[C][0]) == ("success", "failed")


async def test_an_answer_applied_again_by_a_resolution_does_not_outrank_a_later_bounce() -> None:
    """Accepted (by a provider with events) beside an unknown recipient: the provider's bounce
    of the accepted one, heard before the resolution, stays its last word."""
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), (B, "unknown")))
    for _ in range(3):
        await w.step()
    w.clock.now += timedelta(seconds=20)
    bounce = ProviderEvent(
        provider="sg", event_id="wh-1", kind="bounced", raw_event="bounce/bounce", email=A,
        occurred_at=w.clock.now, batch_id=batch.batch_id, chunk=0,
        log_id=log_id_for(batch.batch_id, A), attempt="c.0", message_id=None,
        reason="550 no such user", provider_side=False, suppress=True,
    )  # fmt: skip
    await w.ingest.apply(bounce)
    await w.settle()

    assert (await _states(w, batch.batch_id))[A] == ("failed", "550 no such user")
    rows = {r["email"]: r for r in await w.recipients.batch_rows(batch.batch_id)}
    assert rows[A]["event"] == "bounced"


async def test_answers_that_cannot_be_read_dead_letter_the_job_instead_of_guessing() -> None:
    """Read as "no answers", every recipient would count accepted: the job goes to the
    operators' dead letters, and its recipients stay queued, visibly."""
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(_receipt((A, "accepted"), (B, "refused_permanent")))

    async def corrupt(point: str, job: protocol.Job) -> None:
        del w.fault_points[point]
        assert await w.attempts.transition(
            job.batch_id, job.line, job.attempt, expect={"state": "accepted"},
            values={"answers": '{"recipients": [{"email": 1}]}'},
        )  # fmt: skip
        raise Died(point)

    w.fault_points["recorded"] = corrupt
    await w.step()
    message = await w.broker.get(w.broker.topology.provider_queue("sg"))
    assert message is not None
    with pytest.raises(Died):
        await w.deliver(message)
    again = FakeMessage(message.routing_key, message.body, message_id=message.message_id)
    assert await w.deliver(again) == "reject"
    assert [m.routing_key for m in w.dead] == [message.routing_key]
    assert set((await w.states(batch)).values()) == {"queued"}


async def test_a_pinned_batch_asks_its_provider_again_later_for_a_recipient_refused_for_now() -> (
    None
):
    """A pinned batch has no other provider: a recipient refused for now (a greylisting
    relay's 451, a throttled call) waits a backoff and goes to the same provider again,
    as a whole call's transient error would, instead of failing."""
    w = World()
    plain = new_batch(A, B)
    pinned = replace(plain, message=plain.message.model_copy(update={"provider": "sg"}))
    batch = await w.accept_batch(pinned)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    w.providers["sg"].answers.append(_receipt((B, "accepted"), final=True))
    started = w.clock.now
    await w.settle()
    assert w.providers["sg"].emails() == [A, B, B]
    assert w.providers["mg"].sent == []
    assert await _states(w, batch.batch_id) == {A: ("success", None), B: ("success", None)}
    assert w.clock.now - started >= timedelta(seconds=w.settings.backoff_tiers[0])


async def test_a_recipient_refused_for_now_goes_to_the_next_provider_at_once_when_not_pinned() -> (
    None
):
    w = World()
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    started = w.clock.now
    await w.settle()
    assert w.providers["mg"].emails() == [B]
    assert w.clock.now - started < timedelta(seconds=w.settings.backoff_tiers[0])
    rows = await w.rows(batch)
    assert str(dict(rows[B]["providers"])["sg"]).startswith("refused for now")  # type: ignore[call-overload]


async def test_a_domains_capacity_counts_a_refused_recipient_once_with_its_resend() -> None:
    """B refused for now by SendGrid is given back, then counted by Mailgun's call."""
    volumes = FakeDomainVolumes()
    w = World(
        capacity=CapacityGate(volumes), capacity_rules=CapacityRules(enabled=True, initial=1000)
    )
    await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    await w.settle()
    assert w.providers["mg"].emails() == [B]
    assert [day["sent"] for day in volumes.days.values()] == [2]


async def test_a_recipient_refused_for_now_with_no_other_provider_left_is_asked_again_later() -> (
    None
):
    """A chain of one (not pinned): the provider is asked again after a backoff, as for a
    pinned batch, instead of failing her with "no other provider is left"."""
    w = World(chain="sg")
    batch = await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    w.providers["sg"].answers.append(_receipt((B, "accepted"), final=True))
    await w.settle()
    assert w.providers["sg"].emails() == [A, B, B]
    assert await _states(w, batch.batch_id) == {A: ("success", None), B: ("success", None)}


async def test_a_recipient_refused_for_now_says_nothing_of_the_providers_health() -> None:
    w = World()
    await w.accept(A, B)
    w.providers["sg"].answers.append(
        _receipt((A, "accepted"), (B, "refused_transient"), final=True)
    )
    await w.settle()
    drops = sum(d for (code, _), (_, d, _) in w.ingest.reports.counts.items() if code == "sg")
    assert (_reported(w, "sg"), drops) == (1, 0)
