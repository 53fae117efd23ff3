"""The Go original's request fields and answer shapes, as pure functions (``/api/*``).

Its helpers (``validations.go``) are kept as it wrote them, so its own test cases hold:
:func:`is_email` (the WHATWG pattern, on the lowercased address), :func:`has_essentials`
(``from``, ``subject``, ``body`` present and valid, every ``to`` valid) and
:func:`is_multipart`. :func:`batch_body` turns its fields into the body ``POST
/v1/batches`` takes, so one use case (``services.api.sending``) accepts both; the shapes
below turn our views into its rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.api.queries import RecipientLog
    from shared.core.models import Message
    from shared.delivery.batchstore import BatchHeader

#: Fields of a request: its query string, then its (urlencoded or multipart) body, each name
#: with every value it was given (``to`` repeats).
Fields = Mapping[str, Sequence[str]]

_WHATWG_EMAIL = re.compile(
    r"[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"
)
#: Longer than any address (RFC 5321): refused before the pattern runs.
_MAX_EMAIL = 320


def first(fields: Fields, name: str) -> str:
    """The first value of ``name``, or "" (as Go's ``FormValue``)."""
    values = fields.get(name) or ()
    return values[0] if values else ""


def is_email(value: str) -> bool:
    """The original's ``IsEmail``: lowercase, then the WHATWG ``input type=email`` pattern,
    with a dot in the domain (its own tests refuse ``sample.sample@sample``). Unlike the
    original, longer than 320 characters is not an email."""
    # fullmatch: Go's ``$`` is the end of the text, Python's would allow a final newline.
    if len(value) > _MAX_EMAIL or _WHATWG_EMAIL.fullmatch(value.lower()) is None:
        return False
    return "." in value.rpartition("@")[2]


def has_essentials(fields: Fields) -> bool:
    """The original's ``HasEssentials``: a valid ``from``, a non-empty ``subject`` and
    ``body``, and, when ``to`` is given, at least one value and every value valid (a missing
    ``to`` passes here and is refused later, as there)."""
    if not is_email(first(fields, "from")):
        return False
    if "to" in fields:
        recipients = fields["to"]
        if not recipients or not all(is_email(r) for r in recipients):
            return False
    return bool(first(fields, "subject")) and bool(first(fields, "body"))


def is_multipart(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names a multipart form with its boundary (the original's
    ``IsMultipart``, which wanted a ``boundary`` parameter, minus accepting any media type
    that has one)."""
    media, _, params = (content_type or "").partition(";")
    if media.strip().lower() not in ("multipart/form-data", "form-data"):
        return False
    names = (p.partition("=")[0].strip().lower() for p in params.split(";") if "=" in p)
    return "boundary" in names


def batch_body(fields: Fields) -> dict[str, Any]:
    """The ``POST /v1/batches`` body for the original's fields: ``body`` is the HTML, ``name``
    the sender's display name when longer than one character, ``is_bulk`` bulk only when it
    is exactly ``"true"``."""
    sender: str | dict[str, str] = first(fields, "from")
    name = first(fields, "name")
    if len(name) > 1:
        sender = {"email": first(fields, "from"), "name": name}
    return {
        "from": sender,
        "to": list(fields.get("to") or ()),
        "subject": first(fields, "subject"),
        "html": first(fields, "body"),
        "bulk": first(fields, "is_bulk") == "true",
    }


def options(message: Message, to: Sequence[str] | None) -> dict[str, str]:
    """A batch's ``options`` map as the original stored it (``to`` comma-joined, when given)."""
    out = {
        "from": message.sender.email,
        "subject": message.subject,
        "content": message.html or "",
        "isBulk": "true" if message.bulk else "false",
        "name": message.sender.name or "",
    }
    if to is not None:
        out["to"] = ",".join(to)
    return out


def batch_row(
    header: BatchHeader,
    status: str,
    reasons: Mapping[str, int],
    to: Sequence[str] | None,
    *,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """A ``batches`` row of the original from a batch's header, status and failure reasons
    (most frequent first).

    ``created_at`` overrides the header's (the batch list shows the batch id's own time, to
    the microsecond). Its ``reason`` is our most frequent failure reason; ``code`` and
    ``description`` have no counterpart and stay empty, as the original always sent them.
    """
    created = (created_at or header.created_at).isoformat()
    return {
        "batch_id": str(header.batch_id),
        "user_id": str(header.user_id),
        "subject": header.message.subject,
        "created_at": created,
        "last_updated": created,
        "status": status,
        "reason": next(iter(reasons), ""),
        "code": "",
        "description": "",
        "options": options(header.message, to),
    }


def log_row(log: RecipientLog, batch_id: str, user_id: str, created_at: str) -> dict[str, Any]:
    """A ``logs`` row of the original from one of our recipients (``queries.logs_page``)."""
    return {
        "log_id": str(log.log_id),
        "batch_id": batch_id,
        "user_id": user_id,
        "email": log.email,
        "state": log.state,
        "status": log.accepted_by,
        "created_at": created_at,
        "last_update": log.updated_at.isoformat() if log.updated_at else created_at,
    }


def stat_rows(user_id: str, days: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The original's ``stats`` rows: days with activity only, dated at UTC midnight."""
    return [
        {
            "user_id": user_id,
            "date": midnight(date.fromisoformat(str(d["date"]))),
            "queued": d["queued"],
            "success": d["success"],
            "failed": d["failed"],
        }
        for d in days
        if d["queued"] or d["success"] or d["failed"]
    ]


def midnight(day: date) -> str:
    """A day as the original's JSON wrote its ``timestamp``: RFC 3339 at 00:00 UTC."""
    return f"{day.isoformat()}T00:00:00Z"
