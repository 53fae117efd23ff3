"""SendGrid: the v3 Mail Send payload, built with the official ``sendgrid`` helpers, and the
adapter that posts it to ``{base_url}/v3/mail/send``.

Payload (:func:`build_payload`, pure):

* ``bulk`` -- one personalization per recipient: ``to`` is that recipient (with their name),
  ``substitutions`` are theirs, ``custom_args`` are ``batch_id``, ``chunk``, ``sd_attempt`` (the
  attempt's tag, so events and the Email Activity API name the attempt) and ``log_id``.
* shared -- ONE personalization whose ``to`` holds every recipient of the chunk, so they all
  see one message, as the original did; ``custom_args`` are ``batch_id``, ``chunk`` and
  ``sd_attempt`` (webhooks find the log by batch and address) and ``substitutions`` are only
  those the recipients share. cc/bcc ride on it for chunk 0 only (rules in
  ``shared.providers.envelope``).
* ``content`` is text/plain first, then text/html, as SendGrid requires; custom ``headers``,
  ``reply_to`` and the first 10 ``categories`` (SendGrid's limit) are top-level. Metadata is
  not sent (see envelope).

The ``sendgrid`` package is synchronous (urllib underneath), so :class:`SendGridProvider` runs
payload building and the request in its own bounded thread pool: the event loop never blocks,
and a slow SendGrid cannot starve asyncio's default executor, which DNS lookups also use.
The ``timeout`` applies to each socket operation (connect, each read), as urllib does it.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
import urllib.error
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import python_http_client.exceptions
import sendgrid
from sendgrid.helpers.mail import (
    Bcc,
    Category,
    Cc,
    Content,
    CustomArg,
    From,
    Header,
    Mail,
    MimeType,
    Personalization,
    ReplyTo,
    Substitution,
    To,
)
from sendgrid.helpers.mail.exceptions import ApiKeyIncludedException

from shared.addresses import address_key
from shared.config import ProviderSettings
from shared.errors import (
    PermanentProviderError,
    ProviderError,
    ProviderMisconfigured,
    TransientProviderError,
)
from shared.models import ATTEMPT_ARG, Chunk, Recipient
from shared.providers import envelope, responses
from shared.providers.base import LookupQuery, Receipt

#: Our code for SendGrid in routing keys and errors.
CODE = "sg"
#: Recipients (to+cc+bcc) and personalizations SendGrid accepts in one request.
MAX_RECIPIENTS = 1000
#: Categories SendGrid accepts per message; extra ones are dropped.
MAX_CATEGORIES = 10
#: Concurrent requests per adapter; more chunks wait for a free thread.
DEFAULT_WORKERS = 8
#: Most messages one Email Activity answer may list (an attempt has at most 1,000 recipients).
ACTIVITY_LIMIT = 1000


def build_payload(chunk: Chunk) -> dict[str, Any]:
    """The v3 Mail Send JSON body for ``chunk``; raises PermanentProviderError if unsendable."""
    envelope.check_chunk(CODE, chunk, MAX_RECIPIENTS)
    message = chunk.message
    mail = Mail(from_email=_email(From, message.sender.email, message.sender.name))
    mail.subject = message.subject
    try:
        # add_content keeps text/plain ahead of text/html whatever the order of the calls.
        if message.text:
            mail.add_content(Content(MimeType.text, message.text))
        if message.html:
            mail.add_content(Content(MimeType.html, message.html))
    except ApiKeyIncludedException as exc:
        raise PermanentProviderError(CODE, "the content contains a SendGrid API key") from exc
    if message.reply_to:
        mail.reply_to = _email(ReplyTo, message.reply_to.email, message.reply_to.name)
    for name, value in message.headers.items():
        mail.add_header(Header(name, value))
    # add_category inserts at the front; adding in reverse keeps the caller's order.
    for category in reversed(message.categories[:MAX_CATEGORIES]):
        mail.add_category(Category(category))
    for index, personalization in enumerate(_personalizations(chunk)):
        # The default index=0 inserts at the front, which would reverse the recipients.
        mail.add_personalization(personalization, index=index)
    payload: dict[str, Any] = mail.get()
    return payload


def _personalizations(chunk: Chunk) -> list[Any]:
    ids = {"batch_id": str(chunk.batch_id), "chunk": str(chunk.index)}
    if chunk.attempt:
        ids[ATTEMPT_ARG] = chunk.attempt
    if chunk.message.bulk:
        return [
            _personalization([r], r.substitutions, {**ids, "log_id": str(r.log_id)})
            for r in chunk.recipients
        ]
    shared = _personalization(
        chunk.recipients, envelope.shared_substitutions(chunk.recipients), ids
    )
    cc, bcc = envelope.copies(chunk)
    for address in cc:
        shared.add_cc(_email(Cc, address.email, address.name))
    for address in bcc:
        shared.add_bcc(_email(Bcc, address.email, address.name))
    return [shared]


class _Personalization(Personalization):  # type: ignore[misc]  # sendgrid is untyped
    """The helper's Personalization with linear de-duplication of ``to``.

    The helper compares every pair of addresses each time ``tos`` is read: 24 ms of CPU for
    one 1,000-recipient personalization. Same rule (case-insensitive, first one wins), O(n).
    """

    @property
    def tos(self) -> list[dict[str, str]]:
        seen: set[str] = set()
        unique = []
        for to in self._tos:
            key = address_key(to["email"])
            if key not in seen:
                seen.add(key)
                unique.append(to)
        return unique


def _personalization(
    recipients: Sequence[Recipient],
    substitutions: dict[str, str],
    custom_args: dict[str, str],
) -> Any:
    personalization = _Personalization()
    for recipient in recipients:
        personalization.add_to(_email(To, recipient.email, recipient.name))
    for key, value in substitutions.items():
        personalization.add_substitution(Substitution(key, value))
    for key, value in custom_args.items():
        personalization.add_custom_arg(CustomArg(key, value))
    return personalization


def _email(kind: Any, address: str, name: str | None) -> Any:
    # Set the parts directly: the constructor would re-parse a bare address with rfc822 rules.
    email = kind()
    email.email = address
    email.name = name or None
    return email


def _translate(exc: Exception, timeout: float) -> ProviderError:
    """Our error for an exception raised by the sendgrid library or urllib.

    What matters is whether SendGrid can have received the whole request: urllib wraps every
    error while connecting or writing the request in ``URLError`` (nothing was accepted: a
    clean failure); anything raised later, while reading the answer (a timeout, a reset, a
    truncated response), means SendGrid may have accepted it (the outcome is unknown).
    """
    if isinstance(exc, python_http_client.exceptions.HTTPError):
        headers = responses.lower_headers(exc.headers.items() if exc.headers else ())
        body = exc.body if isinstance(exc.body, bytes) else b""
        error = responses.classify(CODE, exc.status_code, body, headers, now=time.time())
        return error or TransientProviderError(CODE, f"HTTP {exc.status_code}")
    if isinstance(exc, urllib.error.URLError):
        return TransientProviderError(CODE, f"could not reach SendGrid: {exc.reason}")
    if isinstance(exc, TimeoutError):
        return TransientProviderError(
            CODE,
            f"no response within {timeout:g}s (the provider may have accepted the chunk)",
            outcome_unknown=True,
        )
    if isinstance(exc, OSError | http.client.HTTPException):
        return TransientProviderError(
            CODE,
            f"connection lost after the request was sent ({exc!r}); the provider may have "
            "accepted the chunk",
            outcome_unknown=True,
        )
    # urllib raises ValueError for a URL it cannot use: the base URL setting is wrong.
    return ProviderMisconfigured(CODE, f"cannot use the SendGrid base URL: {exc}")


class SendGridProvider:
    """Sends chunks through SendGrid's v3 Mail Send API."""

    code: str = CODE
    name: str = "SendGrid"
    max_recipients: int = MAX_RECIPIENTS

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str,
        timeout: float,
        max_workers: int = DEFAULT_WORKERS,
    ) -> None:
        self._timeout = timeout
        self._client = sendgrid.SendGridAPIClient(api_key=api_key, host=base_url.rstrip("/"))
        # The client is built without a timeout and copies this attribute into every request.
        self._client.client.timeout = timeout
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="sendgrid")
        # python_http_client's DEBUG records print our Authorization header and every address.
        logging.getLogger("python_http_client.client").setLevel(logging.INFO)

    @classmethod
    def from_settings(cls, settings: ProviderSettings) -> SendGridProvider:
        return cls(
            api_key=settings.sendgrid_api_key.get_secret_value(),
            base_url=settings.sendgrid_base_url,
            timeout=settings.timeout,
        )

    async def send(self, chunk: Chunk) -> Receipt:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._send_blocking, chunk)

    async def aclose(self) -> None:
        # Waits for requests in flight (each bounded by the timeout) without blocking the loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        """Recipients of the attempt in the Email Activity Feed; None without the add-on."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._lookup_blocking, query)

    async def lookup_available(self) -> bool:
        """Whether the account can use the Email Activity API (its add-on is bought)."""
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(self._executor, self._activity, "", 1)
        return found is not None

    def _lookup_blocking(self, query: LookupQuery) -> frozenset[str] | None:
        clauses = [
            f"(unique_args['batch_id']=\"{query.batch_id}\")",
            f"(unique_args['chunk']=\"{query.chunk}\")",
            f"(unique_args['{ATTEMPT_ARG}']=\"{query.tag}\")",
        ]
        messages = self._activity(" AND ".join(clauses), ACTIVITY_LIMIT)
        if messages is None:
            return None
        found = {address_key(str(m.get("to_email", ""))) for m in messages if isinstance(m, dict)}
        return frozenset(found & query.emails)

    def _activity(self, query: str, limit: int) -> list[Any] | None:
        """``GET /v3/messages``; None when the account has no Email Activity add-on."""
        try:
            response = self._client.client.messages.get(
                query_params={"query": query, "limit": limit} if query else {"limit": limit}
            )
        except python_http_client.exceptions.HTTPError as exc:
            body = exc.body if isinstance(exc.body, bytes) else b""
            if exc.status_code == 400 and b"authorization required" in body:
                return None
            raise _translate(exc, self._timeout) from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise TransientProviderError(CODE, f"Email Activity query failed: {exc!r}") from exc
        try:
            data = orjson.loads(response.body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise TransientProviderError(CODE, "Email Activity answered no JSON") from exc
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list):
            raise TransientProviderError(CODE, "Email Activity answer has no messages list")
        return messages

    def _send_blocking(self, chunk: Chunk) -> Receipt:
        payload = build_payload(chunk)
        try:
            response = self._client.send(payload)
        except (
            python_http_client.exceptions.HTTPError,
            OSError,
            http.client.HTTPException,
            ValueError,
        ) as exc:
            raise _translate(exc, self._timeout) from exc
        message_id = response.headers.get("X-Message-Id") if response.headers else None
        return Receipt(provider=CODE, status=response.status_code, message_id=message_id or None)
