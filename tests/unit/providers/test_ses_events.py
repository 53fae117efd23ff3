"""Amazon SES's event feed (``shared.providers.ses_events``): the SNS envelope, SNS's
signature over its documented string, where a certificate may come from, and the SES records
mapped to our events, one per recipient."""

from __future__ import annotations

import base64
import functools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from shared.core.webhook_events import MalformedPayload
from shared.providers.ses_events import (
    SnsEnvelope,
    cert_url_allowed,
    parse_envelope,
    parse_events,
    signing_key,
    string_to_sign,
    subscribe_url_allowed,
    tag_value,
    topic_allowed,
    verify_signature,
)

TOPIC = "arn:aws:sns:eu-west-1:123456789012:ses-events"
CERT_URL = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem"


def _key_and_cert() -> tuple[rsa.RSAPrivateKey, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


@functools.cache
def _pair() -> tuple[rsa.RSAPrivateKey, bytes]:
    """The test's signing key and certificate (made once, on first use)."""
    return _key_and_cert()


def _cert() -> bytes:
    return _pair()[1]


def _signed(
    fields: dict[str, str], version: str = "2", key: rsa.RSAPrivateKey | None = None
) -> bytes:
    """An SNS body as SNS makes it: the documented string, signed with ``key``."""
    key = key or _pair()[0]
    names = (
        ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
        if fields["Type"] == "Notification"
        else ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
    )
    data = "".join(f"{n}\n{fields[n]}\n" for n in names if n in fields).encode()
    algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()  # noqa: S303
    signature = key.sign(data, padding.PKCS1v15(), algorithm)
    return orjson.dumps(
        {
            **fields,
            "SignatureVersion": version,
            "Signature": base64.b64encode(signature).decode(),
            "SigningCertURL": CERT_URL,
            "UnsubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=Unsubscribe",
        }
    )


def _notification(record: dict[str, Any], **extra: str) -> dict[str, str]:
    return {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": TOPIC,
        "Message": orjson.dumps(record).decode(),
        "Timestamp": "2026-11-30T10:00:00.000Z",
        **extra,
    }


BATCH = uuid.uuid1()
LOG = uuid.uuid1()


def _mail(*destination: str) -> dict[str, Any]:
    return {
        "timestamp": "2026-11-30T09:59:58.000Z",
        "messageId": "0100018c-ses-id",
        "destination": list(destination),
        "tags": {
            "batch_id": [str(BATCH)],
            "chunk": ["3"],
            "log_id": [str(LOG)],
            "sd_attempt": [tag_value("c.2")],
            "ses:configuration-set": ["safedelivr"],
        },
    }


def _events(record: dict[str, Any]) -> list[Any]:
    return list(parse_events(parse_envelope(_signed(_notification(record)))).events)


# -- signature ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_notification_signed_by_the_certificate_verifies(version: str) -> None:
    envelope = parse_envelope(_signed(_notification({"eventType": "Send"}, Subject="s"), version))
    key = signing_key(_cert())
    assert key is not None and verify_signature(envelope, key)


def test_the_string_to_sign_is_the_documented_key_value_lines() -> None:
    fields = _notification({"eventType": "Send"})
    envelope = parse_envelope(_signed(fields))
    assert (
        string_to_sign(envelope)
        == (
            f"Message\n{fields['Message']}\nMessageId\n{fields['MessageId']}\n"
            f"Timestamp\n{fields['Timestamp']}\nTopicArn\n{TOPIC}\nType\nNotification\n"
        ).encode()
    )


def test_a_subscription_confirmation_signs_its_token_and_url() -> None:
    fields = {
        "Type": "SubscriptionConfirmation",
        "MessageId": str(uuid.uuid4()),
        "Token": "2336412f37",
        "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe to the topic",
        "SubscribeURL": "https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=2336412f37",
        "Timestamp": "2026-11-30T10:00:00.000Z",
    }
    envelope = parse_envelope(_signed(fields))
    key = signing_key(_cert())
    assert key is not None and verify_signature(envelope, key)
    assert envelope.subscribe_url == fields["SubscribeURL"]


@pytest.mark.parametrize("field", ["Message", "MessageId", "Timestamp", "TopicArn", "Subject"])
def test_one_changed_field_fails_the_signature(field: str) -> None:
    body = orjson.loads(_signed(_notification({"eventType": "Send"}, Subject="s")))
    body[field] += "x"
    key = signing_key(_cert())
    assert key is not None and not verify_signature(parse_envelope(orjson.dumps(body)), key)


def test_another_key_s_signature_fails() -> None:
    other, _ = _key_and_cert()
    envelope = parse_envelope(_signed(_notification({"eventType": "Send"}), key=other))
    key = signing_key(_cert())
    assert key is not None and not verify_signature(envelope, key)


def test_an_unknown_signature_version_fails() -> None:
    body = orjson.loads(_signed(_notification({"eventType": "Send"})))
    body["SignatureVersion"] = "3"
    key = signing_key(_cert())
    assert key is not None and not verify_signature(parse_envelope(orjson.dumps(body)), key)


def test_a_certificate_that_is_not_one_gives_no_key() -> None:
    assert signing_key(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n") is None


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        (CERT_URL, True),
        ("http://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.eu-west-1.amazonaws.com.evil.org/SimpleNotificationService-abc.pem", False),
        ("https://evil.org/sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://user@sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.eu-west-1.amazonaws.com:8443/SimpleNotificationService-abc.pem", False),
        ("https://sns.s3.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.s3-eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem", False),
        ("https://sns.eu-west-1.amazonaws.com/other.pem", False),
        ("https://sns.eu-west-1.amazonaws.com:99999/SimpleNotificationService-abc.pem", False),
        ("not a url", False),
    ],
)
def test_a_certificate_comes_only_from_sns_of_the_topic_s_region(url: str, allowed: bool) -> None:
    assert cert_url_allowed(url, TOPIC) is allowed


def test_a_china_region_topic_takes_its_own_sns_host() -> None:
    topic = "arn:aws-cn:sns:cn-north-1:123456789012:ses-events"
    url = "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem"
    assert cert_url_allowed(url, topic)


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://sns.eu-west-1.amazonaws.com/?Action=ConfirmSubscription&Token=2336", True),
        ("https://sns.eu-west-1.amazonaws.com/?Action=Publish&Token=2336", False),
        ("https://sns.eu-west-1.amazonaws.com/x?Action=ConfirmSubscription", False),
        ("https://169.254.169.254/?Action=ConfirmSubscription", False),
    ],
)
def test_a_subscription_is_confirmed_only_at_sns_own_action(url: str, allowed: bool) -> None:
    assert subscribe_url_allowed(url, TOPIC) is allowed


def test_only_the_operator_s_topics_are_heard() -> None:
    envelope = parse_envelope(_signed(_notification({"eventType": "Send"})))
    assert topic_allowed(envelope, {TOPIC})
    assert not topic_allowed(envelope, {"arn:aws:sns:eu-west-1:999999999999:theirs"})


# -- envelope -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b'{"Type": "Other"}', b"{", orjson.dumps({"Type": "Notification"})],
    ids=["empty", "array", "type", "json", "fields"],
)
def test_a_body_that_is_not_an_sns_envelope_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPayload):
        parse_envelope(body)


def test_a_signature_that_is_not_base64_is_malformed() -> None:
    body = orjson.loads(_signed(_notification({"eventType": "Send"})))
    body["Signature"] = "not base64!"
    with pytest.raises(MalformedPayload):
        parse_envelope(orjson.dumps(body))


# -- events ---------------------------------------------------------------------------------------


def test_a_send_event_is_sent_with_our_ids_read_back_from_the_tags() -> None:
    (event,) = _events({"eventType": "Send", "mail": _mail("Ann@Example.org"), "send": {}})
    assert (event.provider, event.kind, event.email) == ("ses", "sent", "ann@example.org")
    assert (event.batch_id, event.chunk, event.log_id, event.attempt) == (BATCH, 3, LOG, "c.2")
    assert event.message_id == "0100018c-ses-id"
    assert event.occurred_at == datetime(2026, 11, 30, 9, 59, 58, tzinfo=UTC)


def test_a_delivery_names_each_recipient_delivered() -> None:
    record = {
        "eventType": "Delivery",
        "mail": _mail("a@x.org", "b@x.org"),
        "delivery": {
            "timestamp": "2026-11-30T10:00:01.500Z",
            "recipients": ["a@x.org", "b@x.org"],
            "smtpResponse": "250 ok",
        },
    }
    events = _events(record)
    assert [(e.email, e.kind) for e in events] == [
        ("a@x.org", "delivered"),
        ("b@x.org", "delivered"),
    ]
    assert events[0].occurred_at == datetime(2026, 11, 30, 10, 0, 1, 500000, tzinfo=UTC)
    assert events[0].event_id != events[1].event_id


@pytest.mark.parametrize(
    ("bounce_type", "subtype", "kind", "provider_side", "suppress"),
    [
        ("Permanent", "General", "bounced", False, True),
        ("Permanent", "NoEmail", "bounced", False, True),
        ("Permanent", "Suppressed", "dropped", False, True),
        ("Permanent", "OnAccountSuppressionList", "dropped", False, True),
        ("Transient", "MailboxFull", "dropped", True, False),
        ("Undetermined", "Undetermined", "dropped", True, False),
    ],
)
def test_a_bounce_is_classified_by_its_type(
    bounce_type: str, subtype: str, kind: str, provider_side: bool, suppress: bool
) -> None:
    record = {
        "eventType": "Bounce",
        "mail": _mail("jane@example.com"),
        "bounce": {
            "bounceType": bounce_type,
            "bounceSubType": subtype,
            "bouncedRecipients": [
                {"emailAddress": "jane@example.com", "status": "5.1.1",
                 "diagnosticCode": "smtp; 550 5.1.1 user unknown"}
            ],
            "timestamp": "2026-11-30T10:00:02Z",
        },
    }  # fmt: skip
    (event,) = _events(record)
    assert (event.kind, event.provider_side, event.suppress) == (kind, provider_side, suppress)
    assert event.reason == "smtp; 550 5.1.1 user unknown"


def test_an_older_feedback_notification_is_read_too() -> None:
    record = {
        "notificationType": "Complaint",
        "mail": _mail("jane@example.com"),
        "complaint": {"complainedRecipients": [{"emailAddress": "jane@example.com"}],
                      "complaintFeedbackType": "abuse"},
    }  # fmt: skip
    (event,) = _events(record)
    assert (event.kind, event.suppress, event.reason) == ("complained", True, "abuse")


def test_an_open_of_a_shared_copy_names_nobody_and_is_skipped() -> None:
    envelope = parse_envelope(
        _signed(_notification({"eventType": "Open", "mail": _mail("a@x.org", "b@x.org")}))
    )
    result = parse_events(envelope)
    assert (result.events, result.skipped) == ((), 2)


def test_a_click_of_a_personal_copy_keeps_its_link() -> None:
    click = {"link": "https://example.org/a", "timestamp": "2026-11-30T10:01:00Z"}
    record = {"eventType": "Click", "mail": _mail("a@x.org"), "click": click}
    (event,) = _events(record)
    assert (event.kind, event.url) == ("clicked", "https://example.org/a")


@pytest.mark.parametrize(
    ("event_type", "kind", "provider_side", "suppress"),
    [
        ("Reject", "dropped", False, False),
        ("Rendering Failure", "dropped", True, False),
        ("DeliveryDelay", "deferred", False, False),
        ("Subscription", "unsubscribed", False, True),
        ("SomethingNew", "unknown", False, False),
    ],
)
def test_the_other_events_map_as_the_table_says(
    event_type: str, kind: str, provider_side: bool, suppress: bool
) -> None:
    detail = (
        {"delayedRecipients": [{"emailAddress": "a@x.org"}]}
        if event_type == "DeliveryDelay"
        else {}
    )
    key = {"Rendering Failure": "failure", "DeliveryDelay": "deliveryDelay"}.get(
        event_type, event_type.lower()
    )
    (event,) = _events({"eventType": event_type, "mail": _mail("a@x.org"), key: detail})
    assert (event.kind, event.provider_side, event.suppress) == (kind, provider_side, suppress)


def test_the_same_notification_redelivered_has_the_same_event_ids() -> None:
    body = _signed(_notification({"eventType": "Delivery", "mail": _mail("a@x.org"),
                                  "delivery": {"recipients": ["a@x.org"]}}))  # fmt: skip
    first = parse_events(parse_envelope(body)).events
    again = parse_events(parse_envelope(body)).events
    assert [e.event_id for e in first] == [e.event_id for e in again]


def test_a_record_without_times_happens_when_sns_published_it_whenever_it_arrives() -> None:
    mail = {k: v for k, v in _mail("a@x.org").items() if k != "timestamp"}
    envelope = parse_envelope(_signed(_notification({"eventType": "Send", "mail": mail})))
    first = parse_events(envelope, received_at=datetime(2026, 11, 30, 11, tzinfo=UTC)).events
    again = parse_events(envelope, received_at=datetime(2026, 11, 30, 12, tzinfo=UTC)).events

    assert [e.occurred_at for e in first] == [datetime(2026, 11, 30, 10, tzinfo=UTC)]
    assert [e.occurred_at for e in again] == [e.occurred_at for e in first]


def test_a_message_that_is_no_ses_record_is_malformed() -> None:
    for message in ("not json", "[]", "{}"):
        envelope = parse_envelope(_signed({**_notification({}), "Message": message}))
        with pytest.raises(MalformedPayload):
            parse_events(envelope)


def test_odd_fields_are_skipped_not_fatal() -> None:
    record = {"eventType": "Delivery", "mail": {"tags": "x", "destination": 3},
              "delivery": {"recipients": ["a@x.org", 7, "no-at-sign"]}}  # fmt: skip
    result = parse_events(parse_envelope(_signed(_notification(record))))
    assert ([e.email for e in result.events], result.skipped) == (["a@x.org"], 2)
    assert result.events[0].batch_id is None


def test_an_envelope_is_plain_data() -> None:
    envelope = parse_envelope(_signed(_notification({"eventType": "Send"})))
    assert isinstance(envelope, SnsEnvelope) and envelope.topic_arn == TOPIC
