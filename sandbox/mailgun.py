"""Mailgun's Messages API as Mailgun judges it: form fields, limits, recipient variables, ids.

Pure functions over the decoded form fields. ``parse_message`` returns the accepted message
or the first reason Mailgun would give for a 400, as Mailgun reports one problem at a time.

One deliberate strictness beyond Mailgun: every ``recipient-variables`` key must be a ``to``
recipient. Mailgun ignores other keys, but then it cannot expand ``%recipient.x%`` for the
address that was meant, and webhook correlation silently breaks; we want to see that here.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import getaddresses
from typing import Any

import orjson

from sandbox.sendgrid import is_valid_address

#: A larger request body is refused with 413 (Mailgun's 25 MB message limit).
MAX_BODY_BYTES = 25 * 1024 * 1024
#: Recipients (to + cc + bcc) of one batch send.
MAX_RECIPIENTS = 1000
#: Total size of the ``o:``, ``h:`` and ``v:`` parameters.
MAX_OPTIONS_BYTES = 16 * 1024

_PLACEHOLDER = re.compile(r"%recipient\.([^%\s]+)%")
_OPTION_PREFIXES = ("o:", "h:", "v:")


@dataclass(frozen=True, slots=True)
class MailgunMessage:
    """An accepted ``POST /v3/{domain}/messages``: what its webhook events need."""

    sender: str
    from_header: str
    subject: str
    to: tuple[str, ...]
    cc: tuple[str, ...]
    bcc: tuple[str, ...]
    tags: tuple[str, ...]
    variables: Mapping[str, str]
    """The ``v:`` parameters, without the prefix."""
    recipient_variables: Mapping[str, Mapping[str, Any]] | None
    """``recipient-variables`` keyed by lower-cased address."""
    size: int = 0
    """Rough message size in bytes (subject and bodies), reported in events."""

    @property
    def recipients(self) -> tuple[str, ...]:
        """Every distinct recipient, in to, cc, bcc order."""
        return tuple(dict.fromkeys(a.lower() for a in (*self.to, *self.cc, *self.bcc)))

    def user_variables(self, recipient: str) -> dict[str, str]:
        """``event-data.user-variables`` for ``recipient``: ``v:`` values after expansion."""
        if not self.recipient_variables:
            return dict(self.variables)
        own = self.recipient_variables.get(recipient.lower(), {})
        return {name: expand(value, own) for name, value in self.variables.items()}


def attachments(files: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """The name, type and size of each file part of a message (``attachment`` or ``inline``;
    Mailgun makes an inline file's name its Content-ID)."""
    return [
        {
            "filename": f["filename"],
            "content_type": f.get("content_type"),
            "disposition": f["field"],
            "content_id": f["filename"] if f["field"] == "inline" else None,
            "size": f["size"],
        }
        for f in files
        if f["field"] in ("attachment", "inline")
    ]


def is_authorized(authorization: str | None) -> bool:
    """Whether basic auth ``api:<key>`` is given with any key except ``invalid``."""
    scheme, _, credentials = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, _, key = decoded.partition(":")
    return user == "api" and bool(key) and key != "invalid"


def new_message_id(domain: str, now: datetime, serial: int) -> str:
    """A Mailgun id such as ``<20111114174239.25659.5817ABCD@samples.mailgun.org>``."""
    return f"<{now:%Y%m%d%H%M%S}.{serial}.{secrets.token_hex(8).upper()}@{domain}>"


def is_unknown_domain(domain: str) -> bool:
    """Sandbox rule: every sending domain exists except those named ``unknown.*``."""
    return domain.lower().startswith("unknown.")


def expand(value: str, variables: Mapping[str, Any]) -> str:
    """Replace ``%recipient.KEY%`` with the recipient's variable; unknown keys stay as written."""
    if "%recipient." not in value:
        return value

    def _substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in variables:
            return match.group(0)
        found = variables[key]
        return found if isinstance(found, str) else orjson.dumps(found).decode()

    return _PLACEHOLDER.sub(_substitute, value)


def parse_message(fields: Sequence[tuple[str, str]]) -> MailgunMessage | str:
    """The accepted message, or the message of Mailgun's 400 answer."""
    grouped: dict[str, list[str]] = {}
    for name, value in fields:
        grouped.setdefault(name, []).append(value)
    addresses = _parse_addresses(grouped)
    if isinstance(addresses, str):
        return addresses
    senders, to, cc, bcc = addresses
    if not any(v.strip() for k in ("text", "html", "template") for v in grouped.get(k, ())):
        return "Need at least one of 'text', 'html' or 'template' parameters specified"
    total = len(to) + len(cc) + len(bcc)
    if total > MAX_RECIPIENTS:
        return f"Too many recipients: at most {MAX_RECIPIENTS} per message, got {total}"
    options = sum(len(n) + len(v) for n, v in fields if n.startswith(_OPTION_PREFIXES))
    if options > MAX_OPTIONS_BYTES:
        return "The 'o:', 'h:' and 'v:' parameters together must not exceed 16 kB"
    recipient_variables = _parse_recipient_variables(grouped.get("recipient-variables"), to)
    if isinstance(recipient_variables, str):
        return recipient_variables
    return MailgunMessage(
        sender=senders[0],
        from_header=grouped["from"][0],
        subject=(grouped.get("subject") or [""])[0],
        to=tuple(to),
        cc=tuple(cc),
        bcc=tuple(bcc),
        tags=tuple(grouped.get("o:tag", ())),
        variables={n[2:]: v for n, v in fields if n.startswith("v:")},
        recipient_variables=recipient_variables,
        size=sum(len(v) for k in ("subject", "text", "html") for v in grouped.get(k, ())),
    )


def _parse_addresses(
    grouped: Mapping[str, list[str]],
) -> tuple[list[str], list[str], list[str], list[str]] | str:
    parsed: dict[str, list[str]] = {}
    for name in ("from", "to", "cc", "bcc"):
        values = grouped.get(name, [])
        if name in ("from", "to") and not any(v.strip() for v in values):
            return f"'{name}' parameter is missing"
        addresses = _addresses(values)
        if addresses is None or (name == "from" and len(addresses) != 1):
            return f"'{name}' parameter is not a valid address. please check documentation"
        parsed[name] = addresses
    return parsed["from"], parsed["to"], parsed["cc"], parsed["bcc"]


def _addresses(values: Sequence[str]) -> list[str] | None:
    """Bare addresses from repeatable, comma-separated values; None when one is invalid."""
    found: list[str] = []
    for value in values:
        if any(c in value for c in '<"('):
            found.extend(addr for name, addr in getaddresses([value]) if name or addr)
        else:
            found.extend(part.strip() for part in value.split(",") if part.strip())
    return found if all(is_valid_address(a) for a in found) else None


def _parse_recipient_variables(
    values: list[str] | None, to: Sequence[str]
) -> dict[str, Mapping[str, Any]] | str | None:
    if not values:
        return None
    try:
        decoded = orjson.loads(values[0])
    except orjson.JSONDecodeError:
        return "recipient-variables parameter is not a valid JSON"
    if not isinstance(decoded, dict):
        return "recipient-variables must be a JSON object keyed by recipient address"
    recipients = {a.lower() for a in to}
    result: dict[str, Mapping[str, Any]] = {}
    for key, value in decoded.items():
        if not isinstance(value, dict):
            return f"recipient-variables entry for {key} must be a JSON object"
        if key.lower() not in recipients:
            return f"recipient-variables has an entry for {key}, which is not a 'to' recipient"
        result[key.lower()] = value
    return result
