"""How the SES adapter answers a chunk of personal copies from its calls' answers
(``shared.providers.ses.receipt_of``, pure): per recipient, unless nothing was accepted and
every call failed alike."""

from __future__ import annotations

import pytest

from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.providers.base import RecipientAnswer
from shared.providers.ses import receipt_of


def accepted(email: str) -> tuple[RecipientAnswer, None]:
    return RecipientAnswer(email, "accepted", 200, "", f"id-{email}"), None


def failed(email: str, error: ProviderError) -> tuple[RecipientAnswer, ProviderError]:
    outcome = (
        "unknown"
        if error.outcome_unknown
        else "refused_permanent"
        if isinstance(error, PermanentProviderError)
        else "refused_transient"
    )
    return RecipientAnswer(email, outcome, error.status, error.message), error  # type: ignore[arg-type]


THROTTLED = TransientProviderError("ses", "TooManyRequests", status=429)
REJECTED = PermanentProviderError("ses", "MessageRejected", status=400)
UNKNOWN = TransientProviderError("ses", "InternalFailure", status=500, outcome_unknown=True)
PAUSED = ProviderMisconfigured("ses", "SendingPaused", status=400)


def test_accepted_and_refused_recipients_are_answered_each_on_its_own() -> None:
    receipt = receipt_of([accepted("a@x.org"), failed("b@x.org", REJECTED),
                          failed("c@x.org", UNKNOWN), failed("d@x.org", PAUSED)])  # fmt: skip

    assert receipt.recipients is not None
    assert [(a.email, a.outcome) for a in receipt.recipients] == [
        ("a@x.org", "accepted"),
        ("b@x.org", "refused_permanent"),
        ("c@x.org", "unknown"),
        ("d@x.org", "refused_transient"),
    ]
    assert (receipt.status, receipt.message_id) == (200, "id-a@x.org")


def test_refusals_of_different_kinds_without_an_acceptance_are_still_per_recipient() -> None:
    receipt = receipt_of([failed("a@x.org", THROTTLED), failed("b@x.org", REJECTED)])

    assert receipt.recipients is not None
    assert [a.outcome for a in receipt.recipients] == ["refused_transient", "refused_permanent"]


@pytest.mark.parametrize("error", [THROTTLED, REJECTED, UNKNOWN, PAUSED], ids=str)
def test_every_call_failing_alike_fails_the_chunk_with_that_error(error: ProviderError) -> None:
    with pytest.raises(type(error)) as caught:
        receipt_of([failed("a@x.org", error), failed("b@x.org", error)])

    assert (caught.value.status, caught.value.outcome_unknown) == (
        error.status,
        error.outcome_unknown,
    )
