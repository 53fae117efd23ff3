"""The SES stand-in's event feed (pure): what an accepted ``SendEmail`` leaves
(:class:`SesMessage`), the SES event records SES would publish for it (``Send``,
``Delivery``, ``Bounce``...: :func:`event_records`), and the SNS messages that carry them
(:func:`notification`, :func:`subscription_confirmation`; the dispatcher signs them,
``sandbox.signing.sign_sns``).

Shapes: https://docs.aws.amazon.com/ses/latest/dg/event-publishing-retrieving-sns-contents.html
(event records) and https://docs.aws.amazon.com/sns/latest/dg/http-notification-json.html (SNS).
One ``Send`` record per message (``mail.destination`` is every recipient), then each
recipient's records by its sandbox fate at SES (``sandbox.events.outcome_at``); ``mail.tags`` holds
the request's ``EmailTags`` (each a list of values) and SES's own ``ses:*`` tags.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parseaddr
from typing import Any, Final
from urllib.parse import quote

import orjson

from sandbox.events import Outcome, outcome_at

#: SES's catalog code (the fates other providers play are deliveries here).
CODE: Final = "ses"
#: The account the sandbox's events name.
ACCOUNT_ID: Final = "000000000000"

#: Each fate's event types after ``Send``, in order.
STEPS: Final[dict[Outcome, tuple[str, ...]]] = {
    Outcome.DELIVERED: ("Delivery",),
    Outcome.BOUNCE: ("Bounce",),
    Outcome.DEFER: ("DeliveryDelay",),
    Outcome.COMPLAINT: ("Delivery", "Complaint"),
    Outcome.DROP: ("Suppressed",),
    Outcome.UNSUBSCRIBE: ("Delivery", "Subscription"),
    Outcome.OPEN: ("Delivery", "Open"),
}


@dataclass(frozen=True, slots=True)
class SesMessage:
    """An accepted ``SendEmail``: what its events need."""

    message_id: str
    source: str
    subject: str
    recipients: tuple[str, ...]
    """Every distinct recipient (lower case), to, cc then bcc."""
    tags: Mapping[str, list[str]]
    """``mail.tags`` as SES publishes them: each ``EmailTags`` entry, and SES's own."""
    accepted_at: float


def new_message_id(now: float) -> str:
    """A ``MessageId`` shaped like SES's (``0100018c…-<uuid>-000000``)."""
    return f"{int(now * 1000):016x}-{uuid.uuid4()}-000000"


def accepted(payload: Mapping[str, Any], recipients: Sequence[str], now: float) -> SesMessage:
    """What an accepted (judged) ``SendEmail`` leaves for its events."""
    tags: dict[str, list[str]] = {}
    for tag in payload.get("EmailTags") or []:
        tags.setdefault(tag["Name"], []).append(tag["Value"])
    source = parseaddr(payload["FromEmailAddress"])[1]
    if payload.get("ConfigurationSetName"):
        tags["ses:configuration-set"] = [payload["ConfigurationSetName"]]
    tags["ses:from-domain"] = [source.partition("@")[2]]
    tags["ses:caller-identity"] = ["sandbox"]
    subject = payload["Content"]["Simple"]["Subject"].get("Data", "")
    return SesMessage(new_message_id(now), source, str(subject), tuple(recipients), tags, now)


def event_records(message: SesMessage, now: float) -> list[dict[str, Any]]:
    """The SES event records of an accepted message, in order: its ``Send``, then each
    recipient's by its sandbox fate."""
    stamp = _iso(now)
    mail = {
        "timestamp": _iso(message.accepted_at),
        "source": message.source,
        "sendingAccountId": ACCOUNT_ID,
        "messageId": message.message_id,
        "destination": list(message.recipients),
        "headersTruncated": False,
        "commonHeaders": {
            "from": [message.source],
            "to": list(message.recipients[:10]),
            "messageId": message.message_id,
            "subject": message.subject,
        },
        "tags": {name: list(values) for name, values in message.tags.items()},
    }
    records: list[dict[str, Any]] = [{"eventType": "Send", "mail": mail, "send": {}}]
    for recipient in message.recipients:
        for step in STEPS[outcome_at(CODE, recipient)]:
            records.append(_record(step, recipient, mail, stamp))
    return records


def _record(step: str, recipient: str, mail: dict[str, Any], stamp: str) -> dict[str, Any]:
    feedback = f"{uuid.uuid4()}-000000"
    if step == "Delivery":
        detail = {
            "timestamp": stamp,
            "processingTimeMillis": 412,
            "recipients": [recipient],
            "smtpResponse": "250 2.6.0 Message received",
            "reportingMTA": "a8-49.smtp-out.amazonses.com",
        }
        return {"eventType": "Delivery", "mail": mail, "delivery": detail}
    if step in ("Bounce", "Suppressed"):
        suppressed = step == "Suppressed"
        detail = {
            "feedbackId": feedback,
            "bounceType": "Permanent",
            "bounceSubType": "Suppressed" if suppressed else "General",
            "bouncedRecipients": [
                {
                    "emailAddress": recipient,
                    "action": "failed",
                    "status": "5.1.1",
                    "diagnosticCode": "Amazon SES has suppressed sending to this address "
                    "because it has a recent history of bouncing as an invalid address."
                    if suppressed
                    else "smtp; 550 5.1.1 user unknown",
                }
            ],
            "timestamp": stamp,
            "reportingMTA": "dsn; a8-49.smtp-out.amazonses.com",
        }
        return {"eventType": "Bounce", "mail": mail, "bounce": detail}
    if step == "DeliveryDelay":
        detail = {
            "timestamp": stamp,
            "delayType": "TransientCommunicationFailure",
            "expirationTime": _iso(time.time() + 86_400),
            "delayedRecipients": [
                {
                    "emailAddress": recipient,
                    "status": "4.4.7",
                    "diagnosticCode": "smtp; 451 4.7.1 Please try again later",
                }
            ],
        }
        return {"eventType": "DeliveryDelay", "mail": mail, "deliveryDelay": detail}
    if step == "Complaint":
        detail = {
            "complainedRecipients": [{"emailAddress": recipient}],
            "timestamp": stamp,
            "feedbackId": feedback,
            "complaintFeedbackType": "abuse",
            "userAgent": "Sandbox Feedback Loop",
        }
        return {"eventType": "Complaint", "mail": mail, "complaint": detail}
    if step == "Open":
        detail = {"ipAddress": "203.0.113.9", "timestamp": stamp, "userAgent": "Mozilla/5.0"}
        return {"eventType": "Open", "mail": mail, "open": detail}
    detail = {
        "contactList": "safedelivr",
        "timestamp": stamp,
        "source": "UnsubscribeHeader",
        "newTopicPreferences": {"unsubscribeAll": True},
        "oldTopicPreferences": {"unsubscribeAll": False},
    }
    return {"eventType": "Subscription", "mail": mail, "subscription": detail}


def notification(record: Mapping[str, Any], topic_arn: str, now: float) -> dict[str, str]:
    """The unsigned SNS ``Notification`` carrying ``record`` (the dispatcher signs it)."""
    region = topic_arn.split(":")[3] if topic_arn.count(":") >= 5 else "us-east-1"
    return {
        "Type": "Notification",
        "MessageId": str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": orjson.dumps(record).decode(),
        "Timestamp": _iso(now),
        "SignatureVersion": "2",
        "SigningCertURL": signing_cert_url(region),
        "UnsubscribeURL": f"https://sns.{region}.amazonaws.com/?Action=Unsubscribe"
        f"&SubscriptionArn={quote(topic_arn, safe='')}:{uuid.uuid4()}",
    }


def subscription_confirmation(topic_arn: str, subscribe_base: str, now: float) -> dict[str, str]:
    """The unsigned SNS ``SubscriptionConfirmation`` whose ``SubscribeURL`` is
    ``subscribe_base`` (the sandbox's root)."""
    region = topic_arn.split(":")[3] if topic_arn.count(":") >= 5 else "us-east-1"
    token = uuid.uuid4().hex * 2
    return {
        "Type": "SubscriptionConfirmation",
        "MessageId": str(uuid.uuid4()),
        "Token": token,
        "TopicArn": topic_arn,
        "Message": f"You have chosen to subscribe to the topic {topic_arn}.\n"
        "To confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": f"{subscribe_base}?Action=ConfirmSubscription"
        f"&TopicArn={quote(topic_arn, safe='')}&Token={token}",
        "Timestamp": _iso(now),
        "SignatureVersion": "2",
        "SigningCertURL": signing_cert_url(region),
    }


def signing_cert_url(region: str) -> str:
    """Where SNS keeps its signing certificate, as a notification names it."""
    return (
        f"https://sns.{region}.amazonaws.com/SimpleNotificationService-0000000000000000000000.pem"
    )


def _iso(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
