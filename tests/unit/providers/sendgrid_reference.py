"""The SendGrid payload as the official ``sendgrid`` helpers build it: the reference our direct
builder (``shared.providers.sendgrid.build_payload``) is compared with, field by field.

This is the adapter's builder as it was before it built plain dicts, kept only here (tests and
``bench/payloads.py``); the send path never runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sendgrid.helpers.mail import (
    Attachment,
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

from shared.core.addresses import address_key
from shared.core.errors import PermanentProviderError
from shared.core.models import ATTEMPT_ARG, Chunk, Recipient
from shared.providers import envelope
from shared.providers.sendgrid import CODE, MAX_CATEGORIES, MAX_RECIPIENTS


def reference_payload(chunk: Chunk) -> dict[str, Any]:
    """The v3 Mail Send JSON body for ``chunk`` built with the helpers."""
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
    # add_attachment inserts at the front, like add_category.
    for file in reversed(message.attachments):
        attachment = Attachment()
        attachment.file_content = file.content
        attachment.file_name = file.filename
        attachment.file_type = file.content_type
        attachment.disposition = file.disposition
        if file.content_id is not None:
            attachment.content_id = file.content_id
        mail.add_attachment(attachment)
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
    """The helper's Personalization with linear de-duplication of ``to`` (the helper's own is
    quadratic: 24 ms for 1,000 recipients). Same rule: case-insensitive, first one wins."""

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
