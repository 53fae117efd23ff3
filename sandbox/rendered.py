"""What each recipient of an accepted request would find in their mailbox, as the provider
would have built it: the headers (the request's, then the recipient's own), the subject and
the bodies after the provider's own substitution. The sandbox keeps these per address for
``GET /_control/messages?to=`` (tests, and users trying things locally, read what was really
sent: rewritten links, List-Unsubscribe headers).

SendGrid: each personalization's ``substitutions`` are replaced literally in the subject and
the content, and its ``headers`` are added to the top-level ones. Mailgun: ``%recipient.x%``
in the subject, the bodies and the ``h:`` headers is expanded from ``recipient-variables``.

Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.mailgun import expand


@dataclass(frozen=True, slots=True)
class Delivered:
    to: str
    """The recipient's address, lower case."""
    provider: str
    headers: Mapping[str, str]
    subject: str
    html: str | None
    text: str | None
    attachments: tuple[Mapping[str, object], ...] = ()
    """Each file's name, type, disposition and size (never its bytes)."""

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = {
            "provider": self.provider,
            "headers": dict(self.headers),
            "subject": self.subject,
            "html": self.html,
            "text": self.text,
        }
        if self.attachments:  # only then: a message without files reads as it always did
            view["attachments"] = [dict(a) for a in self.attachments]
        return view


def _replace_all(text: str | None, substitutions: Mapping[str, Any]) -> str | None:
    if text is None:
        return None
    for key, value in substitutions.items():
        text = text.replace(str(key), str(value))
    return text


def sendgrid(
    payload: Mapping[str, Any], attachments: Sequence[Mapping[str, object]] = ()
) -> Iterator[Delivered]:
    """Every recipient (to, cc, bcc) of a validated ``/v3/mail/send`` payload."""
    files = tuple(attachments)
    contents = {c.get("type"): c.get("value") for c in payload.get("content") or ()}
    base_headers = dict(payload.get("headers") or {})
    for personalization in payload.get("personalizations") or ():
        subs = personalization.get("substitutions") or {}
        headers = {**base_headers, **(personalization.get("headers") or {})}
        subject = personalization.get("subject") or payload.get("subject") or ""
        for field in ("to", "cc", "bcc"):
            for address in personalization.get(field) or ():
                yield Delivered(
                    to=str(address.get("email", "")).lower(),
                    provider="sendgrid",
                    headers=headers,
                    subject=_replace_all(subject, subs) or "",
                    html=_replace_all(contents.get("text/html"), subs),
                    text=_replace_all(contents.get("text/plain"), subs),
                    attachments=files,
                )


def mailgun(fields: Sequence[tuple[str, str]], recipients: Sequence[str],
            variables: Mapping[str, Mapping[str, Any]] | None,
            attachments: Sequence[Mapping[str, object]] = ()) -> Iterator[Delivered]:  # fmt: skip
    """Every recipient of a validated ``/v3/{domain}/messages`` form."""
    files = tuple(attachments)
    first: dict[str, str] = {}
    headers: dict[str, str] = {}
    for name, value in fields:
        if name.startswith("h:"):
            headers[name[2:]] = value
        else:
            first.setdefault(name, value)
    for address in recipients:
        own = (variables or {}).get(address.lower(), {})

        def fill(text: str | None, own: Mapping[str, Any] = own) -> str | None:
            return None if text is None else expand(text, own)

        yield Delivered(
            to=address.lower(),
            provider="mailgun",
            headers={k: fill(v) or "" for k, v in headers.items()},
            subject=fill(first.get("subject")) or "",
            html=fill(first.get("html")),
            text=fill(first.get("text")),
            attachments=files,
        )
