"""A provider's answers recipient by recipient, as stored and as the events they stand for
(pure: ``shared.delivery.recipient_answers``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from shared.core.webhook_events import ProviderEvent
from shared.delivery import recipient_answers
from shared.delivery.attempts import Attempt
from shared.delivery.recipient_answers import ACCEPTED_BY_RELAY, Answers
from shared.delivery.recipients import log_id_for
from shared.providers.base import Receipt, RecipientAnswer

BATCH = uuid.uuid1()
A, B, C, D = "a@example.org", "b@example.org", "c@example.org", "d@example.org"
ROWS = [{"email": e, "log_id": log_id_for(BATCH, e)} for e in (A, B, C, D)]
FINISHED = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def _attempt(line: str = "c0", attempt: int = 2, provider: str = "sg") -> Attempt:
    return Attempt(
        line=line,
        attempt=attempt,
        chunk=0,
        provider=provider,
        state="accepted",
        owner=None,
        cause=None,
        reason=None,
        created_at=FINISHED,
        calling_at=FINISHED,
        finished_at=FINISHED,
        status_code=250,
        message_id="m-1",
        error=None,
        checks=0,
        checked_by=None,
        resolution=None,
        decision="done",
        verdict=None,
        next_provider=None,
        next_attempt=None,
        next_delay=None,
    )


MIXED = Answers(
    (
        RecipientAnswer(A, "accepted", 250, "ok"),
        RecipientAnswer(B, "refused_transient", 451, "try later"),
        RecipientAnswer(C.upper(), "refused_permanent", 550, "5.1.1 no such user", suppress=True),
        RecipientAnswer(D, "unknown"),
    )
)


def _by_email(answers: Answers) -> dict[str, ProviderEvent]:
    events = recipient_answers.events(_attempt(), BATCH, ROWS, answers)
    return {e.email: e for e in events}


def test_a_receipt_for_the_whole_chunk_has_no_answers() -> None:
    assert recipient_answers.of(Receipt("sg", 202, "m")) is None
    assert recipient_answers.answers_column(Receipt("sg", 202, "m")) == {}


def test_answers_survive_their_stored_form() -> None:
    answers = Answers(MIXED.recipients, final=True)
    assert recipient_answers.decode(recipient_answers.encode(answers)) == answers


def test_no_stored_form_is_no_answers() -> None:
    assert recipient_answers.decode(None) is None
    assert recipient_answers.decode("") is None


@pytest.mark.parametrize(
    "raw",
    ['{"recipients": [{"email": "a", "outcome": "maybe"}]}', "not json", '{"final": true}'],
    ids=["unknown-outcome", "not-json", "no-recipients"],
)
def test_an_unreadable_stored_form_is_refused_not_taken_as_no_answers(raw: str) -> None:
    """Read as "no answers", the attempt would count every recipient accepted."""
    with pytest.raises(recipient_answers.Unreadable):
        recipient_answers.decode(raw)


def test_a_recipient_the_receipt_leaves_out_is_unknown_not_accepted() -> None:
    receipt = Receipt("smtp", 250, None, recipients=(RecipientAnswer("A@Example.org", "accepted"),))

    whole = recipient_answers.complete(receipt, ["a@example.org", "b@example.org"])

    assert [(a.email, a.outcome) for a in whole.recipients or ()] == [
        ("A@Example.org", "accepted"),
        ("b@example.org", "unknown"),
    ]
    assert recipient_answers.answered_unknown(whole) is not None


def test_a_receipt_for_the_whole_chunk_is_complete_as_it_is() -> None:
    receipt = Receipt("sg", 202, "m-1")

    assert recipient_answers.complete(receipt, ["a@example.org"]) is receipt


def test_the_same_answers_make_the_same_event_ids() -> None:
    first = recipient_answers.events(_attempt(), BATCH, ROWS, MIXED)
    again = recipient_answers.events(_attempt(), BATCH, list(reversed(ROWS)), MIXED)
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert len({e.event_id for e in first}) == 3


def test_event_ids_differ_between_attempts_and_providers() -> None:
    attempts = [_attempt(), _attempt(attempt=3), _attempt(line="r1"), _attempt(provider="mg")]
    ids = {
        e.event_id
        for attempt in attempts
        for e in recipient_answers.events(attempt, BATCH, ROWS[:1], MIXED)
        if e.email == A
    }
    assert len(ids) == 4


def test_events_carry_our_correlation_ids_and_the_attempt_tag() -> None:
    event = _by_email(MIXED)[C]
    assert event.batch_id == BATCH
    assert event.chunk == 0
    assert event.log_id == log_id_for(BATCH, C)
    assert event.attempt == "c.2"
    assert event.occurred_at == FINISHED
    assert event.message_id == "m-1"


def test_an_unknown_answer_stands_for_no_event() -> None:
    assert D not in _by_email(MIXED)


def test_an_accepted_answer_is_sent_unless_the_relay_says_that_is_final() -> None:
    assert _by_email(MIXED)[A].kind == "sent"
    final = _by_email(Answers(MIXED.recipients, final=True))[A]
    assert (final.kind, final.reason) == ("delivered", ACCEPTED_BY_RELAY)


def test_a_transient_refusal_is_a_drop_by_the_provider_itself() -> None:
    event = _by_email(MIXED)[B]
    assert (event.kind, event.provider_side, event.suppress) == ("dropped", True, False)
    assert event.reason == "451 try later"


def test_a_permanent_refusal_is_final_and_suppresses_only_when_the_answer_says_so() -> None:
    event = _by_email(MIXED)[C]
    assert (event.kind, event.provider_side, event.suppress) == ("dropped", False, True)
    kept = Answers((RecipientAnswer(C, "refused_permanent", 554, "policy"),))
    assert _by_email(kept)[C].suppress is False


def test_an_address_not_in_the_rows_is_located_by_ingest() -> None:
    answers = Answers((RecipientAnswer("x@example.org", "accepted"),))
    (event,) = recipient_answers.events(_attempt(), BATCH, ROWS, answers)
    assert (event.email, event.log_id) == ("x@example.org", None)


def test_unknown_answers_make_the_call_ambiguous() -> None:
    error = recipient_answers.unknown_error("smtp", MIXED)
    assert error is not None and error.outcome_unknown
    assert "1 of 4" in error.message


def test_answers_all_known_leave_the_call_answered() -> None:
    known = Answers(MIXED.recipients[:3])
    assert recipient_answers.unknown_error("smtp", known) is None
    receipt = Receipt("smtp", 250, None, recipients=known.recipients)
    assert recipient_answers.answered_unknown(receipt) is None
    assert set(recipient_answers.answers_column(receipt)) == {"answers"}
