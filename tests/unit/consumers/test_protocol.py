"""The attempt protocol's decisions (pure): who claims, calls, waits, expires and resolves."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.consumers import protocol
from services.consumers.protocol import Job, ResolveSettings
from shared.delivery.attempts import Attempt

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=65)
ME, OTHER = uuid.uuid4(), uuid.uuid4()
BATCH = uuid.uuid1()
WINDOWS = ResolveSettings(interval=30, query_after=300, webhook_window=3600)


def job(
    attempt: int = 0,
    *,
    provider: str = "sg",
    check: int | None = None,
    own: bool = False,
    origin: str | None = None,
) -> Job:
    log_id = uuid.uuid1() if own else None
    line = f"r{log_id}" if own else "c0"
    return Job(BATCH, line, 0, log_id, attempt, provider, check, origin=origin)


def attempt(n: int = 0, state: str = "claimed", **kw: object) -> Attempt:
    base = Attempt(
        line="c0",
        attempt=n,
        chunk=0,
        provider="sg",
        state=state,
        owner=ME,
        cause=None,
        reason=None,
        created_at=NOW - timedelta(seconds=5),
        calling_at=None,
        finished_at=None,
        status_code=None,
        message_id=None,
        error=None,
        checks=0,
        checked_by=None,
        resolution=None,
        decision=None,
        verdict=None,
        next_provider=None,
        next_attempt=None,
        next_delay=None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def step(j: Job, line: list[Attempt], *, called: bool = False, now: datetime = NOW) -> object:
    return protocol.next_step(j, line, me=ME, called=called, now=now, lease=LEASE)


def test_the_first_delivery_of_a_chunk_claims_its_first_attempt() -> None:
    assert step(job(), []) == protocol.Claim()


def test_a_resend_line_never_starts_without_a_planned_attempt() -> None:
    assert isinstance(step(job(own=True), []), protocol.Stray)


def test_a_retry_is_claimed_only_when_the_previous_attempt_decided_it() -> None:
    decided = attempt(0, "rejected", decision="retry", next_attempt=1, next_provider="mg")
    assert step(job(1, provider="mg"), [decided]) == protocol.Claim()
    assert isinstance(step(job(1, provider="sg"), [decided]), protocol.Stray)
    assert isinstance(
        step(job(1, provider="mg"), [replace(decided, decision="give_up")]), protocol.Stray
    )


@pytest.mark.parametrize("state", ["planned", "claimed"])
def test_a_planned_or_claimed_attempt_moves_to_calling(state: str) -> None:
    assert step(job(), [attempt(0, state, owner=OTHER)]) == protocol.StartCall(state, OTHER)


def test_our_own_call_is_made_once_then_only_recorded() -> None:
    calling = attempt(0, "calling", calling_at=NOW)
    assert step(job(), [calling], called=False) == protocol.Call()
    assert step(job(), [calling], called=True) == protocol.Record()


def test_another_callers_call_is_waited_for_until_its_lease_ends() -> None:
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW - timedelta(seconds=10))
    assert step(job(), [calling]) == protocol.WaitLease(0, NOW - timedelta(seconds=10) + LEASE)


def test_a_call_that_outlived_its_lease_becomes_ambiguous_not_failed() -> None:
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW - LEASE - timedelta(seconds=1))
    assert step(job(), [calling]) == protocol.Expire(OTHER, 0)


def test_only_the_current_check_continues_a_chain_of_checks() -> None:
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW, checks=2)
    assert step(job(check=1), [calling]) == protocol.Done()
    assert step(job(), [calling]) == protocol.Done()  # a duplicate: a check is queued
    ambiguous = attempt(0, "ambiguous", owner=OTHER, checks=3)
    assert step(job(check=3), [ambiguous]) == protocol.Resolve()
    assert step(job(check=2), [ambiguous]) == protocol.Done()
    assert step(job(), [ambiguous]) == protocol.EnsureCheck(3)


def test_a_settled_attempt_is_followed_up_and_a_later_one_means_done() -> None:
    settled = attempt(0, "rejected", decision="retry", next_attempt=1, next_provider="mg")
    assert step(job(), [settled]) == protocol.FollowUp(settled)
    assert step(job(), [settled, attempt(1, "claimed", provider="mg")]) == protocol.Done()


def test_a_job_for_another_provider_than_the_attempts_is_stray() -> None:
    assert isinstance(step(job(provider="mg"), [attempt(0, "claimed")]), protocol.Stray)


def row(email: str, **kw: object) -> dict[str, object]:
    return {"email": email, "state": "queued", "event": "queued", "evidence": None, **kw}


def test_pending_skips_final_recipients_and_those_a_chunk_attempt_got_accepted() -> None:
    rows = [
        row("a"),
        row("b", state="success", event="delivered"),
        row("c", evidence={"c.0"}, event="sent"),
        row("d", gave_up_reason="every provider failed"),
    ]
    assert [r["email"] for r in protocol.pending(rows, own_line=False, tag="c.1")] == ["a"]


def test_pending_of_a_resend_is_its_recipient_unless_that_attempt_was_accepted() -> None:
    resent = row("a", evidence={"c.0"}, event="sent")
    assert protocol.pending([resent], own_line=True, tag="r.0") == [resent]
    assert protocol.pending([row("a", evidence={"r.0"})], own_line=True, tag="r.0") == []


def test_a_resend_skips_a_recipient_an_earlier_resend_of_her_line_got_accepted() -> None:
    """r.0 was resolved as not accepted, r.1 is queued, then r.0's acceptance is reported:
    r.1 has nobody left to send to."""
    late = row("a", evidence={"c.0", "r.0"}, superseded={"c.0"}, event="sent")
    assert protocol.pending([late], own_line=True, tag="r.1") == []


def test_a_resend_still_goes_when_the_earlier_acceptance_was_handed_over() -> None:
    """r.0 was accepted, then dropped by its provider (handed over: superseded): r.1 sends."""
    dropped = row("a", evidence={"c.0", "r.0"}, superseded={"c.0", "r.0"}, event="dropped")
    assert protocol.pending([dropped], own_line=True, tag="r.1") == [dropped]


def test_a_resend_goes_when_its_line_planned_it_for_the_earlier_ones_drop_not_yet_marked() -> None:
    """r.1 was planned because r.0's provider dropped her (its cause): her row does not say
    r.0 is superseded yet (the hand-off marks it after publishing), and r.1 still sends."""
    dropped = row("a", evidence={"c.0", "r.0"}, superseded={"c.0"}, event="dropped")
    handed = frozenset({"c.0", "r.0"})
    assert protocol.pending([dropped], own_line=True, tag="r.1", handed=handed) == [dropped]


def test_resolve_waits_for_the_query_api_before_trusting_it() -> None:
    pending = frozenset({"a", "b"})
    early = protocol.resolve(pending, age=10, lookup=frozenset({"a"}), settings=WINDOWS)
    assert isinstance(early, protocol.Wait)
    late = protocol.resolve(pending, age=301, lookup=frozenset({"a"}), settings=WINDOWS)
    assert late == protocol.Conclude(frozenset({"a"}), frozenset({"b"}))


def test_without_a_query_api_only_the_webhook_window_ends_the_wait() -> None:
    pending = frozenset({"a"})
    assert isinstance(
        protocol.resolve(pending, age=3599, lookup="unsupported", settings=WINDOWS), protocol.Wait
    )
    assert protocol.resolve(pending, age=3600, lookup="unsupported", settings=WINDOWS) == (
        protocol.Conclude(frozenset(), pending)
    )


def test_resolve_never_waits_longer_than_its_interval_nor_less_than_a_second() -> None:
    waited = protocol.resolve(frozenset({"a"}), age=299.5, lookup=None, settings=WINDOWS)
    assert waited == protocol.Wait(1.0)
    waited = protocol.resolve(frozenset({"a"}), age=0, lookup=None, settings=WINDOWS)
    assert waited == protocol.Wait(30)


def test_nothing_pending_concludes_at_once() -> None:
    assert protocol.resolve(frozenset(), age=0, lookup=None, settings=WINDOWS) == (
        protocol.Conclude(frozenset(), frozenset())
    )


def test_an_unclaimed_attempt_behind_a_later_one_is_stray() -> None:
    """A redelivered first job after the line moved on must not claim its attempt again."""
    later = attempt(1, "claimed", provider="mg")
    assert step(job(), [later]) == protocol.Stray("attempt 0 was never claimed")


def test_a_check_of_an_attempt_that_was_never_claimed_is_stray() -> None:
    """Checks only follow claimed attempts: a check of a missing one claims nothing."""
    assert step(job(check=1), []) == protocol.Stray("attempt 0 was never claimed")


@pytest.mark.parametrize(
    ("j", "line", "why"),
    [
        (job(provider="mg"), [attempt(0, "claimed")], "attempt 0 belongs to sg"),
        (job(own=True), [], "re-sends start as planned attempts"),
        (job(2, provider="mg"), [], "no decision leads to attempt 2 via mg"),
    ],
)
def test_a_stray_job_says_why_it_is_dropped(j: Job, line: list[Attempt], why: str) -> None:
    """The reason (logged when the job is acked) names the attempt and what rules it out."""
    assert step(j, line) == protocol.Stray(why)


def test_the_delivery_that_numbered_an_ambiguous_check_publishes_it_again() -> None:
    """Its publish may never have been confirmed (or its write timed out having applied):
    a redelivery of the very message that numbered check 4 makes sure it is out; another
    copy of the check it held does not."""
    ambiguous = attempt(0, "ambiguous", owner=OTHER, checks=4, checked_by="m3")
    assert step(job(check=3, origin="m3"), [ambiguous]) == protocol.EnsureCheck(4)
    assert step(job(check=3, origin="m3-copy"), [ambiguous]) == protocol.Done()
    assert step(job(check=3), [ambiguous]) == protocol.Done()


def test_the_delivery_that_numbered_a_lease_check_publishes_it_again() -> None:
    """The first job waited for another caller's lease (checks 0 -> 1) and its publish was
    lost: its redelivery publishes check 1; a duplicate of the job does not."""
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW, checks=1, checked_by="job")
    assert step(job(origin="job"), [calling]) == protocol.EnsureCheck(1)
    assert step(job(origin="other"), [calling]) == protocol.Done()
    stale = attempt(0, "calling", owner=OTHER, calling_at=NOW, checks=3, checked_by="c2")
    assert step(job(check=2, origin="c2"), [stale]) == protocol.EnsureCheck(3)


def test_a_redelivery_of_a_call_whose_first_check_is_queued_is_done() -> None:
    """One queued check (checks = 1) is enough: a redelivery does not start another."""
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW - LEASE, checks=1)
    assert step(job(), [calling]) == protocol.Done()


def test_a_lease_expires_at_exactly_its_end() -> None:
    """The lease is a deadline: at ``calling_at + lease`` the call is presumed dead."""
    calling = attempt(0, "calling", owner=OTHER, calling_at=NOW - LEASE)
    assert step(job(), [calling]) == protocol.Expire(OTHER, 0)


def test_a_final_recipient_does_not_hide_the_pending_ones_after_it() -> None:
    rows = [row("a", state="failed", event="bounced"), row("b")]
    assert [r["email"] for r in protocol.pending(rows, own_line=False, tag="c.1")] == ["b"]


def test_the_query_api_is_due_exactly_at_query_after() -> None:
    assert protocol.query_due(300, WINDOWS)
    assert not protocol.query_due(299.9, WINDOWS)


def test_a_failing_query_api_ends_the_wait_at_the_webhook_window() -> None:
    """A query API that keeps failing is treated like none: no webhook by then means no."""
    pending = frozenset({"a"})
    assert protocol.resolve(pending, age=3600, lookup="error", settings=WINDOWS) == (
        protocol.Conclude(frozenset(), pending)
    )


def test_without_a_query_api_the_last_wait_ends_with_the_webhook_window() -> None:
    """Close to the webhook window the next look is when it closes, not an interval later."""
    waited = protocol.resolve(frozenset({"a"}), age=3590, lookup="unsupported", settings=WINDOWS)
    assert waited == protocol.Wait(10)


@pytest.mark.parametrize("age", [300, 400])
def test_once_its_window_has_closed_the_next_look_is_an_interval_later(age: float) -> None:
    """A query due but not asked yet (no lookup) is looked at again after the usual interval."""
    waited = protocol.resolve(frozenset({"a"}), age=age, lookup=None, settings=WINDOWS)
    assert waited == protocol.Wait(30)


@pytest.mark.parametrize(
    ("fields", "expired"),
    [
        ({"event": "deferred"}, True),
        ({"event": "deferred", "superseded": {"c.1"}}, True),
        ({"event": "deferred", "superseded": {"c.0"}}, False),
        ({"event": "sent"}, False),
        ({"event": "deferred", "state": "success"}, False),
        ({"event": "deferred", "gave_up_reason": "every provider failed"}, False),
    ],
    ids=["deferred", "other-attempt-handed-over", "handed-over", "moved-on", "final", "gave-up"],
)
def test_a_deferral_expires_only_while_the_recipient_is_still_deferred_on_that_attempt(
    fields: dict[str, object], expired: bool
) -> None:
    assert protocol.deferral_expired(row("a", **fields), "c.0") is expired


def test_a_provider_without_events_has_its_own_window() -> None:
    """An SMTP relay's ambiguous call ends at its own wait, not the hour of the others."""
    windows = ResolveSettings(
        interval=30, query_after=300, webhook_window=3600, windows={"smtp": 120}
    )
    pending = frozenset({"a"})

    smtp = windows.for_provider("smtp")
    assert protocol.resolve(pending, age=120, lookup="unsupported", settings=smtp) == (
        protocol.Conclude(frozenset(), pending)
    )
    assert protocol.query_due(120, smtp)
    assert windows.for_provider("sg") == windows
