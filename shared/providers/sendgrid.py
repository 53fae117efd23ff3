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

The ``sendgrid`` package builds the payload (its helpers, pure CPU, run in a worker thread);
the request goes over an ``httpx.AsyncClient`` (the package's own client is synchronous
urllib), so the event loop never waits on SendGrid, and failures mean the same as for every
other provider (``shared.providers.transport``). The ``timeout`` applies to connecting, to
writing and to each read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson
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
from shared.errors import PermanentProviderError, ProviderError, TransientProviderError
from shared.gil import CpuLane
from shared.models import ATTEMPT_ARG, Chunk, Recipient
from shared.providers import envelope, responses, transport
from shared.providers.base import Gate, LookupQuery, Receipt
from shared.providers.catalog import CATALOG

#: Our code for SendGrid in routing keys and errors.
CODE = "sg"
#: What one request may carry (``shared.providers.catalog``).
INFO = CATALOG[CODE]
MAX_RECIPIENTS = INFO.max_recipients
#: Categories SendGrid accepts per message; extra ones are dropped.
MAX_CATEGORIES = INFO.max_tags
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
            _personalization(
                [r], r.substitutions, {**ids, "log_id": str(r.log_id)}, headers=r.headers
            )
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
    *,
    headers: Mapping[str, str] | None = None,
) -> Any:
    personalization = _Personalization()
    for recipient in recipients:
        personalization.add_to(_email(To, recipient.email, recipient.name))
    for key, value in substitutions.items():
        personalization.add_substitution(Substitution(key, value))
    for key, value in custom_args.items():
        personalization.add_custom_arg(CustomArg(key, value))
    for name, value in (headers or {}).items():
        personalization.add_header(Header(name, value))
    return personalization


def _email(kind: Any, address: str, name: str | None) -> Any:
    # Set the parts directly: the constructor would re-parse a bare address with rfc822 rules.
    email = kind()
    email.email = address
    email.name = name or None
    return email


class SendGridProvider:
    """Sends chunks through SendGrid's v3 Mail Send API."""

    code: str = CODE
    name: str = INFO.name
    max_recipients: int = MAX_RECIPIENTS

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str,
        timeout: float,
        client: httpx.AsyncClient | None = None,
        cpu: CpuLane | None = None,
    ) -> None:
        """Args:
        client: an HTTP client to use instead of our own; the caller keeps ownership and
            closes it (``aclose`` leaves it open). Auth and timeout are set per request.
        cpu: the process's CPU lane, where payloads are built (default: one of its own).
        """
        root = base_url.rstrip("/")
        self._send_url = f"{root}/v3/mail/send"
        self._messages_url = f"{root}/v3/messages"
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._seconds = timeout
        self._timeout = httpx.Timeout(timeout)
        self._owns_client = client is None
        self._cpu = cpu or CpuLane()
        self._calls = transport.Calls()
        self._client = client or httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)

    @classmethod
    def from_settings(
        cls, settings: ProviderSettings, cpu: CpuLane | None = None
    ) -> SendGridProvider:
        return cls(
            api_key=settings.sendgrid_api_key.get_secret_value(),
            base_url=settings.sendgrid_base_url,
            timeout=settings.timeout,
            cpu=cpu,
        )

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        # The helpers build a 1,000-recipient payload in up to ~8 ms of CPU: off the loop.
        body = await self._cpu.run(encoded_payload, chunk)
        if gate is not None:
            await gate()
        try:
            with self._calls:
                response = await self._client.post(
                    self._send_url,
                    content=body,
                    headers={**self._headers, "Content-Type": "application/json"},
                    timeout=self._timeout,
                )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise transport.translate(CODE, self.name, exc, self._seconds) from exc
        error = _classify(response)
        if error:
            raise error
        message_id = response.headers.get("X-Message-Id")
        return Receipt(provider=CODE, status=response.status_code, message_id=message_id or None)

    async def aclose(self) -> None:
        """Close, once the requests in flight have ended (each within the timeout)."""
        await self._calls.drained(2 * self._seconds + 5)
        if self._owns_client:
            await self._client.aclose()

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        """Recipients of the attempt in the Email Activity Feed; None without the add-on.

        One request whatever the account's traffic: SendGrid filters on our custom args, so
        the answer lists only the attempt's messages (one per recipient, at most 1,000, the
        most one answer may list). An answer that is full yet lacks some of the recipients
        may have been cut short, so it raises ``TransientProviderError`` instead of
        concluding."""
        clauses = [
            f"(unique_args['batch_id']=\"{query.batch_id}\")",
            f"(unique_args['chunk']=\"{query.chunk}\")",
            f"(unique_args['{ATTEMPT_ARG}']=\"{query.tag}\")",
        ]
        messages = await self._activity(" AND ".join(clauses), ACTIVITY_LIMIT)
        if messages is None:
            return None
        found = {address_key(str(m.get("to_email", ""))) for m in messages if isinstance(m, dict)}
        if len(messages) >= ACTIVITY_LIMIT and not query.emails <= found:
            raise TransientProviderError(
                CODE,
                f"Email Activity listed {len(messages)} messages for the attempt, its most, "
                "without all of its recipients: the answer may be cut short",
            )
        return frozenset(found & query.emails)

    async def lookup_available(self) -> bool:
        """Whether the account can use the Email Activity API (its add-on is bought)."""
        return await self._activity("", 1) is not None

    async def _activity(self, query: str, limit: int) -> list[Any] | None:
        """``GET /v3/messages``; None when the account has no Email Activity add-on."""
        params: dict[str, str | int] = {"limit": limit}
        if query:
            params["query"] = query
        try:
            response = await self._client.get(
                self._messages_url, params=params, headers=self._headers, timeout=self._timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise TransientProviderError(CODE, f"Email Activity query failed: {exc!r}") from exc
        if response.status_code == 400 and b"authorization required" in response.content:
            return None
        error = _classify(response)
        if error:
            raise error
        try:
            data = orjson.loads(response.content or b"{}")
        except orjson.JSONDecodeError as exc:
            raise TransientProviderError(CODE, "Email Activity answered no JSON") from exc
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list):
            raise TransientProviderError(CODE, "Email Activity answer has no messages list")
        return messages


def encoded_payload(chunk: Chunk) -> bytes:
    """The Mail Send body for ``chunk``, as JSON bytes."""
    return orjson.dumps(build_payload(chunk))


def _classify(response: httpx.Response) -> ProviderError | None:
    headers = responses.lower_headers(response.headers.items())
    return responses.classify(
        CODE, response.status_code, response.content, headers, now=time.time()
    )
