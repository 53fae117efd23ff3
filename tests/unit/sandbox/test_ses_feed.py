"""The SES stand-in's event records (``sandbox.ses_feed``): each fate the sandbox plays at SES
has its records, a message's ``Send`` comes first and names every recipient."""

from __future__ import annotations

import pytest

from sandbox.events import Outcome, outcome_at
from sandbox.ses_feed import CODE, STEPS, SesMessage, event_records

PREFIXES = {
    Outcome.DELIVERED: "ann", Outcome.BOUNCE: "bounce", Outcome.DEFER: "defer",
    Outcome.COMPLAINT: "complaint", Outcome.DROP: "drop", Outcome.UNSUBSCRIBE: "unsub",
    Outcome.OPEN: "open", Outcome.SENDGRID_DROP: "sgdrop", Outcome.SENDGRID_DEFER: "sgdefer",
    Outcome.EARLY_DROP: "sgmgdrop",
}  # fmt: skip


@pytest.mark.parametrize("outcome", list(Outcome))
def test_every_fate_has_its_records_at_ses(outcome: Outcome) -> None:
    address = f"{PREFIXES[outcome]}@example.org"
    message = SesMessage("m-1", "shop@example.com", "Hi", (address,), {}, 0.0)

    records = event_records(message, 1.0)

    assert outcome_at(CODE, address) in STEPS
    assert records[0]["eventType"] == "Send"
    assert len(records) == 1 + len(STEPS[outcome_at(CODE, address)])


def test_fates_other_providers_play_are_deliveries_at_ses() -> None:
    for prefix in ("sgdrop", "sgdefer", "sgmgdrop"):
        message = SesMessage("m-1", "s@example.com", "Hi", (f"{prefix}@x.org",), {}, 0.0)
        assert [r["eventType"] for r in event_records(message, 1.0)] == ["Send", "Delivery"]


def test_a_shared_message_s_send_names_every_recipient_once() -> None:
    to = ("a@x.org", "b@x.org", "bounce@x.org")
    records = event_records(SesMessage("m-1", "s@x.org", "Hi", to, {}, 0.0), 1.0)

    assert [r["eventType"] for r in records] == ["Send", "Delivery", "Delivery", "Bounce"]
    assert records[0]["mail"]["destination"] == list(to)
