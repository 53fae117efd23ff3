"""Mailgun ``event-data`` into normalised events: every mapping row, correlation ids and odd
fields. Events come from the sandbox's own builders or the docs' sample."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from shared.core.webhook_events import ProviderEvent
from shared.providers.mailgun_events import parse_envelope, parse_event, verify_signature
from tests.unit.providers.fakes import BATCH_ID, recipient
from tests.unit.webhooks.fixtures import (
    MAILGUN_DOCS_EVENT,
    MAILGUN_ID,
    MG_SIGNING_KEY,
    NOW,
    bulk_chunk,
    mailgun_body,
    mailgun_event_data,
    mailgun_failure,
    shared_chunk,
)

RECEIVED = datetime(2030, 1, 1, tzinfo=UTC)


def sandbox(address: str) -> list[ProviderEvent]:
    """The parsed events the sandbox posts for ``address`` sent in a bulk chunk, each one
    through a signed envelope."""
    parsed = []
    for data in mailgun_event_data(bulk_chunk(address), address):
        envelope = parse_envelope(mailgun_body(data))
        assert verify_signature(
            MG_SIGNING_KEY, envelope.timestamp, envelope.token, envelope.signature
        )
        event = parse_event(envelope.event_data)
        assert event is not None
        parsed.append(event)
    return parsed


def one(data: dict[str, Any]) -> ProviderEvent:
    """The event parsed from ``data``, which must name a recipient."""
    event = parse_event(data, received_at=RECEIVED)
    assert event is not None
    return event


# -- the docs sample --------------------------------------------------------------------------


def test_docs_suppress_bounce_sample() -> None:
    """The docs' failed/permanent/suppress-bounce is a recipient-side drop that suppresses."""
    event = one(MAILGUN_DOCS_EVENT)

    assert event.provider == "mg"
    assert event.event_id == "pl271FzxTTmGRW8Uj3dUWw:1529701969.818328"
    assert (event.kind, event.raw_event) == ("dropped", "failed/permanent/suppress-bounce")
    assert event.email == "joan@example.com"
    assert event.occurred_at == datetime(2018, 6, 22, 21, 12, 49, 818328, tzinfo=UTC)
    assert event.message_id == "20180622211249.1.2A6098970A380E12@example.org"
    assert event.reason == "605 Not delivering to previously bounced address"
    assert (event.suppress, event.provider_side, event.final) == (True, False, True)


def test_docs_sample_garbage_batch_id_is_none() -> None:
    """The sample's batch_id "b-123" is no UUID: None, not a crash."""
    event = one(MAILGUN_DOCS_EVENT)

    assert (event.batch_id, event.chunk, event.log_id) == (None, None, None)


# -- every row, as the sandbox posts it -------------------------------------------------------


def test_delivered_is_sent_then_delivered() -> None:
    """accepted -> sent, delivered -> delivered."""
    events = sandbox("ann@example.org")

    assert [(e.kind, e.raw_event) for e in events] == [
        ("sent", "accepted"),
        ("delivered", "delivered"),
    ]
    assert not any(e.suppress or e.provider_side for e in events)
    assert events[1].reason is None


def test_bulk_events_carry_all_correlation_ids() -> None:
    """v:batch_id, v:chunk and the expanded v:log_id come back in user-variables."""
    ann = recipient("ann@example.org")
    sent = bulk_chunk("ann@example.org", "bob@example.org", index=5)

    events = [one(data) for data in mailgun_event_data(sent, "ann@example.org")]

    assert {(e.batch_id, e.chunk, e.log_id) for e in events} == {(BATCH_ID, 5, ann.log_id)}


def test_shared_events_have_no_log_id() -> None:
    """A shared message sends batch_id and chunk only; log_id is None."""
    sent = shared_chunk("a@x.org", "b@x.org")

    events = [one(data) for data in mailgun_event_data(sent, "b@x.org")]

    assert {(e.email, e.batch_id, e.chunk, e.log_id) for e in events} == {
        ("b@x.org", BATCH_ID, 2, None)
    }


def test_message_id_matches_the_send_response() -> None:
    """message.headers.message-id is the send response's id without angle brackets."""
    assert {e.message_id for e in sandbox("ann@example.org")} == {MAILGUN_ID.strip("<>")}


def test_event_ids_combine_id_and_timestamp() -> None:
    """The dedupe key is the event id plus its timestamp (ids repeat across days)."""
    data = mailgun_event_data(bulk_chunk("ann@example.org"), "ann@example.org")[0]

    assert one(data).event_id == f"{data['id']}:{data['timestamp']:.6f}"


def test_occurred_at_keeps_sub_seconds() -> None:
    """occurred_at is the event's float timestamp, microseconds included."""
    first = sandbox("ann@example.org")[0]

    assert first.occurred_at == datetime.fromtimestamp(NOW + 0.25, UTC)


def test_hard_bounce_suppresses() -> None:
    """failed/permanent/bounce -> bounced, recipient-side, with the SMTP answer."""
    bounce = sandbox("bounce@example.org")[-1]

    assert (bounce.kind, bounce.raw_event) == ("bounced", "failed/permanent/bounce")
    assert (bounce.suppress, bounce.provider_side, bounce.final) == (True, False, True)
    assert bounce.reason == ("550 5.1.1 The email account that you tried to reach does not exist.")


def test_temporary_failure_is_deferred() -> None:
    """failed/temporary -> deferred with the delivery status; no failover by itself."""
    deferred = sandbox("defer@example.org")[-1]

    assert (deferred.kind, deferred.raw_event) == ("deferred", "failed/temporary/generic")
    assert deferred.reason == "451 4.7.1 Please try again later"
    assert (deferred.suppress, deferred.provider_side) == (False, False)


def test_suppress_bounce_from_the_sandbox() -> None:
    """The sandbox's drop@ is failed/permanent/suppress-bounce: dropped, suppress."""
    dropped = sandbox("drop@example.org")[-1]

    assert (dropped.kind, dropped.suppress, dropped.provider_side) == ("dropped", True, False)


def test_sgdrop_is_delivered_by_mailgun() -> None:
    """The sandbox's sgdrop@ fails on SendGrid only: Mailgun delivers it."""
    assert [e.kind for e in sandbox("sgdrop@example.org")] == ["sent", "delivered"]


def test_complaint_suppresses() -> None:
    """complained -> complained, suppress."""
    complaint = sandbox("complaint@example.org")[-1]

    assert (complaint.kind, complaint.suppress) == ("complained", True)


def test_unsubscribe_suppresses() -> None:
    """unsubscribed -> unsubscribed, suppress."""
    unsubscribed = sandbox("unsub@example.org")[-1]

    assert (unsubscribed.kind, unsubscribed.suppress) == ("unsubscribed", True)


def test_open_is_engagement() -> None:
    """opened -> opened, not final."""
    opened = sandbox("open@example.org")[-1]

    assert (opened.kind, opened.final, opened.url) == ("opened", False, None)


# -- rows the sandbox does not post -----------------------------------------------------------


@pytest.mark.parametrize("reason", ["suppress-unsubscribe", "suppress-complaint"])
def test_other_suppressions_are_recipient_side_drops(reason: str) -> None:
    """failed/permanent/suppress-* -> dropped, suppress, no failover."""
    event = one(mailgun_failure(reason=reason, **{"delivery-status": {"code": 605}}))

    assert (event.kind, event.suppress, event.provider_side) == ("dropped", True, False)
    assert event.reason == "605"


def test_permanent_failure_without_reason_is_a_bounce() -> None:
    """failed/permanent without a reason -> bounced."""
    event = one(mailgun_failure(reason=None))

    assert (event.kind, event.raw_event, event.suppress) == ("bounced", "failed/permanent", True)
    assert event.reason == "550 5.1.1 No such user"


def test_generic_failure_with_5xx_is_a_bounce() -> None:
    """failed/permanent/generic with a 5xx code -> bounced."""
    event = one(mailgun_failure(reason="generic"))

    assert (event.kind, event.suppress) == ("bounced", True)


def test_delayed_bounce_is_a_bounce() -> None:
    """A delayed bounce (flags.is-delayed-bounce) -> bounced, whatever its reason."""
    event = one(
        mailgun_failure(
            reason="generic",
            flags={"is-delayed-bounce": True},
            **{"delivery-status": {"code": 0, "description": "bounced after delivery"}},
        )
    )

    assert (event.kind, event.suppress) == ("bounced", True)
    assert event.reason == "0 bounced after delivery"


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ("old", {"code": 550, "message": "too old"}),
        ("old", {}),
        ("generic", {"code": 421, "message": "try later"}),
        ("generic", None),
        ("espblock", {"code": True}),
    ],
)
def test_other_permanent_failures_are_provider_side(
    reason: str, status: dict[str, Any] | None
) -> None:
    """Mailgun giving up (old), generic failures without a 5xx, and others fail over."""
    event = one(mailgun_failure(reason=reason, **{"delivery-status": status}))

    assert (event.kind, event.suppress, event.provider_side) == ("dropped", False, True)
    assert event.raw_event == f"failed/permanent/{reason}"


def test_reason_falls_back_to_mailgun_reason() -> None:
    """Without a delivery status, the reason is Mailgun's own reason word."""
    event = one(mailgun_failure(reason="old", **{"delivery-status": None}))

    assert event.reason == "old"


def test_rejected_is_a_provider_side_drop() -> None:
    """rejected -> dropped by the provider, with its explanation."""
    event = one(
        {
            "event": "rejected",
            "recipient": "a@x.com",
            "timestamp": NOW,
            "reject": {"reason": "sandbox", "description": "Sandbox subdomains are for test"},
        }
    )

    assert (event.kind, event.raw_event) == ("dropped", "rejected")
    assert (event.suppress, event.provider_side) == (False, True)
    assert event.reason == "Sandbox subdomains are for test"


def test_rejected_without_details_has_no_reason() -> None:
    """A rejected event without a reject object has no reason."""
    assert one({"event": "rejected", "recipient": "a@x.com"}).reason is None


def test_clicked_keeps_its_url() -> None:
    """clicked -> clicked with its link."""
    event = one({"event": "clicked", "recipient": "a@x.com", "url": "https://x.com/a"})

    assert (event.kind, event.url) == ("clicked", "https://x.com/a")


@pytest.mark.parametrize(("name", "raw"), [("stored", "stored"), (None, "")])
def test_other_events_are_unknown(name: str | None, raw: str) -> None:
    """Events we do not interpret, or without a name, are unknown."""
    event = one({"event": name, "recipient": "a@x.com"})

    assert (event.kind, event.raw_event) == ("unknown", raw)


# -- fields -----------------------------------------------------------------------------------


def test_no_recipient_is_none() -> None:
    """An event without a recipient is not an event about anyone."""
    assert parse_event({"event": "delivered", "id": "x", "timestamp": NOW}) is None


def test_email_is_lower_cased() -> None:
    """The recipient address is lower-cased."""
    assert one(mailgun_failure(recipient="Ann@Example.ORG")).email == "ann@example.org"


def test_chunk_parsed_as_json_number() -> None:
    """Mailgun may hand back a numeric v: value as a number; it is read as the index."""
    event = one(mailgun_failure(**{"user-variables": {"batch_id": str(BATCH_ID), "chunk": 3}}))

    assert (event.batch_id, event.chunk) == (BATCH_ID, 3)


@pytest.mark.parametrize("variables", [None, "batch_id=x", [1], {"chunk": "x", "log_id": 5}])
def test_missing_or_garbage_user_variables(variables: object) -> None:
    """Absent or ill-formed user-variables give None ids, not a crash."""
    event = one(mailgun_failure(**{"user-variables": variables}))

    assert (event.batch_id, event.chunk, event.log_id) == (None, None, None)


def test_missing_id_uses_a_content_key() -> None:
    """Without an id, the dedupe key comes from the content: a replay dedupes."""
    first = one(mailgun_failure(id=None))

    assert first.event_id.startswith("sha256:")
    assert first.event_id == one(mailgun_failure(id=None)).event_id


def test_missing_timestamp_uses_a_content_key_and_received_at() -> None:
    """Without a timestamp, the key comes from the content and the time from received_at."""
    event = one(mailgun_failure(timestamp=None))

    assert event.event_id.startswith("sha256:")
    assert event.occurred_at == RECEIVED


def test_missing_timestamp_defaults_to_now() -> None:
    """Without received_at either, the fallback is the current time."""
    before = datetime.now(UTC)

    event = parse_event(mailgun_failure(timestamp="later"))

    assert event is not None
    assert before <= event.occurred_at <= datetime.now(UTC)


@pytest.mark.parametrize(
    "message",
    [None, {"headers": None}, {"headers": {"message-id": 5}}, {"headers": {"message-id": "<>"}}],
)
def test_missing_message_id_is_none(message: object) -> None:
    """A missing, ill-typed or empty message-id gives None."""
    assert one(mailgun_failure(message=message)).message_id is None
