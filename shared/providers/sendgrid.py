"""SendGrid: the v3 Mail Send payload and the adapter that posts it to
``{base_url}/v3/mail/send``.

Payload (:func:`encoded_payload`, pure; :func:`build_payload` is the same body decoded):

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
* ``attachments`` -- one entry per file: its base64 ``content`` as stored, ``filename``,
  ``type``, ``disposition`` and, for an inline one, ``content_id`` (the html's ``cid:``).

The body is built as plain dicts and encoded by orjson: what the chunk's recipients share
(ids, sender, content, headers, categories, reply-to) once, then only each recipient's own
part. It is the body the official ``sendgrid`` helpers build, field by field (the conformance
test compares them, ``tests/unit/providers/sendgrid_reference.py``), for about a tenth of
their CPU with one personalization per recipient (``python -m bench.payloads``). Large
chunks are built on the CPU lane; the request goes over an ``httpx.AsyncClient`` (the
package's own client is synchronous urllib), so the event loop never waits on SendGrid, and
failures mean the same as for every other provider (``shared.providers.transport``). The
``timeout`` applies to connecting, to writing and to each read.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from shared.core.addresses import address_key
from shared.core.catalog import CATALOG
from shared.core.errors import PermanentProviderError, ProviderError, TransientProviderError
from shared.core.models import ATTEMPT_ARG, Attachment, Chunk, Recipient
from shared.infra.config import ProviderSettings
from shared.infra.gil import CpuLane
from shared.providers import envelope, responses, transport
from shared.providers.base import Gate, LookupQuery, Receipt

#: Our code for SendGrid in routing keys and errors.
CODE = "sg"
#: What one request may carry (``shared.core.catalog``).
INFO = CATALOG[CODE]
MAX_RECIPIENTS = INFO.max_recipients
#: Categories SendGrid accepts per message; extra ones are dropped.
MAX_CATEGORIES = INFO.max_tags
#: Most messages one Email Activity answer may list (an attempt has at most 1,000 recipients).
ACTIVITY_LIMIT = 1000
#: A SendGrid API key at the start of a content (the ``sendgrid`` helpers' check, kept as is).
_API_KEY = re.compile(r"SG\.[0-9a-zA-Z]+\.[0-9a-zA-Z]+")


def build_payload(chunk: Chunk) -> dict[str, Any]:
    """The v3 Mail Send JSON body for ``chunk``, decoded: what :func:`encoded_payload` sends."""
    payload: dict[str, Any] = orjson.loads(encoded_payload(chunk))
    return payload


def encoded_payload(chunk: Chunk) -> bytes:
    """The Mail Send body for ``chunk``, as JSON bytes; raises PermanentProviderError if
    unsendable."""
    return orjson.dumps(_payload(chunk))


def _payload(chunk: Chunk) -> dict[str, Any]:
    # Made to be encoded at once: it shares the chunk's own dicts (orjson only reads them) and
    # holds log ids as UUIDs (orjson writes str(uuid) at a fraction of its cost).
    envelope.check_chunk(CODE, chunk, MAX_RECIPIENTS)
    message = chunk.message
    content = [
        {"type": kind, "value": value}
        for kind, value in (("text/plain", message.text), ("text/html", message.html))
        if value
    ]
    # The helpers refused such content (ApiKeyIncludedException); the same check, the same
    # answer, so a chunk the reference refused is refused still.
    if any(_API_KEY.match(part["value"]) for part in content):
        raise PermanentProviderError(CODE, "the content contains a SendGrid API key")
    payload: dict[str, Any] = {
        "from": _address(message.sender.email, message.sender.name),
        "subject": message.subject,
        "personalizations": _personalizations(chunk),
    }
    if content:
        payload["content"] = content
    if message.headers:
        payload["headers"] = message.headers
    if message.categories:
        payload["categories"] = list(message.categories[:MAX_CATEGORIES])
    if message.reply_to:
        payload["reply_to"] = _address(message.reply_to.email, message.reply_to.name)
    if message.attachments:
        payload["attachments"] = [_attachment(a) for a in message.attachments]
    return payload


def _attachment(attachment: Attachment) -> dict[str, str]:
    entry = {
        "content": attachment.content,
        "filename": attachment.filename,
        "type": attachment.content_type,
        "disposition": attachment.disposition,
    }
    if attachment.content_id is not None:
        entry["content_id"] = attachment.content_id
    return entry


def _personalizations(chunk: Chunk) -> list[dict[str, Any]]:
    # Everything the chunk's recipients share is computed once; the loop builds only what is
    # theirs (the helpers' objects cost several times the mail's own work per recipient).
    ids: dict[str, Any] = {"batch_id": str(chunk.batch_id), "chunk": str(chunk.index)}
    if chunk.attempt:
        ids[ATTEMPT_ARG] = chunk.attempt
    if chunk.message.bulk:
        return [_own(recipient, ids) for recipient in chunk.recipients]
    shared: dict[str, Any] = {"to": _unique(chunk.recipients)}
    cc, bcc = envelope.copies(chunk)
    if cc:
        shared["cc"] = [_address(a.email, a.name) for a in cc]
    if bcc:
        shared["bcc"] = [_address(a.email, a.name) for a in bcc]
    substitutions = envelope.shared_substitutions(chunk.recipients)
    if substitutions:
        shared["substitutions"] = substitutions
    shared["custom_args"] = ids
    return [shared]


def _own(recipient: Recipient, ids: dict[str, Any]) -> dict[str, Any]:
    """A bulk recipient's personalization: their address, substitutions, ids and headers."""
    personalization: dict[str, Any] = {"to": [_address(recipient.email, recipient.name)]}
    if recipient.substitutions:
        personalization["substitutions"] = recipient.substitutions
    personalization["custom_args"] = {**ids, "log_id": recipient.log_id}
    if recipient.headers:
        personalization["headers"] = recipient.headers
    return personalization


def _unique(recipients: Sequence[Recipient]) -> list[dict[str, str]]:
    """The ``to`` list of a shared personalization: an address once (case-insensitive, the
    first one wins), as SendGrid requires."""
    seen: set[str] = set()
    tos = []
    for recipient in recipients:
        key = address_key(recipient.email)
        if key not in seen:
            seen.add(key)
            tos.append(_address(recipient.email, recipient.name))
    return tos


def _address(address: str, name: str | None) -> dict[str, str]:
    # An empty name is no name (the API refuses an empty one).
    return {"email": address, "name": name} if name else {"email": address}


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
        # A 1,000-recipient body is a few ms of CPU: off the loop.
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


def _classify(response: httpx.Response) -> ProviderError | None:
    headers = responses.lower_headers(response.headers.items())
    return responses.classify(
        CODE, response.status_code, response.content, headers, now=time.time()
    )
