"""Amazon SES (API v2): the ``SendEmail`` requests a chunk becomes, their SigV4 signature, and
what SES's answers mean (pure; the adapter that sends them comes with per-recipient receipts).

Requests (:func:`build_calls`), each ``POST {base_url}/v2/email/outbound-emails`` with JSON:

* shared (``message.bulk`` false) -- one call: ``Destination.ToAddresses`` lists every
  recipient of the chunk, cc/bcc ride on chunk 0 only (``shared.providers.envelope``), and the
  substitutions every recipient shares are applied to subject, text and html;
* bulk -- one call per recipient, with its own substitutions and its own headers (its
  ``List-Unsubscribe`` token). ``SendBulkEmail`` is not used: its entries cannot carry headers
  of their own, and it would need our substitutions rewritten into SES's template syntax.

``Content.Simple`` carries the subject, the text and html bodies and our headers. Correlation
rides in ``EmailTags`` (``batch_id``, ``chunk``, the attempt tag, and ``log_id`` on a personal
copy), which SES publishes with every event through the configuration set
(``shared.providers.ses_events``). Tag values allow only ``[A-Za-z0-9_-]``: the attempt tag
``c.3`` travels as ``c-3``; categories become ``category`` tags with other characters replaced
by ``_``.

Signing (:func:`signed_headers`) is botocore's SigV4 for service ``ses`` over the exact body
sent; the adapter sends those headers with ``httpx``, so transport errors mean what they mean
for every provider (``shared.providers.transport``).

Answers (:func:`classify`): SES names its error in ``x-amzn-ErrorType`` (or the body's
``__type``/``code``), and the name decides, not only the status:

====================================================  ==========================  ============
SES error                                             ours                        why
====================================================  ==========================  ============
TooManyRequests, LimitExceeded, Throttling            TransientProviderError      a rate or
                                                                                  quota: later
AccountSuspended, SendingPaused,                      ProviderMisconfigured       the account
MailFromDomainNotVerified, NotFound (configuration                                cannot send;
set), AccessDenied, SignatureDoesNotMatch,                                        the next
InvalidClientTokenId, UnrecognizedClient                                          provider may
MessageRejected, BadRequest                           PermanentProviderError      the message
other answers                                         as ``shared.providers.responses``
====================================================  ==========================  ============
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shared.core.addresses import address_key
from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.core.models import ATTEMPT_ARG, Chunk, Recipient
from shared.core.substitution import Substitution
from shared.providers import envelope, responses
from shared.providers.ses_events import CODE, tag_value

#: Recipients (to + cc + bcc) one ``SendEmail`` may carry.
MAX_RECIPIENTS: Final = 50
#: Message tags one ``SendEmail`` may carry.
MAX_TAGS: Final = 50
#: Where ``SendEmail`` is, below the base URL.
SEND_PATH: Final = "/v2/email/outbound-emails"

_TAG_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_THROTTLED: Final = frozenset({"TooManyRequestsException", "LimitExceededException",
                               "ThrottlingException", "Throttling"})  # fmt: skip
_MISCONFIGURED: Final = frozenset({
    "AccountSuspendedException", "SendingPausedException",
    "MailFromDomainNotVerifiedException", "NotFoundException", "AccessDeniedException",
    "AccessDenied", "SignatureDoesNotMatch", "InvalidClientTokenId", "UnrecognizedClientException",
    "IncompleteSignature", "MissingAuthenticationToken",
})  # fmt: skip
_REFUSED: Final = frozenset({"MessageRejected", "BadRequestException"})


@dataclass(frozen=True, slots=True)
class SesCall:
    """One ``SendEmail``: the recipients it names (lower-cased) and its JSON body."""

    recipients: tuple[str, ...]
    body: bytes


def build_calls(chunk: Chunk, configuration_set: str | None = None) -> list[SesCall]:
    """The ``SendEmail`` calls of ``chunk``; raises PermanentProviderError if unsendable."""
    envelope.check_chunk(CODE, chunk, MAX_RECIPIENTS)
    message = chunk.message
    base = _common(chunk, configuration_set)
    if not message.bulk:
        cc, bcc = envelope.copies(chunk)
        texts = Substitution(envelope.shared_substitutions(chunk.recipients))
        tos = _unique(chunk.recipients)
        destination: dict[str, Any] = {"ToAddresses": [_address(r.email, r.name) for r in tos]}
        if cc:
            destination["CcAddresses"] = [_address(a.email, a.name) for a in cc]
        if bcc:
            destination["BccAddresses"] = [_address(a.email, a.name) for a in bcc]
        body = {**base, "Destination": destination, "Content": _content(chunk, texts, {})}
        return [SesCall(tuple(address_key(r.email) for r in tos), orjson.dumps(body))]
    calls = []
    for recipient in _unique(chunk.recipients):
        texts = Substitution(recipient.substitutions)
        tags = [*base["EmailTags"], _tag("log_id", str(recipient.log_id))]
        body = {
            **base,
            "EmailTags": tags[:MAX_TAGS],
            "Destination": {"ToAddresses": [_address(recipient.email, recipient.name)]},
            "Content": _content(chunk, texts, recipient.headers),
        }
        calls.append(SesCall((address_key(recipient.email),), orjson.dumps(body)))
    return calls


def signed_headers(
    url: str,
    body: bytes,
    *,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None = None,
) -> dict[str, str]:
    """The headers that sign ``POST url`` with ``body`` (SigV4, service ``ses``), to send as
    they are: ``Host`` is among those signed, so the URL must not change after."""
    request = AWSRequest(
        method="POST", url=url, data=body, headers={"Content-Type": "application/json"}
    )
    credentials = Credentials(access_key_id, secret_access_key, session_token)
    SigV4Auth(credentials, "ses", region).add_auth(request)
    return {name: str(value) for name, value in request.headers.items()}


def classify(
    status: int, body: bytes, headers: Mapping[str, str], *, now: float
) -> ProviderError | None:
    """The error an SES answer means, or None when SES accepted the call; ``headers`` have
    lower-case names (``responses.lower_headers``)."""
    if 200 <= status < 300:
        return None
    kind = error_type(body, headers)
    said = responses.describe(status, body)
    message = responses.truncate(f"{said} ({kind})") if kind else said
    if kind in _THROTTLED:
        delay = responses.retry_after(headers, now=now)
        return TransientProviderError(CODE, message, status=status, retry_after=delay)
    if kind in _MISCONFIGURED:
        return ProviderMisconfigured(CODE, message, status=status)
    if kind in _REFUSED:
        return PermanentProviderError(CODE, message, status=status)
    found = responses.classify(CODE, status, body, headers, now=now)
    if found is None or not kind:
        return found
    # Judged by its status as any provider's answer, named as SES named it.
    return type(found)(
        CODE,
        message,
        status=found.status,
        retry_after=found.retry_after,
        outcome_unknown=found.outcome_unknown,
    )


def error_type(body: bytes, headers: Mapping[str, str]) -> str | None:
    """SES's name for its error: ``x-amzn-ErrorType`` (before any ``:``), else the body's
    ``__type`` or ``code`` (after any ``#``)."""
    value = headers.get("x-amzn-errortype", "")
    if not value:
        try:
            data = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            found = data.get("__type") or data.get("code") or data.get("Code")
            value = found if isinstance(found, str) else ""
    name = value.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name[:100] or None


def message_id(body: bytes) -> str | None:
    """The ``MessageId`` of an accepted ``SendEmail`` (None when the answer has none)."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None
    found = data.get("MessageId") if isinstance(data, dict) else None
    return found[:500] if isinstance(found, str) and found else None


def _common(chunk: Chunk, configuration_set: str | None) -> dict[str, Any]:
    message = chunk.message
    tags = [_tag("batch_id", str(chunk.batch_id)), _tag("chunk", str(chunk.index))]
    if chunk.attempt:
        tags.append(_tag(ATTEMPT_ARG, tag_value(chunk.attempt)))
    room = MAX_TAGS - len(tags) - 1  # one left for a personal copy's log_id
    tags += [_tag("category", c) for c in message.categories[: max(room, 0)]]
    common: dict[str, Any] = {
        "FromEmailAddress": _address(message.sender.email, message.sender.name),
        "EmailTags": tags,
    }
    if message.reply_to:
        common["ReplyToAddresses"] = [_address(message.reply_to.email, message.reply_to.name)]
    if configuration_set:
        common["ConfigurationSetName"] = configuration_set
    return common


def _content(chunk: Chunk, texts: Substitution, own_headers: Mapping[str, str]) -> dict[str, Any]:
    message = chunk.message
    body: dict[str, Any] = {}
    if message.text:
        body["Text"] = _text(texts.apply(message.text))
    if message.html:
        body["Html"] = _text(texts.apply(message.html))
    simple: dict[str, Any] = {"Subject": _text(texts.apply(message.subject)), "Body": body}
    headers = {**message.headers, **own_headers}
    if headers:
        simple["Headers"] = [{"Name": name, "Value": value} for name, value in headers.items()]
    return {"Simple": simple}


def _text(data: str) -> dict[str, str]:
    return {"Data": data, "Charset": "UTF-8"}


def _tag(name: str, value: str) -> dict[str, str]:
    return {"Name": name, "Value": _TAG_UNSAFE.sub("_", value)[:256] or "_"}


def _address(address: str, name: str | None) -> str:
    """``Name <address>``, the name MIME-encoded when it is not ASCII (as SES asks)."""
    return email.utils.formataddr((name, address), charset="utf-8") if name else address


def _unique(recipients: Sequence[Recipient]) -> list[Recipient]:
    seen: set[str] = set()
    kept = []
    for recipient in recipients:
        key = address_key(recipient.email)
        if key not in seen:
            seen.add(key)
            kept.append(recipient)
    return kept
