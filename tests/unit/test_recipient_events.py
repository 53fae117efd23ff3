"""What users' webhooks are told of attempts and provider reports
(``shared.outbound.recipient_events``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from services.hooks.schedule import in_order
from shared.core.catalog import TRACKER
from shared.core.webhook_events import ProviderEvent
from shared.delivery.attempts import Attempt
from shared.outbound.recipient_events import (
    NO_QUERY,
    NO_WEBHOOK,
    attempt_events,
    evidence_of,
    outcome_of,
    reported_event,
)
from shared.outbound.user_hooks import message_id, payload

AT = datetime(2026, 11, 26, 8, tzinfo=UTC)
BATCH = uuid.uuid1()
LOG_ID = uuid.uuid4()
ROWS = [{"log_id": LOG_ID, "email": "ann@example.com"}]


def _attempt(state: str, **kw: object) -> Attempt:
    values: dict[str, object] = {
        "line": "c0",
        "attempt": 0,
        "chunk": 0,
        "provider": "sg",
        "state": state,
        "owner": None,
        "cause": None,
        "reason": None,
        "created_at": AT,
        "calling_at": AT,
        "finished_at": AT,
        "status_code": None,
        "message_id": None,
        "error": None,
        "checks": 0,
        "checked_by": None,
        "resolution": None,
        "decision": None,
        "verdict": None,
        "next_provider": None,
        "next_attempt": None,
        "next_delay": None,
        **kw,
    }
    return Attempt(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("attempt", "outcome"),
    [
        (_attempt("accepted", decision="done"), "accepted"),
        (_attempt("rejected", decision="retry"), "refused"),
        (_attempt("resolved", decision="retry", resolution="not_accepted"), "confirmed not sent"),
        (_attempt("resolved", decision="done", resolution="accepted"), None),
        (_attempt("ambiguous"), None),
    ],
)
def test_a_settled_attempt_tells_its_outcome(attempt: Attempt, outcome: str | None) -> None:
    assert outcome_of(attempt) == outcome


def test_evidence_names_how_an_unclear_call_was_settled() -> None:
    query = _attempt("resolved", error=f"transient|no evidence from {NO_QUERY} that it ...")
    hooks = _attempt("resolved", error=f"transient|no evidence from {NO_WEBHOOK} that it ...")

    assert (evidence_of(query), evidence_of(hooks)) == ("provider query", "webhook")
    assert evidence_of(_attempt("rejected")) == "api"


@pytest.mark.parametrize(
    ("verdict", "evidence"),
    [
        (f"sg no evidence from {NO_QUERY} that it accepted it", "provider query"),
        (f"all 2 attempts failed; last: sg no evidence from {NO_QUERY} ...", "provider query"),
        (f"sg no evidence from {NO_WEBHOOK} that it accepted it", "webhook"),
    ],
)
def test_evidence_of_a_resolution_is_read_from_its_decision(verdict: str, evidence: str) -> None:
    """The resolver keeps the call's own error (here a 503) and words its evidence in the
    decision: the query API is named there."""
    attempt = _attempt("resolved", error="transient|HTTP 503", verdict=verdict)

    assert evidence_of(attempt) == evidence


def test_a_refusal_handed_to_another_provider_is_also_a_failover() -> None:
    refused = _attempt(
        "rejected",
        error="transient|429 too many requests",
        decision="retry",
        next_provider="mg",
        verdict="sg 429 too many requests",
    )

    attempt, over = attempt_events(refused, BATCH, ROWS, outcome="refused", evidence="api")

    assert (attempt.type, attempt.outcome, attempt.reason) == (
        "recipient.attempt",
        "refused",
        "429 too many requests",
    )
    assert (attempt.provider, attempt.attempt_id, attempt.email) == ("sg", "c.0", "ann@example.com")
    assert (over.type, over.outcome, over.reason) == (
        "recipient.failed_over",
        "to mg",
        "sg 429 too many requests",
    )


def test_a_retry_with_the_same_provider_is_no_failover() -> None:
    again = _attempt("rejected", decision="retry", next_provider="sg")

    assert [
        e.type for e in attempt_events(again, BATCH, ROWS, outcome="refused", evidence="api")
    ] == ["recipient.attempt"]


def test_an_event_built_twice_is_the_same_message() -> None:
    first = attempt_events(_attempt("accepted"), BATCH, ROWS, outcome="accepted", evidence="api")
    later = replace(_attempt("accepted"), finished_at=datetime.now(UTC))
    again = attempt_events(later, BATCH, ROWS, outcome="accepted", evidence="api")

    assert [message_id(e) for e in first] == [message_id(e) for e in again]


def test_an_attempt_told_again_after_its_resolution_says_the_same() -> None:
    """A resolution rewrites ``finished_at``; the attempt's body (its timestamp) stays."""
    first = attempt_events(_attempt("accepted"), BATCH, ROWS, outcome="accepted", evidence="api")
    later = replace(_attempt("accepted"), finished_at=datetime.now(UTC))
    again = attempt_events(later, BATCH, ROWS, outcome="accepted", evidence="api")

    assert [payload(e) for e in first] == [payload(e) for e in again]


@dataclass(frozen=True)
class _Queued:
    at: datetime
    body: bytes


def test_a_report_stamped_before_its_calls_answer_reached_us_is_told_after_the_attempt() -> None:
    """The call began at 08:00:00.9; SendGrid took it at 08:00:00.95 and stamped "sent"
    08:00:00 (to the second) while its answer was on its way back, arriving at 08:00:01.2:
    the endpoint hears the attempt first, then what the provider did with it."""
    call = replace(
        _attempt("accepted"),
        calling_at=AT + timedelta(seconds=0.9),
        finished_at=AT + timedelta(seconds=1.2),
    )
    (attempt,) = attempt_events(call, BATCH, ROWS, outcome="accepted", evidence="api")
    sent = reported_event(replace(_reported("sent"), occurred_at=AT), BATCH, LOG_ID, "")
    assert sent is not None
    queued = [_Queued(AT + timedelta(seconds=2), payload(e)) for e in (sent, attempt)]

    now, _ = in_order(queued, AT + timedelta(minutes=1), timedelta(seconds=0.5))

    assert [orjson.loads(q.body)["type"] for q in now] == ["recipient.attempt", "recipient.sent"]


def _reported(kind: str, provider: str = "sg") -> ProviderEvent:
    return ProviderEvent(
        provider=provider,
        event_id="ev1",
        kind=kind,  # type: ignore[arg-type]
        raw_event=kind,
        email="ann@example.com",
        occurred_at=AT,
        batch_id=BATCH,
        chunk=0,
        log_id=None,
        attempt="c.0",
        message_id=None,
        reason=None,
        provider_side=False,
        suppress=False,
        url="https://shop.example/a" if kind == "clicked" else None,
    )


def test_a_providers_report_is_told_with_the_webhook_as_evidence() -> None:
    told = reported_event(_reported("delivered"), BATCH, LOG_ID, "")

    assert told is not None
    assert (told.type, told.provider, told.evidence, told.attempt_id, told.email) == (
        "recipient.delivered",
        "sg",
        "webhook",
        "c.0",
        "ann@example.com",
    )


def test_a_click_on_our_tracking_endpoint_names_the_link_and_no_provider() -> None:
    told = reported_event(_reported("clicked", TRACKER), BATCH, LOG_ID, "x@example.com")

    assert told is not None
    assert (told.type, told.provider, told.reason, told.email) == (
        "recipient.clicked",
        None,
        "https://shop.example/a",
        "x@example.com",
    )


def test_an_event_we_do_not_interpret_is_not_told() -> None:
    assert reported_event(_reported("unknown"), BATCH, LOG_ID, "") is None
