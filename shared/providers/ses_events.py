"""Amazon SES's event feed: the SNS envelope it arrives in, SNS's signature, and the SES
event records inside, normalised.

Owns (pure; no I/O):

* :func:`parse_envelope` -- the JSON body SNS posts (``Type`` ``Notification``,
  ``SubscriptionConfirmation`` or ``UnsubscribeConfirmation``), its fields checked;
* :func:`string_to_sign` and :func:`verify_signature` -- SNS signs ``Key\\nValue\\n`` over a fixed
  list of the envelope's fields with the RSA key of a certificate it names
  (``SignatureVersion`` 1: SHA1withRSA, 2: SHA256withRSA);
* :func:`cert_url_allowed` and :func:`subscribe_url_allowed` -- where that certificate and a
  subscription's confirmation may be fetched from: SNS's own host in the topic's region
  (``https://sns.<region>.amazonaws.com[.cn]``), at SNS's certificate path or its
  ``ConfirmSubscription`` action, as AWS advises, so a forged message can name neither a
  certificate of its own (an S3 bucket called ``sns`` has a host of the same shape) nor an
  address of its choosing for us to fetch;
* :func:`topic_allowed` -- any AWS account's SNS signs validly, so only the topics the operator
  configured may confirm a subscription or report events: a stranger's topic subscribed to our
  endpoint could otherwise report bounces that suppress real addresses;
* :func:`parse_events` -- the SES event record inside a ``Notification`` (event publishing's
  ``eventType``, or the older feedback notifications' ``notificationType``) into one
  :class:`~shared.core.webhook_events.ProviderEvent` per recipient it names.

Correlation rides in ``mail.tags`` (``{name: [values]}``): ``batch_id``, ``chunk``, ``log_id``
and the attempt tag. SES tag values allow only ``[A-Za-z0-9_-]``, so the attempt tag ``c.3``
travels as ``c-3`` (:func:`tag_value`) and is read back here. Tags are published only by a
configuration set's event destination, not by identity feedback notifications.

The dedupe key is the SNS ``MessageId`` (kept across SNS's redeliveries) with the recipient,
since one notification may name several recipients.

Mapping (``provider_side`` = another provider may get through; ``suppress`` = final, and the
address joins the user's suppression list):

=========================================  ============  =============  ========
SES event                                   kind          provider_side  suppress
=========================================  ============  =============  ========
Send                                        sent
Delivery                                    delivered
DeliveryDelay                               deferred      (the service applies a deadline)
Bounce, Permanent (SES's own suppression    dropped                      yes
list: ``Suppressed``,
``OnAccountSuppressionList``)
Bounce, Permanent (any other subtype)       bounced                      yes
Bounce, Transient or Undetermined           dropped       yes
Reject (SES found a virus)                  dropped
Rendering Failure                           dropped       yes
Complaint                                   complained                   yes
Subscription                                unsubscribed                 yes
Open / Click                                opened/clicked
anything else                               unknown
=========================================  ============  =============  ========

Opens, clicks and subscription changes do not say which recipient acted: they are taken only
from a message with one recipient (our personal copies), and skipped for a shared one.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import SplitResult, parse_qs, urlsplit

import orjson
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from shared.core.models import ATTEMPT_ARG
from shared.core.webhook_events import (
    MalformedPayload,
    ParseResult,
    ProviderEvent,
    Verdict,
    build_event,
    content_id,
    parse_email,
    text,
)

#: Our code for Amazon SES.
CODE = "ses"

EnvelopeType = Literal["Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"]

_TYPES: Final = frozenset({"Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"})

#: The fields SNS signs, in the order it signs them (``Subject`` only when present).
_SIGNED_NOTIFICATION: Final = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_SIGNED_CONFIRMATION: Final = (
    "Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type",
)  # fmt: skip

#: SNS's own hosts (``sns.<region>.amazonaws.com``, ``.com.cn`` in China): the only place a
#: signing certificate or a confirmation URL may point to. A region is ``us-east-1``,
#: ``us-gov-west-1``, ``cn-north-1``...: never ``s3`` (``sns.s3.amazonaws.com`` is a bucket).
_SNS_HOST: Final = re.compile(r"sns\.([a-z]{2}(?:-[a-z]+)+-\d+)\.amazonaws\.com(?:\.cn)?")
#: SNS's signing certificates' path.
_CERT_PATH: Final = re.compile(r"/SimpleNotificationService-[0-9a-f]+\.pem")
#: A topic's ARN: ``arn:aws:sns:<region>:<account>:<name>`` (other partitions too).
_TOPIC_ARN: Final = re.compile(r"arn:aws(?:-[a-z]+)*:sns:([a-z0-9-]+):\d{12}:[\w.-]{1,256}")

#: Longest signature accepted (RSA-4096 is 512 bytes; base64 of it 684 characters).
_MAX_SIGNATURE: Final = 2048

#: Bounce subtypes meaning SES's own list holds the address (it never tried): the recipient's
#: doing, as Mailgun's ``suppress-bounce``.
_SES_SUPPRESSED: Final = frozenset({"Suppressed", "OnAccountSuppressionList"})

#: Events that do not say which recipient acted.
_ONE_READER: Final = frozenset({"Open", "Click", "Subscription"})


@dataclass(frozen=True, slots=True)
class SnsEnvelope:
    """One SNS POST: what it is, what it carries and what signs it."""

    type: EnvelopeType
    message_id: str
    topic_arn: str
    message: str
    """For a ``Notification``, the SES event record as a JSON string."""
    timestamp: str
    signature_version: str
    signature: bytes
    signing_cert_url: str
    fields: Mapping[str, str]
    """Every string field as posted (the signed string is built from these)."""

    @property
    def subscribe_url(self) -> str | None:
        """Where a ``SubscriptionConfirmation`` is confirmed (a GET)."""
        return self.fields.get("SubscribeURL")


# -- envelope and signature ---------------------------------------------------------------------


def parse_envelope(raw_body: bytes) -> SnsEnvelope:
    """The envelope of one SNS POST; raises MalformedPayload if it is not one."""
    try:
        data = orjson.loads(raw_body)
    except orjson.JSONDecodeError as exc:
        raise MalformedPayload(f"the body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MalformedPayload("the body must be a JSON object")
    fields = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
    kind = fields.get("Type")
    if kind not in _TYPES:
        raise MalformedPayload(f"'Type' must be one of {', '.join(sorted(_TYPES))}")
    signed = _SIGNED_NOTIFICATION if kind == "Notification" else _SIGNED_CONFIRMATION
    needed = [f for f in (*signed, "Signature", "SignatureVersion", "SigningCertURL")
              if f != "Subject"]  # fmt: skip
    missing = [f for f in needed if f not in fields]
    if missing:
        raise MalformedPayload(f"an SNS {kind} needs string fields: {', '.join(missing)}")
    encoded = fields["Signature"]
    if len(encoded) > _MAX_SIGNATURE:
        raise MalformedPayload("'Signature' is too long")
    try:
        signature = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedPayload("'Signature' is not base64") from exc
    return SnsEnvelope(
        type=kind,  # type: ignore[arg-type]  # checked against _TYPES above
        message_id=fields["MessageId"],
        topic_arn=fields["TopicArn"],
        message=fields["Message"],
        timestamp=fields["Timestamp"],
        signature_version=fields["SignatureVersion"],
        signature=signature,
        signing_cert_url=fields["SigningCertURL"],
        fields=fields,
    )


def string_to_sign(envelope: SnsEnvelope) -> bytes:
    """The bytes SNS signed for this envelope: ``Key\\nValue\\n`` for each signed field."""
    names = _SIGNED_NOTIFICATION if envelope.type == "Notification" else _SIGNED_CONFIRMATION
    parts = [f"{name}\n{envelope.fields[name]}\n" for name in names if name in envelope.fields]
    return "".join(parts).encode("utf-8", "surrogatepass")


def topic_allowed(envelope: SnsEnvelope, topics: Collection[str]) -> bool:
    """Whether the envelope comes from one of the operator's ``topics`` (their ARNs)."""
    return envelope.topic_arn in topics


def cert_url_allowed(url: str, topic_arn: str) -> bool:
    """Whether ``url`` is an SNS signing certificate of the topic's region, over https."""
    parts = _sns_url(url, topic_arn)
    return parts is not None and _CERT_PATH.fullmatch(parts.path) is not None and not parts.query


def subscribe_url_allowed(url: str, topic_arn: str) -> bool:
    """Whether ``url`` is SNS's ``ConfirmSubscription`` action in the topic's region."""
    parts = _sns_url(url, topic_arn)
    return (
        parts is not None
        and parts.path in ("", "/")
        and parse_qs(parts.query).get("Action") == ["ConfirmSubscription"]
    )


def _sns_url(url: str, topic_arn: str) -> SplitResult | None:
    """``url`` split, when it is https on the SNS host of the topic's region (default port,
    no user)."""
    topic = _TOPIC_ARN.fullmatch(topic_arn)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = _SNS_HOST.fullmatch(parts.hostname or "")
    if topic is None or host is None or host.group(1) != topic.group(1):
        return None
    if parts.scheme != "https" or port not in (None, 443) or parts.username is not None:
        return None
    return parts


def signing_key(pem: bytes) -> rsa.RSAPublicKey | None:
    """The RSA public key of a PEM certificate; None when it is not one."""
    try:
        key = x509.load_pem_x509_certificate(pem).public_key()
    except ValueError:
        return None
    return key if isinstance(key, rsa.RSAPublicKey) else None


def verify_signature(envelope: SnsEnvelope, key: rsa.RSAPublicKey) -> bool:
    """Whether ``key`` signed this envelope (SHA1withRSA for version 1, SHA256withRSA for 2);
    never raises."""
    if envelope.signature_version == "1":
        algorithm: hashes.HashAlgorithm = hashes.SHA1()  # noqa: S303 - SNS's version 1 is SHA1withRSA
    elif envelope.signature_version == "2":
        algorithm = hashes.SHA256()
    else:
        return False
    try:
        key.verify(envelope.signature, string_to_sign(envelope), padding.PKCS1v15(), algorithm)
    except (InvalidSignature, ValueError):
        return False
    return True


# -- events -------------------------------------------------------------------------------------


def tag_value(tag: str) -> str:
    """An attempt tag as an SES tag value (``c.3`` -> ``c-3``: values allow no dot)."""
    return tag.replace(".", "-", 1)


def parse_events(envelope: SnsEnvelope, *, received_at: datetime | None = None) -> ParseResult:
    """The events of one ``Notification``: one per recipient the SES record names; raises
    MalformedPayload when the message is not an SES record at all."""
    try:
        record = orjson.loads(envelope.message)
    except orjson.JSONDecodeError as exc:
        raise MalformedPayload(f"the SNS Message is not JSON: {exc}") from exc
    if not isinstance(record, dict):
        raise MalformedPayload("the SNS Message must be a JSON object")
    mail = _mapping(record.get("mail"))
    event = text(record.get("eventType"), limit=100) or text(
        record.get("notificationType"), limit=100
    )
    if event is None:
        raise MalformedPayload("the SNS Message has no 'eventType' or 'notificationType'")
    detail = _mapping(record.get(_detail_key(event)))
    verdict = _classify(event, detail)
    recipients = _recipients(event, detail, mail)
    ids = _ids(mail.get("tags"))
    # SNS keeps a message's Timestamp across its redeliveries: a record without times of its
    # own still happens at one moment, so a replay rewrites the same cells (never the receipt
    # time, which differs at each delivery).
    occurred = (
        _iso_time(detail.get("timestamp")) or _iso_time(mail.get("timestamp"))
        or _iso_time(envelope.timestamp) or received_at or datetime.now(UTC)
    )  # fmt: skip
    message_id = text(mail.get("messageId"), limit=500)
    url = _mapping(detail).get("link")
    events: list[ProviderEvent] = []
    skipped = 0
    for value in recipients:
        email = parse_email(value)
        if email is None:
            skipped += 1
            continue
        events.append(
            build_event(
                verdict,
                provider=CODE,
                event_id=f"{envelope.message_id}:{email}"[:400]
                if envelope.message_id
                else content_id({"record": record, "email": email}),
                email=email,
                occurred_at=occurred,
                ids=ids,
                message_id=message_id,
                url=url,
            )
        )
    return ParseResult(tuple(events), skipped)


def _detail_key(event: str) -> str:
    """The record's field for ``event``'s details (``Rendering Failure`` -> ``failure``)."""
    if event == "Rendering Failure":
        return "failure"
    if event == "DeliveryDelay":
        return "deliveryDelay"
    return event[:1].lower() + event[1:]


def _classify(event: str, detail: Mapping[str, Any]) -> Verdict:
    if event == "Send":
        return Verdict("sent", event)
    if event == "Delivery":
        return Verdict("delivered", event, text(detail.get("smtpResponse")))
    if event == "DeliveryDelay":
        why = text(detail.get("delayType"), limit=100)
        return Verdict(
            "deferred",
            f"{event}/{why}" if why else event,
            _diagnosis(detail, "delayedRecipients") or why,
        )
    if event == "Bounce":
        return _bounce(detail)
    if event == "Complaint":
        kind = text(detail.get("complaintFeedbackType"), limit=100)
        return Verdict("complained", event, kind, suppress=True)
    if event == "Reject":
        return Verdict("dropped", event, text(detail.get("reason")))
    if event == "Rendering Failure":
        return Verdict("dropped", event, text(detail.get("errorMessage")), provider_side=True)
    if event == "Open":
        return Verdict("opened", event)
    if event == "Click":
        return Verdict("clicked", event)
    if event == "Subscription":
        return Verdict("unsubscribed", event, suppress=True)
    return Verdict("unknown", event)


def _bounce(detail: Mapping[str, Any]) -> Verdict:
    kind = text(detail.get("bounceType"), limit=100)
    subtype = text(detail.get("bounceSubType"), limit=100)
    raw = "/".join(part for part in ("Bounce", kind, subtype) if part)
    why = _diagnosis(detail, "bouncedRecipients") or subtype
    if kind == "Permanent" and subtype in _SES_SUPPRESSED:
        return Verdict("dropped", raw, why, suppress=True)
    if kind == "Permanent":
        return Verdict("bounced", raw, why, suppress=True)
    return Verdict("dropped", raw, why, provider_side=True)


def _diagnosis(detail: Mapping[str, Any], field: str) -> str | None:
    """The first recipient's diagnostic code (or status) in ``detail[field]``."""
    for entry in _list(detail.get(field))[:1]:
        item = _mapping(entry)
        return text(item.get("diagnosticCode")) or text(item.get("status"), limit=100)
    return None


def _recipients(event: str, detail: Mapping[str, Any], mail: Mapping[str, Any]) -> list[object]:
    """The addresses an event is about (each entry checked by the caller)."""
    listed = {
        "Delivery": ("recipients", None),
        "Bounce": ("bouncedRecipients", "emailAddress"),
        "Complaint": ("complainedRecipients", "emailAddress"),
        "DeliveryDelay": ("delayedRecipients", "emailAddress"),
    }.get(event)
    if listed is not None:
        field, key = listed
        entries = _list(detail.get(field))
        return [_mapping(e).get(key) if key else e for e in entries]
    destination = _list(mail.get("destination"))
    if event in _ONE_READER and len(destination) != 1:
        return [None] * len(destination)  # a shared copy: who acted is not said (skipped)
    return destination


def _ids(tags: object) -> dict[str, Any]:
    """Our correlation ids from ``mail.tags`` (each tag a list of values: the first is ours)."""
    ids: dict[str, Any] = {}
    for name, values in _mapping(tags).items():
        first = _list(values)[:1]
        if first and isinstance(first[0], str):
            ids[name] = first[0]
    attempt = ids.get(ATTEMPT_ARG)
    if isinstance(attempt, str):
        ids[ATTEMPT_ARG] = attempt.replace("-", ".", 1)
    return ids


def _iso_time(value: object) -> datetime | None:
    """A UTC-aware datetime from SES's ISO 8601 timestamps (``2016-01-27T14:59:44.101Z``)."""
    stamp = text(value, limit=64)
    if stamp is None:
        return None
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
