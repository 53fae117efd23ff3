"""Mailgun: the form fields of ``POST {base_url}/v3/{domain}/messages`` and the adapter that
posts them with an ``httpx.AsyncClient`` and basic auth ``api:<key>``.

Form (:func:`build_form`, pure, an ordered list because ``to``, ``cc``, ``h:*`` and ``o:tag``
repeat):

* ``from``, ``to``, ``cc``, ``bcc``, ``h:Reply-To`` as ``Name <email>``, quoted by
  :func:`email.utils.formataddr`; ``subject``, ``text``, ``html``; ``h:<Name>`` per custom
  header; ``o:tag`` for the first 3 categories (Mailgun's limit); ``v:batch_id``,
  ``v:chunk`` and ``v:sd_attempt`` (the attempt's tag) on every message (webhooks and the
  Events API return them as ``user-variables``).
* ``bulk`` -- Mailgun batch sending: ``recipient-variables`` maps each address to its
  ``log_id`` and substitutions, which makes Mailgun send each ``to`` its own message, and
  ``v:log_id=%recipient.log_id%`` puts the log id on each. Substitution keys in subject, text
  and html are rewritten to ``%recipient.sN%`` so the result matches SendGrid's literal
  substitutions (a recipient without a key keeps the key's text, as on SendGrid); each
  recipient's own headers (List-Unsubscribe) are ``h:<Name>=%recipient.hN%``. Every
  recipient carries a variable for every key the texts hold (and only those): a chunk whose
  variables would exceed Mailgun's largest message is refused before they are built.
* shared -- no ``recipient-variables``: one message whose To lists every recipient of the
  chunk, the intended shared semantics (Mailgun's docs warn about exactly this effect).
  Substitutions common to all recipients are applied to the text here; cc/bcc go on chunk 0
  only (see ``shared.providers.envelope``). Metadata is not sent.
* attachments -- a message with files is posted as ``multipart/form-data``
  (:func:`encoded_body`): the same fields as text parts, then one file part per attachment,
  named ``attachment``, or ``inline`` for an inline one. Mailgun makes an inline file's name
  its Content-ID (the html's ``cid:``), so an inline part is named by its ``content_id``.
  Without files the body stays urlencoded.

The response's ``id`` (``<...@domain>``) is returned without its angle brackets, matching
``message.headers.message-id`` in Mailgun's events.

Lookup (:meth:`MailgunProvider.lookup`: which recipients of an ambiguous attempt did Mailgun
accept?) reads the Events API (``GET {base_url}/v3/{domain}/events``). Its documented filters
are ``event``, ``recipient``, ``message-id``, ``from``, ``to``, ``subject``, ``tags`` and a
few more, never ``user-variables``; and the attempt cannot be an ``o:tag``, as Mailgun allows
20,000 distinct tags per domain by default and one per attempt would use them up. So the
attempt is found through its own recipients: one walk per pending address,
``event=accepted&recipient=<address>`` over the call's window (``begin``/``end``,
``ascending=yes``, ``limit=300``), following ``paging.next`` until the attempt's event shows
up (its ``user-variables`` carry our ``batch_id``, ``chunk`` and ``sd_attempt``) or a page
comes back empty, which is how Mailgun ends a range.

Cost, whatever the account's traffic: one request per pending recipient whose first page
shows the attempt's event or is empty, two for one who received only other mail in the window
(that page, then the empty one), more only for an address with over 300 ``accepted`` events
in the call's window (about 2 x timeout + 10 s); :data:`LOOKUP_CONCURRENCY` walks at a time.
At most :func:`lookup_budget` requests (2 per pending recipient plus :data:`LOOKUP_SLACK`:
2,020 for 1,000 recipients); a lookup that would need more raises ``TransientProviderError``
and concludes nothing, and the resolver looks again later.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import secrets
import string
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson

from shared.core.addresses import address_key
from shared.core.catalog import CATALOG
from shared.core.errors import PermanentProviderError, ProviderError, TransientProviderError
from shared.core.models import ATTEMPT_ARG, Chunk
from shared.core.substitution import Substitution
from shared.infra.config import ProviderSettings
from shared.infra.gil import CpuLane
from shared.providers import envelope, responses, transport
from shared.providers.base import Gate, LookupQuery, Receipt

#: Bytes a form body carries as they are (``urllib.parse``'s unreserved characters).
_ALWAYS_SAFE = frozenset(string.ascii_letters + string.digits + "_.-~")
#: Our code for Mailgun in routing keys and errors.
CODE = "mg"
#: What one request may carry (``shared.core.catalog``).
INFO = CATALOG[CODE]
MAX_RECIPIENTS = INFO.max_recipients
#: Tags Mailgun accepts per message; extra categories are dropped.
MAX_TAGS = INFO.max_tags
#: Events per page of the Events API (its maximum).
EVENTS_PAGE = 300
#: Recipients a lookup walks at once.
LOOKUP_CONCURRENCY = 4
#: Requests a lookup may make beyond two per recipient: further pages for addresses with
#: many accepted events in the window.
LOOKUP_SLACK = 20
#: Seconds added around a call's window when looking for its ``accepted`` events.
LOOKUP_MARGIN = 5.0

Form = list[tuple[str, str]]


def build_form(chunk: Chunk) -> Form:
    """The form fields for ``chunk``; raises PermanentProviderError if unsendable."""
    envelope.check_chunk(CODE, chunk, MAX_RECIPIENTS)
    message = chunk.message
    used: set[str] | None = None
    if message.bulk:
        keys = _variable_names(chunk)
        texts = Substitution({k: f"%recipient.{name}%" for k, name in keys.items()})
        used = set()
    else:
        keys = {}
        texts = Substitution(envelope.shared_substitutions(chunk.recipients))
    cc, bcc = envelope.copies(chunk)
    form: Form = [("from", format_address(message.sender.email, message.sender.name))]
    form += [("to", format_address(r.email, r.name)) for r in chunk.recipients]
    form += [("cc", format_address(a.email, a.name)) for a in cc]
    form += [("bcc", format_address(a.email, a.name)) for a in bcc]
    form.append(("subject", texts.apply(message.subject, used)))
    if message.text:
        form.append(("text", texts.apply(message.text, used)))
    if message.html:
        form.append(("html", texts.apply(message.html, used)))
    if message.reply_to:
        form.append(("h:Reply-To", format_address(message.reply_to.email, message.reply_to.name)))
    form += [(f"h:{name}", value) for name, value in message.headers.items()]
    headers = _header_names(chunk) if message.bulk else {}
    form += [(f"h:{name}", f"%recipient.{var}%") for name, var in headers.items()]
    form += [("o:tag", tag) for tag in message.categories[:MAX_TAGS]]
    form += [("v:batch_id", str(chunk.batch_id)), ("v:chunk", str(chunk.index))]
    if chunk.attempt:
        form.append((f"v:{ATTEMPT_ARG}", chunk.attempt))
    if used is not None:
        # Only keys the texts hold need a variable: every recipient carries every one of
        # them, so one per key of the chunk would be recipients x keys (10^8 for 1,000
        # recipients with 100 keys of their own).
        keys = {k: name for k, name in keys.items() if k in used}
        _check_variables_size(chunk, keys)
        form.append(("v:log_id", "%recipient.log_id%"))
        form.append(("recipient-variables", _recipient_variables(chunk, keys, headers)))
    return form


def encoded_form(chunk: Chunk) -> bytes:
    """The request body for ``chunk`` without its files: :func:`build_form`, URL-encoded."""
    return urlencode(build_form(chunk))


URLENCODED = "application/x-www-form-urlencoded"


def encoded_body(chunk: Chunk) -> tuple[bytes, str]:
    """The request body for ``chunk`` and its Content-Type: URL-encoded, or multipart when
    the message carries files (:func:`multipart`)."""
    form = build_form(chunk)
    if not chunk.message.attachments:
        return urlencode(form), URLENCODED
    files = [
        (
            "inline" if a.disposition == "inline" else "attachment",
            a.content_id if a.disposition == "inline" and a.content_id else a.filename,
            a.content_type,
            base64.b64decode(a.content),
        )
        for a in chunk.message.attachments
    ]
    return multipart(form, files)


#: A file part: the field name, its file name, its Content-Type and its bytes.
FilePart = tuple[str, str, str, bytes]


def multipart(
    form: Form, files: Sequence[FilePart], boundary: str | None = None
) -> tuple[bytes, str]:
    """``form`` and ``files`` as ``multipart/form-data`` (RFC 7578), with its Content-Type.
    Names are quoted-strings (:func:`_quoted`)."""
    boundary = boundary or secrets.token_hex(16)
    mark = f"--{boundary}".encode()
    parts: list[bytes] = []
    for name, value in form:
        parts += [
            mark,
            b'\r\nContent-Disposition: form-data; name="' + _quoted(name) + b'"\r\n\r\n',
            value.encode(),
            b"\r\n",
        ]
    for name, filename, content_type, data in files:
        parts += [
            mark,
            b'\r\nContent-Disposition: form-data; name="'
            + _quoted(name)
            + b'"; filename="'
            + _quoted(filename)
            + b'"\r\nContent-Type: '
            + content_type.encode()
            + b"\r\n\r\n",
            data,
            b"\r\n",
        ]
    parts.append(mark + b"--\r\n")
    body = b"".join(parts)
    if body.count(mark) != len(form) + len(files) + 1:  # a value holds the boundary
        return multipart(form, files)
    return body, f"multipart/form-data; boundary={boundary}"


def _quoted(name: str) -> bytes:
    """``name`` as the inside of a quoted-string (RFC 2045, which Go's and Python's form
    parsers read back): a backslash or a quote escaped. The rules let no control character
    into a file or header name."""
    return name.replace("\\", "\\\\").replace('"', '\\"').encode()


#: What each byte of a UTF-8 field becomes in a form body, as ``urllib.parse.quote_plus``
#: writes it: itself when always safe, ``+`` for a space, else ``%XX``.
_FORM_BYTES = tuple(
    chr(b) if chr(b) in _ALWAYS_SAFE else "+" if b == 0x20 else f"%{b:02X}" for b in range(256)
)


def urlencode(form: Form) -> bytes:
    """``urllib.parse.urlencode(form).encode()``, byte for byte, at about two thirds of its
    CPU: a 100-recipient bulk form is 26 kB (the content and the recipient variables), which
    the standard library quotes with a Python call per byte; here each field's bytes are
    mapped through one table."""
    quoted = _FORM_BYTES.__getitem__
    return "&".join(
        f"{''.join(map(quoted, name.encode()))}={''.join(map(quoted, value.encode()))}"
        for name, value in form
    ).encode()


def format_address(address: str, name: str | None = None) -> str:
    """``Name <email>`` with the name quoted (or RFC 2047-encoded) as needed; bare if unnamed."""
    if not name:
        return address
    try:
        return email.utils.formataddr((name, address))
    except UnicodeEncodeError:
        # formataddr insists on an ASCII address; keep its quoting of the name for SMTPUTF8 ones.
        quoted = email.utils.formataddr((name, "x@x")).removesuffix(" <x@x>")
        return f"{quoted} <{address}>"


def parse_message_id(body: bytes) -> str | None:
    """The ``id`` of a 200 response, without angle brackets; None if absent or unreadable."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str):
        return None
    return value.strip().strip("<>") or None


def _variable_names(chunk: Chunk) -> dict[str, str]:
    # Our keys may hold characters Mailgun variable names cannot ("-first-", "{{name}}").
    keys: dict[str, str] = {}
    for recipient in chunk.recipients:
        for key in recipient.substitutions:
            if key and key not in keys:
                keys[key] = f"s{len(keys)}"
    return keys


def _check_variables_size(chunk: Chunk, keys: Mapping[str, str]) -> None:
    """Raise PermanentProviderError when the substitutions' recipient variables alone would
    exceed the largest message Mailgun takes: counted, in characters (no more than their
    bytes), before the recipients x keys of them are built."""
    each = sum(len(name) + len(key) + 6 for key, name in keys.items())  # "sN":"key",
    size = each * len(chunk.recipients)
    for recipient in chunk.recipients:
        size += sum(len(v) - len(k) for k, v in recipient.substitutions.items() if k in keys)
    if size > INFO.max_message_bytes:
        raise PermanentProviderError(
            CODE,
            f"the recipients' substitution values would take {size:,} bytes, over Mailgun's "
            f"{INFO.max_message_bytes:,} per message",
        )


def _header_names(chunk: Chunk) -> dict[str, str]:
    """The recipients' own headers (List-Unsubscribe), each as a recipient variable."""
    names: dict[str, str] = {}
    for recipient in chunk.recipients:
        for name in recipient.headers:
            if name not in names:
                names[name] = f"h{len(names)}"
    return names


def _recipient_variables(chunk: Chunk, keys: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """Each recipient's variables: ``keys`` maps substitution keys, ``headers`` the names of
    the recipients' own headers, to variable names."""
    variables = {
        r.email: {
            # orjson writes a UUID as str() would, at a fraction of its cost.
            "log_id": r.log_id,
            # A key this recipient lacks keeps its own text, as SendGrid leaves it unreplaced.
            **{var: r.substitutions.get(key, key) for key, var in keys.items()},
            **{var: r.headers.get(name, "") for name, var in headers.items()},
        }
        for r in chunk.recipients
    }
    return orjson.dumps(variables).decode()


class MailgunProvider:
    """Sends chunks through Mailgun's messages API."""

    code: str = CODE
    name: str = INFO.name
    max_recipients: int = MAX_RECIPIENTS

    def __init__(
        self,
        *,
        api_key: str,
        domain: str,
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
        root = f"{base_url.rstrip('/')}/v3/{urllib.parse.quote(domain, safe='')}"
        self._url = f"{root}/messages"
        self._events_url = f"{root}/events"
        self._auth = httpx.BasicAuth("api", api_key)
        self._seconds = timeout
        self._timeout = httpx.Timeout(timeout)
        self._owns_client = client is None
        self._cpu = cpu or CpuLane()
        self._calls = transport.Calls()
        self._client = client or httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)

    @classmethod
    def from_settings(
        cls, settings: ProviderSettings, cpu: CpuLane | None = None
    ) -> MailgunProvider:
        return cls(
            api_key=settings.mailgun_api_key.get_secret_value(),
            domain=settings.mailgun_domain,
            base_url=settings.mailgun_base_url,
            timeout=settings.timeout,
            cpu=cpu,
        )

    async def send(self, chunk: Chunk, gate: Gate | None = None) -> Receipt:
        # Substitution, recipient variables and encoding take milliseconds of CPU for a
        # large chunk (seconds for a hostile one): off the loop, like SendGrid's payload.
        body, content_type = await self._cpu.run(encoded_body, chunk)
        if gate is not None:
            await gate()
        try:
            with self._calls:
                response = await self._client.post(
                    self._url,
                    content=body,
                    headers={"Content-Type": content_type},
                    auth=self._auth,
                    timeout=self._timeout,
                )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise transport.translate(CODE, self.name, exc, self._seconds) from exc
        headers = responses.lower_headers(response.headers.items())
        error = responses.classify(
            CODE, response.status_code, response.content, headers, now=time.time()
        )
        if error:
            raise error
        return Receipt(CODE, response.status_code, parse_message_id(response.content))

    async def lookup(self, query: LookupQuery) -> frozenset[str] | None:
        """Recipients of the attempt among Mailgun's ``accepted`` events, one walk of the
        call's window per pending recipient (cost in the module docstring)."""
        since = query.since.timestamp()
        window = {
            "event": "accepted",
            "begin": f"{since - LOOKUP_MARGIN:.3f}",
            "end": f"{since + 2 * self._seconds + LOOKUP_MARGIN:.3f}",
            "ascending": "yes",
            "limit": str(EVENTS_PAGE),
        }
        budget = _Budget(lookup_budget(len(query.emails)), len(query.emails))
        pending = deque(sorted(query.emails))
        found: set[str] = set()

        async def walk() -> None:
            while pending:
                address = pending.popleft()
                if await self._accepted(address, {**window, "recipient": address}, query, budget):
                    found.add(address)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(LOOKUP_CONCURRENCY, len(pending))):
                    group.create_task(walk())
        except* ProviderError as failed:
            # The first failure says why; the other walks were cancelled with it.
            raise failed.exceptions[0] from None
        return frozenset(found)

    async def _accepted(
        self, address: str, params: dict[str, str], query: LookupQuery, budget: _Budget
    ) -> bool:
        """Whether ``address``'s ``accepted`` events in the window include the attempt's."""
        url = self._events_url
        while True:
            budget.spend()
            page = await self._events_page(url, params)
            items = page.get("items")
            if not isinstance(items, list):
                raise TransientProviderError(CODE, "Events answer has no items list")
            if not items:
                return False
            if address in _matching(items, query):
                return True
            nxt = _next_page(page, self._events_url)
            if nxt is None:
                # Only an empty page ends a range: without a way on, nothing is proven.
                raise TransientProviderError(CODE, "Events page has no usable next link")
            url, params = nxt, {}

    async def lookup_available(self) -> bool:
        return True  # every Mailgun account has the Events API

    async def _events_page(self, url: str, params: dict[str, str]) -> dict[str, Any]:
        try:
            response = await self._client.get(
                url, params=params, auth=self._auth, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise TransientProviderError(CODE, f"Events query failed: {exc!r}") from exc
        error = responses.classify(
            CODE,
            response.status_code,
            response.content,
            responses.lower_headers(response.headers.items()),
            now=time.time(),
        )
        if error:
            raise TransientProviderError(CODE, f"Events query failed: {error.message}")
        try:
            data = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise TransientProviderError(CODE, "Events answered no JSON") from exc
        if not isinstance(data, dict):
            raise TransientProviderError(CODE, "Events answer is not an object")
        return data

    async def aclose(self) -> None:
        """Close, once the requests in flight have ended (each within the timeout)."""
        await self._calls.drained(2 * self._seconds + 5)
        if self._owns_client:
            await self._client.aclose()


def lookup_budget(recipients: int) -> int:
    """Most Events requests one lookup of ``recipients`` pending addresses may make."""
    return 2 * recipients + LOOKUP_SLACK


class _Budget:
    """The requests a lookup has left; spending past them raises ``TransientProviderError``."""

    def __init__(self, limit: int, recipients: int) -> None:
        self.limit = limit
        self.spent = 0
        self._recipients = recipients

    def spend(self) -> None:
        if self.spent >= self.limit:
            raise TransientProviderError(
                CODE,
                f"Events lookup reached its cap of {self.limit} requests for "
                f"{self._recipients} recipient(s) before checking every one; looking again later",
            )
        self.spent += 1


def _matching(items: list[Any], query: LookupQuery) -> set[str]:
    """Recipients of ``accepted`` events carrying this attempt's variables."""
    want = {"batch_id": str(query.batch_id), "chunk": str(query.chunk), ATTEMPT_ARG: query.tag}
    out = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        variables = item.get("user-variables")
        if not isinstance(variables, dict):
            continue
        if all(str(variables.get(k)) == v for k, v in want.items()):
            out.add(address_key(str(item.get("recipient", ""))))
    return out


def _next_page(page: dict[str, Any], events_url: str) -> str | None:
    """The ``paging.next`` URL, if it is one of this domain's event pages."""
    paging = page.get("paging")
    nxt = paging.get("next") if isinstance(paging, dict) else None
    if not isinstance(nxt, str):
        return None
    # Follow only the provider's own pages: never send our credentials elsewhere.
    return nxt if nxt.startswith(events_url + "/") else None
