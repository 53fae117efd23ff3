"""Amazon SES (API v2): the ``SendEmail`` requests a chunk becomes, their SigV4 signature,
what SES's answers mean (pure), and :class:`SesProvider`, the adapter that sends them.

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
MailFromDomainNotVerified, NotFound (configuration                                cannot send
set), AccessDenied, InvalidSignature, ExpiredToken,                               (or our key
SignatureDoesNotMatch, InvalidClientTokenId, ...                                  is wrong)
MessageRejected, BadRequest                           PermanentProviderError      the message
other answers                                         as ``shared.providers.responses``
====================================================  ==========================  ============

The adapter (:class:`SesProvider`) sends a shared chunk as its one call, answered for the whole
chunk as every provider does. A chunk of personal copies is one call per recipient, at most
``ses_concurrency`` at once, answered recipient by recipient (``Receipt.recipients``): 200 is
accepted with that call's ``MessageId``; a clean refusal is refused for now or for good as
:func:`classify` says (the account's own trouble, ``ProviderMisconfigured``, is refused for now:
another provider may take the recipient); a call that may have reached SES (a 5xx, a timeout
after sending) is unknown. When no recipient was accepted and every call failed the same way,
the chunk fails with that error, as a shared call would. SES has no query API: an unknown
outcome is settled by SES's events within the webhook window (``lookup`` is None).
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shared.core.addresses import address_key
from shared.core.catalog import CATALOG
from shared.core.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.core.models import ATTEMPT_ARG, Attachment, Chunk, Recipient
from shared.core.substitution import Substitution
from shared.infra.config import ProviderSettings
from shared.infra.gil import CpuLane
from shared.providers import envelope, responses, transport
from shared.providers.base import Gate, LookupQuery, Outcome, Receipt, RecipientAnswer
from shared.providers.ses_events import CODE, tag_value

#: What one request may carry (``shared.core.catalog``).
INFO: Final = CATALOG[CODE]
#: Recipients (to + cc + bcc) one ``SendEmail`` may carry.
MAX_RECIPIENTS: Final = INFO.max_recipients
#: Message tags one ``SendEmail`` may carry.
MAX_TAGS: Final = 50
#: Where ``SendEmail`` is, below the base URL.
SEND_PATH: Final = "/v2/email/outbound-emails"

_TAG_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")
_THROTTLED: Final = frozenset({"TooManyRequests", "LimitExceeded", "Throttling"})
#: SES v2's own names, and the signing errors every AWS API shares (v2's ``InvalidSignature``,
#: ``ExpiredToken`` and the older query APIs' ``SignatureDoesNotMatch``): ours to fix, never
#: the message's.
_MISCONFIGURED: Final = frozenset({
    "AccountSuspended", "SendingPaused", "MailFromDomainNotVerified", "NotFound",
    "AccessDenied", "InvalidSignature", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidClientTokenId", "UnrecognizedClient", "IncompleteSignature",
    "MissingAuthenticationToken",
})  # fmt: skip
_REFUSED: Final = frozenset({"MessageRejected", "BadRequest"})


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
    name = (kind or "").removesuffix("Exception")  # SES writes both forms
    if name in _THROTTLED:
        delay = responses.retry_after(headers, now=now)
        return TransientProviderError(CODE, message, status=status, retry_after=delay)
    if name in _MISCONFIGURED:
        return ProviderMisconfigured(CODE, message, status=status)
    if name in _REFUSED:
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
    if message.attachments:
        simple["Attachments"] = [_file(a) for a in message.attachments]
    return {"Simple": simple}


def _file(a: Attachment) -> dict[str, str]:
    """One file as SES v2 takes it: the base64 text as is, said to be base64 (SES's default,
    7bit, would break a binary file)."""
    entry = {
        "FileName": a.filename,
        "ContentType": a.content_type,
        "RawContent": a.content,
        "ContentDisposition": "INLINE" if a.disposition == "inline" else "ATTACHMENT",
        "ContentTransferEncoding": "BASE64",
    }
    if a.content_id:
        entry["ContentId"] = a.content_id
    return entry


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


class SesProvider:
    """Sends chunks through Amazon SES's ``SendEmail`` (API v2), signed with SigV4."""

    code: str = CODE
    name: str = INFO.name
    max_recipients: int = MAX_RECIPIENTS

    def __init__(
        self,
        *,
        region: str,
        access_key_id: str,
        secret_access_key: str,
        base_url: str,
        timeout: float,
        configuration_set: str | None = None,
        concurrency: int = 10,
        client: httpx.AsyncClient | None = None,
        cpu: CpuLane | None = None,
    ) -> None:
        """Args:
        client: an HTTP client to use instead of our own; the caller keeps ownership and
            closes it (``aclose`` leaves it open).
        cpu: the process's CPU lane, where payloads are built (default: one of its own).
        """
        self._url = f"{base_url.rstrip('/')}{SEND_PATH}"
        self._region = region
        self._key_id = access_key_id
        self._secret = secret_access_key
        self._configuration_set = configuration_set or None
        self._concurrency = concurrency
        self._seconds = timeout
        self._timeout = httpx.Timeout(timeout)
        self._owns_client = client is None
        self._cpu = cpu or CpuLane()
        self._calls = transport.Calls()
        self._client = client or httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)

    @classmethod
    def from_settings(cls, settings: ProviderSettings, cpu: CpuLane | None = None) -> SesProvider:
        return cls(
            region=settings.ses_region,
            access_key_id=settings.ses_access_key_id,
            secret_access_key=settings.ses_secret_access_key.get_secret_value(),
            base_url=settings.ses_base_url,
            timeout=settings.timeout,
            configuration_set=settings.ses_configuration_set,
            concurrency=settings.ses_concurrency,
            cpu=cpu,
        )

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        calls = await self._cpu.run(build_calls, chunk, self._configuration_set)
        if not chunk.message.bulk:
            if gate is not None:
                await gate()
            (call,) = calls
            status, found = await self._call(call)
            return Receipt(CODE, status, found)
        limit = asyncio.Semaphore(self._concurrency)

        async def one(call: SesCall) -> tuple[RecipientAnswer, ProviderError | None]:
            async with limit:
                try:
                    # A slot per call: SES's sending rate counts messages, and each personal
                    # copy is one. One the limit skips is refused for now (another provider,
                    # or a later try, takes it); all skipped is the chunk's spill-over.
                    if gate is not None:
                        await gate()
                    status, found = await self._call(call)
                except ProviderError as exc:
                    return _refusal(call.recipients[0], exc), exc
            return RecipientAnswer(call.recipients[0], "accepted", status, "", found), None

        results = await asyncio.gather(*(one(call) for call in calls))
        return receipt_of(results)

    async def _call(self, call: SesCall) -> tuple[int, str | None]:
        """One ``SendEmail``: its status and ``MessageId``; raises our error otherwise."""
        headers = signed_headers(
            self._url,
            call.body,
            region=self._region,
            access_key_id=self._key_id,
            secret_access_key=self._secret,
        )
        try:
            with self._calls:
                response = await self._client.post(
                    self._url, content=call.body, headers=headers, timeout=self._timeout
                )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise transport.translate(CODE, self.name, exc, self._seconds) from exc
        lower = responses.lower_headers(response.headers.items())
        error = classify(response.status_code, response.content, lower, now=time.time())
        if error:
            raise error
        return response.status_code, message_id(response.content)

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        return None  # SES has no query API: its events settle an unknown outcome

    async def lookup_available(self) -> bool:
        return False

    async def aclose(self) -> None:
        """Close, once the requests in flight have ended (each within the timeout)."""
        await self._calls.drained(2 * self._seconds + 5)
        if self._owns_client:
            await self._client.aclose()


def receipt_of(results: Sequence[tuple[RecipientAnswer, ProviderError | None]]) -> Receipt:
    """The receipt of a chunk of personal copies from each call's answer (and its error);
    raises the calls' error when none was accepted and all failed alike (same type, same
    ambiguity), as one call for the chunk would have."""
    answers = tuple(answer for answer, _ in results)
    errors = [error for _, error in results if error is not None]
    if errors and len(errors) == len(results):
        first = errors[0]
        if all(
            type(e) is type(first) and e.outcome_unknown == first.outcome_unknown for e in errors
        ):
            delays = [e.retry_after for e in errors if e.retry_after is not None]
            if delays and isinstance(first, TransientProviderError):
                # Its own type: every copy skipped at the rate limit is the chunk's spill-over.
                raise type(first)(
                    CODE,
                    first.message,
                    status=first.status,
                    retry_after=max(delays),
                    outcome_unknown=first.outcome_unknown,
                )
            raise first
    accepted = [a for a in answers if a.outcome == "accepted"]
    status = (accepted[0].code or 200) if accepted else 200
    return Receipt(CODE, status, accepted[0].message_id if accepted else None, recipients=answers)


def _refusal(email_address: str, error: ProviderError) -> RecipientAnswer:
    """What a failed call means for its one recipient."""
    if error.outcome_unknown:
        outcome: Outcome = "unknown"
    elif isinstance(error, PermanentProviderError):
        outcome = "refused_permanent"
    else:
        # Throttled, or the account cannot send now: another provider may take it.
        outcome = "refused_transient"
    return RecipientAnswer(email_address, outcome, error.status, error.message)
