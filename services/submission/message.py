"""A message handed over by SMTP, as the ``POST /v1/batches`` body it becomes (pure).

* **Recipients** are the envelope's (``RCPT TO``), never the headers': a Bcc is in the
  envelope only, and a header may name people the client did not send to. With one
  recipient, or when the headers name none of them (``undisclosed-recipients:;``, a newsletter),
  each gets a copy of their own. Otherwise the message is sent as written, one copy for all
  (``shared``): the envelope's addresses the To header names are ``to``, those the Cc header
  names ``cc`` (if To names none, Cc's are ``to``), and the others ``bcc``, so that nobody sees
  an address the client hid.
* **From** is the From header (one mailbox); the API refuses a domain the user has not
  verified, as for any batch. **Reply-To** is kept; **Subject**, and the first ``text/plain``
  and ``text/html`` bodies, decoded.
* **Headers**: ``X-*`` headers are kept unless the API reserves them (those that steer a
  provider); everything else is the message's own structure, which we write again.
* **Message-ID** with the envelope's recipients becomes the request's idempotency key, so a
  client that retries after a lost answer gets the same batch rather than a second one, while
  the rest of a message's recipients, sent in a second transaction after a ``452``, make a
  batch of their own. A message without a Message-ID has no such key.
* **Attachments are kept**, in order (:func:`_attachments`): a part marked ``attachment``,
  one with a Content-ID (an inline image of the html: ``inline``, its ``content_id`` the
  Content-ID without its angle brackets), and any other part that is not text (a file sent
  without a disposition). A file name is its last path component (``C:\\x\\a.pdf`` is
  ``a.pdf``); a file without one is named ``attachment-<n>`` with the extension of its type.
  The API's rules apply to them as to any batch's (count, names, total size: ``550 5.6.0``
  with the API's reason).
* **What a batch still cannot carry is refused** (``554 5.6.1``), since sent without it the
  mail would not be what the client wrote: a forwarded message (``message/*``), and a text
  part that is neither the text nor the html body nor marked as an attachment (a calendar
  invitation beside the bodies, a second text body).
* **The body** is built here, off the event loop, as the JSON bytes to post.

:class:`Refused` carries the SMTP reply for a message that cannot become a batch.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import mimetypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from email import policy
from email.headerregistry import AddressHeader
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, Final

import orjson

from shared.core.addresses import address_key
from shared.core.models import is_reserved_header

#: The longest Message-ID kept as an idempotency key (longer ones are not keys: no key).
MAX_MESSAGE_ID: Final = 200


class Refused(Exception):
    """The message cannot become a batch; ``reply`` is the SMTP answer (code and text), on one
    line of printable ASCII whatever the message carried."""

    def __init__(self, reply: str) -> None:
        reply = one_line(reply)
        super().__init__(reply)
        self.reply = reply


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as one line of printable ASCII (an SMTP reply must be one: a CR or LF in it
    would let a message write replies of its own)."""
    printable = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return printable[:limit]


@dataclass(frozen=True, slots=True)
class Submission:
    """The batch a message becomes: the request body (JSON) and its idempotency key (if any)."""

    body: bytes
    idempotency_key: str | None


def batch_of(raw: bytes, recipients: Sequence[str]) -> Submission:
    """The ``POST /v1/batches`` body of the message ``raw`` sent to ``recipients``."""
    try:
        return _batch_of(raw, recipients)
    except Refused:
        raise
    except Exception as exc:
        # The parser's own failures on hostile headers (CPython 3.11 raises IndexError for
        # ``Message-ID: <[>``): the message is unreadable.
        raise Refused("554 5.6.0 the message cannot be read") from exc


def _batch_of(raw: bytes, recipients: Sequence[str]) -> Submission:
    message = BytesParser(policy=policy.default).parsebytes(raw)
    if not isinstance(message, EmailMessage):  # pragma: no cover - policy.default makes one
        raise Refused("554 5.6.0 the message cannot be read")
    plain, html = _body_part(message, "plain"), _body_part(message, "html")
    attachments = _attachments(message, plain, html)
    body: dict[str, Any] = {"from": _sender(message)}
    reply_to = _addresses(message, "Reply-To")
    if reply_to:
        body["reply_to"] = _formatted(reply_to[0])
    body["subject"] = str(message.get("Subject", "") or "")
    text, markup = _content(plain, "plain"), _content(html, "html")
    if text is None and markup is None:
        raise Refused("554 5.6.0 the message has no text/plain or text/html body")
    if text is not None:
        body["text"] = text
    if markup is not None:
        body["html"] = markup
    body.update(_envelope(message, recipients))
    headers = _headers(message)
    if headers:
        body["headers"] = headers
    if attachments:
        body["attachments"] = attachments
    return Submission(orjson.dumps(body), _idempotency_key(message, recipients))


def _sender(message: EmailMessage) -> str:
    senders = _addresses(message, "From")
    if len(senders) != 1:
        raise Refused("550 5.1.7 the From header must name exactly one sender")
    return _formatted(senders[0])


def _envelope(message: EmailMessage, recipients: Sequence[str]) -> dict[str, Any]:
    """``to`` (and ``cc``, ``bcc``, ``shared``) from the envelope, as the module says."""
    unique = list(dict.fromkeys(address_key(r) for r in recipients))
    named_to = {address_key(a[1]) for a in _addresses(message, "To")}
    named_cc = {address_key(a[1]) for a in _addresses(message, "Cc")}
    to = [r for r in unique if r in named_to]
    cc = [r for r in unique if r in named_cc and r not in named_to]
    if len(unique) == 1 or not (to or cc):
        return {"to": unique}
    if not to:
        to, cc = cc, []
    hidden = [r for r in unique if r not in to and r not in cc]
    fields: dict[str, Any] = {"to": to, "shared": True}
    if cc:
        fields["cc"] = cc
    if hidden:
        fields["bcc"] = hidden
    return fields


def _addresses(message: EmailMessage, name: str) -> list[tuple[str, str]]:
    """``(display name, address)`` of each mailbox a header names (groups opened)."""
    found: list[tuple[str, str]] = []
    for header in message.get_all(name, []):
        if not isinstance(header, AddressHeader):
            continue
        for address in header.addresses:
            if address.addr_spec and "@" in address.addr_spec:
                found.append((address.display_name, address.addr_spec))
    return found


def _formatted(address: tuple[str, str]) -> str:
    """``"Doe, John" <a@x.org>``: the name quoted where it must be, as the API reads it."""
    name, spec = address
    return email.utils.formataddr((name, spec)) if name else spec


def _body_part(message: EmailMessage, subtype: str) -> EmailMessage | None:
    part = message.get_body(preferencelist=(subtype,))
    if part is None or part.get_content_type() != f"text/{subtype}":
        return None
    return part if isinstance(part, EmailMessage) else None


def _content(part: EmailMessage | None, subtype: str) -> str | None:
    if part is None:
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError) as exc:  # an unknown charset, a broken encoding
        # Not the exception's words: they quote the message, which may hold a CR or LF.
        raise Refused(f"554 5.6.3 the text/{subtype} body cannot be decoded") from exc
    return content if isinstance(content, str) else None


#: Why a part that a batch cannot carry refuses the message.
CANNOT_CARRY: Final = (
    "554 5.6.1 a batch carries a text and an html body and files, not {what}: "
    "send it as an attachment instead"
)
_PATH = re.compile(r"[/\\]")


def _attachments(
    message: EmailMessage, plain: EmailMessage | None, html: EmailMessage | None
) -> list[dict[str, str]]:
    """Every part other than the chosen bodies, as the batch's ``attachments`` (the module
    says which); raises Refused for a part that a batch cannot carry."""
    if not message.is_multipart():
        # A message of one part is itself the body (or has none: refused later), or a file.
        if message is plain or message is html or message.get_content_maintype() == "text":
            return []
        return [_attachment(message, 1)]
    found: list[dict[str, str]] = []
    for part in message.walk():
        if part is plain or part is html or part is message:
            continue
        if part.get_content_maintype() == "message":
            raise Refused(CANNOT_CARRY.format(what="a forwarded message"))
        if part.is_multipart() or not isinstance(part, EmailMessage):
            continue
        marked = part.get_content_disposition() == "attachment" or "Content-ID" in part
        if not marked and part.get_content_maintype() == "text":
            raise Refused(CANNOT_CARRY.format(what=f"a {part.get_content_type()} part"))
        found.append(_attachment(part, len(found) + 1))
    return found


def _attachment(part: EmailMessage, number: int) -> dict[str, str]:
    """One file part as an ``attachments`` entry."""
    content_type = part.get_content_type()
    data = part.get_payload(decode=True)
    content = data if isinstance(data, bytes) else b""
    name = part.get_filename()
    name = _PATH.split(name)[-1].strip() if name else ""
    if not name:
        name = f"attachment-{number}{mimetypes.guess_extension(content_type) or '.bin'}"
    entry = {
        "filename": name,
        "content_type": content_type,
        "content": base64.b64encode(content).decode("ascii"),
    }
    content_id = part.get("Content-ID")
    if content_id is not None and part.get_content_disposition() != "attachment":
        entry["disposition"] = "inline"
        entry["content_id"] = str(content_id).strip().strip("<>")
    return entry


def _headers(message: EmailMessage) -> dict[str, str]:
    kept: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in message.items():
        lowered = name.lower()
        if lowered.startswith("x-") and not is_reserved_header(name) and lowered not in seen:
            seen.add(lowered)  # the first of a repeated header (the API takes each name once)
            kept[name] = " ".join(str(value).split())
    return kept


def _idempotency_key(message: EmailMessage, recipients: Sequence[str]) -> str | None:
    """``smtp:<digest>`` of the Message-ID and the envelope's recipients: the same message
    to the same people again is the same batch; its other recipients, in a transaction of their
    own, another (with the Message-ID alone they would be refused as a different body)."""
    value = message.get("Message-ID")
    if value is None:
        return None
    found = email.utils.unquote(str(value).strip()).strip("<>")
    if not found or len(found) > MAX_MESSAGE_ID or not found.isascii():
        return None
    digest = hashlib.sha256(found.encode())
    for address in sorted({address_key(r) for r in recipients}):
        digest.update(b"\0" + address.encode("utf-8", "surrogateescape"))
    return f"smtp:{digest.hexdigest()}"
