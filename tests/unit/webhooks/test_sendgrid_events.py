"""SendGrid Event Webhook bodies into normalised events: every mapping row, correlation ids
and malformed input. Bodies come from the sandbox's own builders or the docs' samples."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from shared.core.webhook_events import MalformedPayload, ProviderEvent
from shared.providers.sendgrid_events import parse_events, verify_signature
from tests.unit.providers.fakes import BATCH_ID, recipient
from tests.unit.webhooks.fixtures import (
    NOW,
    SENDGRID_DOCS_BOUNCE,
    SG_PUBLIC,
    X_MESSAGE_ID,
    bulk_chunk,
    by_email,
    sendgrid_body,
    sendgrid_event,
    shared_chunk,
    sign_sendgrid,
)

RECEIVED = datetime(2030, 1, 1, tzinfo=UTC)


def sandbox(address: str) -> list[ProviderEvent]:
    """The parsed events the sandbox posts for ``address`` sent in a bulk chunk."""
    result = parse_events(sendgrid_body(bulk_chunk(address)))
    assert result.skipped == 0
    assert {e.email for e in result.events} == {address}
    return list(result.events)


def one(**fields: Any) -> ProviderEvent:
    """The single event parsed from a hand-written event with ``fields``."""
    (event,) = parse_events(orjson.dumps([sendgrid_event(**fields)]), received_at=RECEIVED).events
    return event


# -- the docs sample --------------------------------------------------------------------------


def test_docs_bounce_sample() -> None:
    """The bounce sample from SendGrid's reference is a recipient-side hard bounce."""
    (event,) = parse_events(SENDGRID_DOCS_BOUNCE).events

    assert event.provider == "sg"
    assert event.event_id == "6g4ZI7SA-xmRDv57GoPIPw=="
    assert event.kind == "bounced"
    assert event.raw_event == "bounce/bounce"
    assert event.email == "example@test.com"
    assert event.occurred_at == datetime(2017, 12, 15, 0, 59, 29, tzinfo=UTC)
    assert event.message_id == "14c5d75ce93"
    assert event.reason == "500 unknown recipient"
    assert (event.suppress, event.provider_side) == (True, False)
    assert (event.batch_id, event.chunk, event.log_id) == (None, None, None)


# -- every row, as the sandbox posts it -------------------------------------------------------


def test_delivered_is_sent_then_delivered() -> None:
    """processed -> sent, delivered -> delivered; neither suppresses nor fails over."""
    events = sandbox("ann@example.org")

    assert [(e.kind, e.raw_event) for e in events] == [
        ("sent", "processed"),
        ("delivered", "delivered"),
    ]
    assert not any(e.suppress or e.provider_side for e in events)
    assert events[1].state == "success"


def test_bulk_events_carry_all_correlation_ids() -> None:
    """Bulk custom_args come back as top-level keys: batch_id, chunk and log_id."""
    sent = bulk_chunk("ann@example.org", "bob@example.org", index=4)

    grouped = by_email(parse_events(sendgrid_body(sent)).events)

    for person in sent.recipients:
        for event in grouped[person.email]:
            assert (event.batch_id, event.chunk, event.log_id) == (BATCH_ID, 4, person.log_id)


def test_shared_events_have_no_log_id() -> None:
    """A shared message sends batch_id and chunk only; log_id is None."""
    grouped = by_email(parse_events(sendgrid_body(shared_chunk("a@x.org", "b@x.org"))).events)

    assert {(e.batch_id, e.chunk, e.log_id) for es in grouped.values() for e in es} == {
        (BATCH_ID, 2, None)
    }


def test_message_id_is_the_x_message_id() -> None:
    """sg_message_id up to its first dot is the X-Message-Id of the send response."""
    assert {e.message_id for e in sandbox("ann@example.org")} == {X_MESSAGE_ID}


def test_occurred_at_is_the_event_timestamp() -> None:
    """occurred_at is the event's own timestamp, in UTC."""
    assert {e.occurred_at for e in sandbox("ann@example.org")} == {datetime.fromtimestamp(NOW, UTC)}


def test_event_ids_are_sg_event_ids() -> None:
    """Each event's dedupe key is its own sg_event_id."""
    events = sandbox("ann@example.org")

    assert len({e.event_id for e in events}) == 2
    assert not any(e.event_id.startswith("sha256:") for e in events)


def test_hard_bounce_suppresses() -> None:
    """bounce type=bounce -> bounced, recipient-side, suppress."""
    bounce = sandbox("bounce@example.org")[-1]

    assert (bounce.kind, bounce.raw_event) == ("bounced", "bounce/bounce")
    assert (bounce.suppress, bounce.provider_side, bounce.final) == (True, False, True)
    assert bounce.reason is not None
    assert bounce.reason.startswith("550 5.1.1")


def test_deferred_is_recipient_side_with_the_response() -> None:
    """deferred -> deferred with the receiving server's response; no failover by itself."""
    deferred = sandbox("defer@example.org")[-1]

    assert deferred.kind == "deferred"
    assert deferred.reason == "451 4.7.1 Please try again later"
    assert (deferred.suppress, deferred.provider_side) == (False, False)


def test_drop_of_a_bounced_address_suppresses() -> None:
    """dropped 'Bounced Address' -> dropped, recipient-side, suppress."""
    dropped = sandbox("drop@example.org")[-1]

    assert (dropped.kind, dropped.reason) == ("dropped", "Bounced Address")
    assert (dropped.suppress, dropped.provider_side, dropped.final) == (True, False, True)


def test_sgdrop_is_a_provider_side_drop() -> None:
    """The sandbox's sgdrop@ (spam checker) -> dropped by the provider: fail over."""
    dropped = sandbox("sgdrop@example.org")[-1]

    assert dropped.kind == "dropped"
    assert dropped.reason == "Spam Content (if Spam Checker app is enabled)"
    assert (dropped.suppress, dropped.provider_side, dropped.final) == (False, True, False)


def test_spamreport_is_a_complaint() -> None:
    """spamreport -> complained, suppress."""
    complaint = sandbox("complaint@example.org")[-1]

    assert (complaint.kind, complaint.raw_event, complaint.suppress) == (
        "complained",
        "spamreport",
        True,
    )


def test_unsubscribe_suppresses() -> None:
    """unsubscribe -> unsubscribed, suppress."""
    unsubscribed = sandbox("unsub@example.org")[-1]

    assert (unsubscribed.kind, unsubscribed.suppress) == ("unsubscribed", True)


def test_open_is_engagement() -> None:
    """open -> opened, neither suppressing nor final."""
    opened = sandbox("open@example.org")[-1]

    assert (opened.kind, opened.suppress, opened.final) == ("opened", False, False)
    assert opened.url is None


# -- rows the sandbox does not post -----------------------------------------------------------


def test_blocked_bounce_is_a_provider_side_drop() -> None:
    """bounce type=blocked: the receiver blocked the provider's IP, another may get through."""
    event = one(event="bounce", type="blocked", reason="554 IP blocklisted", status="5.7.1")

    assert (event.kind, event.raw_event) == ("dropped", "bounce/blocked")
    assert (event.suppress, event.provider_side) == (False, True)
    assert event.reason == "554 IP blocklisted"


def test_expired_bounce_is_a_provider_side_drop() -> None:
    """bounce type=expired: SendGrid gave up retrying, another provider may get through."""
    event = one(event="bounce", type="expired", reason="deferred for 72 hours")

    assert (event.kind, event.raw_event, event.provider_side) == (
        "dropped",
        "bounce/expired",
        True,
    )


def test_bounce_without_type_is_a_hard_bounce() -> None:
    """A bounce with no type is a hard bounce; its status stands in for a missing reason."""
    event = one(event="bounce", status="5.1.1")

    assert (event.kind, event.raw_event, event.suppress) == ("bounced", "bounce", True)
    assert event.reason == "5.1.1"


@pytest.mark.parametrize(
    "reason",
    ["Bounced Address", "Unsubscribed Address", "Spam Reporting Address", "Invalid", "invalid"],
)
def test_drops_for_listed_addresses_suppress(reason: str) -> None:
    """Drops because the address is on a SendGrid list (or invalid) are recipient-side."""
    event = one(event="dropped", reason=reason)

    assert (event.kind, event.suppress, event.provider_side) == ("dropped", True, False)


@pytest.mark.parametrize(
    "reason",
    [
        "Spam Content (if Spam Checker app is enabled)",
        "Invalid SMTPAPI header",
        "Recipient List over Package Quota",
        None,
    ],
)
def test_other_drops_are_provider_side(reason: str | None) -> None:
    """Any other drop reason (or none) is the provider's own: fail over, keep the address."""
    event = one(event="dropped", reason=reason)

    assert (event.kind, event.suppress, event.provider_side) == ("dropped", False, True)
    assert event.reason == reason


def test_click_keeps_its_url() -> None:
    """click -> clicked with the link."""
    event = one(event="click", url="https://example.com/offer?id=1")

    assert (event.kind, event.url) == ("clicked", "https://example.com/offer?id=1")


def test_url_is_kept_for_clicks_only() -> None:
    """A url on another event is not taken as a click's link."""
    assert one(event="open", url="https://example.com").url is None


def test_group_unsubscribe_is_an_unsubscribe() -> None:
    """group_unsubscribe -> unsubscribed, suppress."""
    event = one(event="group_unsubscribe", asm_group_id=42)

    assert (event.kind, event.raw_event, event.suppress) == (
        "unsubscribed",
        "group_unsubscribe",
        True,
    )


@pytest.mark.parametrize(("name", "raw"), [("group_resubscribe", "group_resubscribe"), (7, "")])
def test_other_events_are_unknown(name: object, raw: str) -> None:
    """group_resubscribe, new event types and garbage are recorded as unknown."""
    event = one(event=name)

    assert (event.kind, event.raw_event) == ("unknown", raw)
    assert (event.suppress, event.provider_side) == (False, False)


def test_event_without_event_name_is_unknown() -> None:
    """An event with an address but no event name is kept as unknown."""
    (event,) = parse_events(b'[{"email": "a@x.com", "timestamp": 1}]').events

    assert (event.kind, event.raw_event) == ("unknown", "")


# -- fields -----------------------------------------------------------------------------------


def test_email_is_lower_cased() -> None:
    """The recipient address is lower-cased."""
    assert one(email="Ann@Example.ORG").email == "ann@example.org"


def test_correlation_ids_absent() -> None:
    """Without custom args, the correlation ids are None."""
    event = one()

    assert (event.batch_id, event.chunk, event.log_id) == (None, None, None)


def test_correlation_ids_as_strings() -> None:
    """custom_args values are strings: the chunk index parses from its digits."""
    ann = recipient("ann@example.org")
    event = one(batch_id=str(BATCH_ID), chunk="7", log_id=str(ann.log_id))

    assert (event.batch_id, event.chunk, event.log_id) == (BATCH_ID, 7, ann.log_id)


def test_garbage_correlation_ids_are_none() -> None:
    """A bad UUID or chunk becomes None instead of failing the whole delivery."""
    event = one(batch_id="b-123", chunk="seven", log_id=12)

    assert (event.batch_id, event.chunk, event.log_id) == (None, None, None)


def test_missing_sg_event_id_uses_a_content_key() -> None:
    """Without sg_event_id, the dedupe key comes from the content: a replay dedupes."""
    first = one(sg_event_id=None)
    again = one(sg_event_id=None)

    assert first.event_id.startswith("sha256:")
    assert first.event_id == again.event_id
    assert first.event_id != one(sg_event_id=None, event="open").event_id


def test_missing_timestamp_falls_back_to_received_at() -> None:
    """An event without a usable timestamp is dated when it was received."""
    assert one(timestamp="never").occurred_at == RECEIVED


def test_missing_timestamp_defaults_to_now() -> None:
    """Without received_at, the fallback is the current time."""
    before = datetime.now(UTC)

    (event,) = parse_events(orjson.dumps([sendgrid_event(timestamp=None)])).events

    assert before <= event.occurred_at <= datetime.now(UTC)


@pytest.mark.parametrize(("value", "expected"), [(None, None), (".abc", None), ("abc", "abc")])
def test_message_id_edge_cases(value: str | None, expected: str | None) -> None:
    """No sg_message_id gives None; one without a dot is taken whole."""
    assert one(sg_message_id=value).message_id == expected


# -- the body ---------------------------------------------------------------------------------


def test_events_without_an_address_are_skipped_and_counted() -> None:
    """Events with no usable email are skipped; the rest are kept in order."""
    body = orjson.dumps(
        [
            sendgrid_event(email=None),
            sendgrid_event(email="b@x.com"),
            sendgrid_event(email=["a@x.com"]),
            sendgrid_event(email="c@x.com", event="open"),
        ]
    )

    result = parse_events(body)

    assert [e.email for e in result.events] == ["b@x.com", "c@x.com"]
    assert result.skipped == 2


def test_an_empty_array_is_no_events() -> None:
    """[] is a valid, empty delivery."""
    result = parse_events(b"[]")

    assert (result.events, result.skipped) == ((), 0)


@pytest.mark.parametrize(
    "body",
    [
        orjson.dumps(sendgrid_event()),
        b"",
        b"not json",
        b"[{},",
        b'[{"email": "a@x.com"}, 3]',
        b"\xff\xfe",
    ],
)
def test_anything_but_an_array_of_objects_is_malformed(body: bytes) -> None:
    """A JSON object, non-JSON or an array with a non-object raises MalformedPayload."""
    with pytest.raises(MalformedPayload):
        parse_events(body)


def test_verify_then_parse_a_signed_delivery() -> None:
    """A signed sandbox delivery verifies and parses into every recipient's events."""
    body = sendgrid_body(bulk_chunk("ann@example.org", "bounce@example.org", "defer@example.org"))
    signature = sign_sendgrid(body)

    assert verify_signature(SG_PUBLIC, signature, str(NOW), body)
    kinds = {
        email: [e.kind for e in es] for email, es in by_email(parse_events(body).events).items()
    }
    assert kinds == {
        "ann@example.org": ["sent", "delivered"],
        "bounce@example.org": ["sent", "bounced"],
        "defer@example.org": ["sent", "deferred"],
    }
