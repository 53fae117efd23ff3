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
* **Message-ID** becomes the request's idempotency key, so a client that retries after a lost
  answer gets the same batch rather than a second one.
* **Attachments** are refused (``554 5.6.1``) until batches carry them: sent without them, the
  mail would not be what the client wrote.

:class:`Refused` carries the SMTP reply for a message that cannot become a batch.
"""

from __future__ import annotations

import email.utils
from collections.abc import Sequence
from dataclasses import dataclass
from email import policy
from email.headerregistry import AddressHeader
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, Final

from shared.core.addresses import address_key
from shared.core.models import is_reserved_header

#: The longest Message-ID kept as an idempotency key (longer ones are not keys: no key).
MAX_MESSAGE_ID: Final = 200


class Refused(Exception):
    """The message cannot become a batch; ``reply`` is the SMTP answer (code and text)."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.reply = reply


@dataclass(frozen=True, slots=True)
class Submission:
    """The batch a message becomes: the request body and its idempotency key (if any)."""

    body: dict[str, Any]
    idempotency_key: str | None


def batch_of(raw: bytes, recipients: Sequence[str]) -> Submission:
    """The ``POST /v1/batches`` body of the message ``raw`` sent to ``recipients``."""
    message = BytesParser(policy=policy.default).parsebytes(raw)
    if not isinstance(message, EmailMessage):  # pragma: no cover - policy.default makes one
        raise Refused("554 5.6.0 the message cannot be read")
    if _has_attachment(message):
        raise Refused("554 5.6.1 attachments are not supported yet: link to the file instead")
    body: dict[str, Any] = {"from": _sender(message)}
    reply_to = _addresses(message, "Reply-To")
    if reply_to:
        body["reply_to"] = _formatted(reply_to[0])
    body["subject"] = str(message.get("Subject", "") or "")
    text, html = _part(message, "plain"), _part(message, "html")
    if text is None and html is None:
        raise Refused("554 5.6.0 the message has no text/plain or text/html body")
    if text is not None:
        body["text"] = text
    if html is not None:
        body["html"] = html
    body.update(_envelope(message, recipients))
    headers = _headers(message)
    if headers:
        body["headers"] = headers
    return Submission(body, _idempotency_key(message))


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
    name, spec = address
    return f"{name} <{spec}>" if name else spec


def _part(message: EmailMessage, subtype: str) -> str | None:
    part = message.get_body(preferencelist=(subtype,))
    if part is None or part.get_content_type() != f"text/{subtype}":
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError) as exc:  # an unknown charset, a broken encoding
        raise Refused(f"554 5.6.3 the text/{subtype} body cannot be decoded ({exc})") from exc
    return content if isinstance(content, str) else None


def _has_attachment(message: EmailMessage) -> bool:
    """Whether a part is a file: named as one, or of a type that is not text."""
    for part in message.walk():
        if part.is_multipart() or part is message:
            continue
        named = part.get_content_disposition() in ("attachment", "inline") and part.get_filename()
        if named or part.get_content_maintype() != "text":
            return True
    return False


def _headers(message: EmailMessage) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in message.items():
        if name.lower().startswith("x-") and not is_reserved_header(name):
            kept.setdefault(name, " ".join(str(value).split()))
    return kept


def _idempotency_key(message: EmailMessage) -> str | None:
    value = message.get("Message-ID")
    if value is None:
        return None
    found = email.utils.unquote(str(value).strip()).strip("<>")
    if not found or len(found) > MAX_MESSAGE_ID or not all("!" <= c <= "~" for c in found):
        return None  # the API takes 1-255 visible ASCII characters
    return f"smtp:{found}"
