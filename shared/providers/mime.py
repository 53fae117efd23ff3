"""The SMTP transactions of one chunk (pure): who is in the envelope and the MIME message
each one carries, for the SMTP relay adapter (``shared.providers.smtp``).

* **Shared** (not ``bulk``): one transaction; its To lists every recipient of the chunk, its
  Cc the chunk's cc (chunk 0 only, ``shared.providers.envelope.copies``), and the bcc are in
  the envelope only. The substitutions every recipient agrees on are applied.
* **Bulk**: one transaction per recipient with their own copy: their substitutions, their own
  headers (List-Unsubscribe) and their log id.
* **Headers**: ``From``, ``To``, ``Cc``, ``Reply-To``, ``Subject`` (UTF-8 as RFC 2047
  encoded words), ``Date``, ``Message-ID`` ``<{batch}.{chunk}.{tag}.{n}@{helo}>``, our
  correlation headers ``X-Safedelivr-Batch`` (batch id and chunk), ``X-Safedelivr-Attempt``
  (the attempt's tag) and ``X-Safedelivr-Log`` (the recipient's log id, one recipient only),
  then the batch's custom headers: reserved ones (``shared.core.models.is_reserved_header``)
  and the ones we write ourselves are dropped, so a sender can never replace ours.
* **Body**: ``text/plain`` then ``text/html`` as ``multipart/alternative`` (one part when
  only one is given), serialised with ``email.policy.SMTP`` (CRLF line ends). The boundary
  is derived from the bodies' digest, so the same chunk always gives the same bytes.
* **Files**: an inline file (with a Content-ID) joins the html in ``multipart/related``, any
  other is an attachment of ``multipart/mixed``; every boundary then comes from a digest of
  the bodies and the files.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email import policy
from email.headerregistry import Address as MimeAddress
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Final

from shared.core.models import Address, Attachment, Chunk, Recipient, is_reserved_header
from shared.core.substitution import Substitution
from shared.providers import envelope

#: Our correlation headers.
BATCH_HEADER: Final = "X-Safedelivr-Batch"
ATTEMPT_HEADER: Final = "X-Safedelivr-Attempt"
LOG_HEADER: Final = "X-Safedelivr-Log"
#: Headers we write ourselves (lower case): a batch's custom header of the same name is dropped.
OWN_HEADERS: Final = frozenset(
    h.lower()
    for h in (
        "From", "To", "Cc", "Bcc", "Reply-To", "Subject", "Date", "Message-ID", "MIME-Version",
        "Content-Type", "Content-Transfer-Encoding", BATCH_HEADER, ATTEMPT_HEADER, LOG_HEADER,
    )
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Transaction:
    """One SMTP transaction: MAIL FROM, the RCPT TO addresses, and the message (DATA)."""

    sender: str
    recipients: tuple[str, ...]
    """Every envelope recipient: to, cc and bcc."""
    message_id: str
    """The Message-ID, without angle brackets."""
    data: bytes
    log_id: str | None = None
    """The recipient's log id when the transaction is one recipient's own copy."""


def transactions(
    provider: str, chunk: Chunk, *, max_recipients: int, helo: str, now: datetime
) -> list[Transaction]:
    """The transactions that send ``chunk``; raises ``PermanentProviderError`` (through
    ``shared.providers.envelope.check_chunk``) when no provider should be sent it."""
    envelope.check_chunk(provider, chunk, max_recipients)
    if chunk.message.bulk:
        return [
            _transaction(chunk, (r,), (), (), r.substitutions, r.headers, helo, now, n)
            for n, r in enumerate(chunk.recipients)
        ]
    cc, bcc = envelope.copies(chunk)
    common = envelope.shared_substitutions(chunk.recipients)
    return [_transaction(chunk, chunk.recipients, cc, bcc, common, {}, helo, now, 0)]


def _transaction(
    chunk: Chunk,
    to: Sequence[Recipient],
    cc: Sequence[Address],
    bcc: Sequence[Address],
    substitutions: Mapping[str, str],
    own_headers: Mapping[str, str],
    helo: str,
    now: datetime,
    n: int,
) -> Transaction:
    message = chunk.message
    texts = Substitution(dict(substitutions))
    tag = chunk.attempt or "x"
    message_id = f"{chunk.batch_id}.{chunk.index}.{tag}.{n}@{helo}"
    log_id = str(to[0].log_id) if len(to) == 1 else None
    mail = EmailMessage(policy=policy.SMTP)
    mail["From"] = _address(message.sender.email, message.sender.name)
    mail["To"] = [_address(r.email, r.name) for r in to]
    if cc:
        mail["Cc"] = [_address(a.email, a.name) for a in cc]
    if message.reply_to:
        mail["Reply-To"] = _address(message.reply_to.email, message.reply_to.name)
    mail["Subject"] = texts.apply(message.subject)
    mail["Date"] = format_datetime(now)
    mail["Message-ID"] = f"<{message_id}>"
    mail[BATCH_HEADER] = f"{chunk.batch_id}.{chunk.index}"
    if chunk.attempt:
        mail[ATTEMPT_HEADER] = chunk.attempt
    if log_id:
        mail[LOG_HEADER] = log_id
    for name, value in (*message.headers.items(), *own_headers.items()):
        if not is_reserved_header(name) and name.lower() not in OWN_HEADERS:
            mail[name] = value
    text = texts.apply(message.text) if message.text else None
    html = texts.apply(message.html) if message.html else None
    _body(mail, text, html)
    if message.attachments:
        _files(mail, message.attachments, f"{text}\0{html}")
    addresses = [r.email for r in to] + [a.email for a in (*cc, *bcc)]
    recipients = tuple(dict.fromkeys(addresses))
    return Transaction(
        sender=message.sender.email,
        recipients=recipients,
        message_id=message_id,
        data=mail.as_bytes(policy=policy.SMTP),
        log_id=log_id,
    )


def _address(email: str, name: str | None) -> MimeAddress:
    local, _, domain = email.rpartition("@")
    return MimeAddress(display_name=name or "", username=local, domain=domain)


def _body(mail: EmailMessage, text: str | None, html: str | None) -> None:
    if html is None:
        mail.set_content(text or "")
        return
    if text is None:
        mail.set_content(html, subtype="html")
        return
    mail.set_content(text)
    mail.add_alternative(html, subtype="html")
    # Derived from the bodies: the same chunk gives the same bytes (golden tests, a re-sent
    # copy), and a body cannot contain the digest of itself.
    digest = hashlib.sha256(f"{text}\0{html}".encode()).hexdigest()[:32]
    mail.set_boundary(f"=_sd_{digest}")


def _files(mail: EmailMessage, files: Sequence[Attachment], bodies: str) -> None:
    digest = hashlib.sha256(bodies.encode())
    for f in files:
        data = base64.b64decode(f.content)
        digest.update(f"\0{f.filename}\0{f.content_type}\0{f.content_id}\0".encode())
        digest.update(data)
        maintype, _, subtype = f.content_type.partition("/")
        if f.disposition == "inline" and f.content_id:
            host = mail.get_body(preferencelist=("related", "html")) or mail
            host.add_related(
                data,
                maintype=maintype,
                subtype=subtype,
                cid=f"<{f.content_id}>",
                filename=f.filename,
                disposition="inline",
            )
        else:
            mail.add_attachment(data, maintype=maintype, subtype=subtype, filename=f.filename)
    # As for the bodies: the same chunk gives the same bytes, whatever part holds the files.
    tag = digest.hexdigest()[:32]
    for n, part in enumerate(mail.walk()):
        if part.is_multipart():
            part.set_boundary(f"=_sd_{tag}_{n}")
