"""SendGrid's API surface: credentials, message ids, the error document, addresses.

The rules of the Mail Send body itself live in :mod:`sandbox.mailsend`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

#: A larger request body is refused with 413 ("total email < 30 MB").
MAX_BODY_BYTES = 30 * 1024 * 1024
_ADDRESS = re.compile(r"^[^@\s<>(),;:\"\[\]\\]+@[^@\s<>(),;:\"\[\]\\]+\.[^@\s<>(),;:\"\[\]\\.]+$")
_KINDS = ("to", "cc", "bcc")


@dataclass(frozen=True, slots=True)
class FieldError:
    """One entry of SendGrid's 400 ``errors`` list."""

    message: str
    field: str | None
    help: str | None = None

    def as_json(self) -> dict[str, str | None]:
        return {"message": self.message, "field": self.field, "help": self.help}


def error_body(errors: Sequence[FieldError]) -> bytes:
    """SendGrid's error document: ``{"errors": [{"message", "field", "help"}, ...]}``."""
    return orjson.dumps({"errors": [e.as_json() for e in errors]})


def new_message_id() -> str:
    """A fresh ``X-Message-Id``: 22 base64url characters, like SendGrid's."""
    return secrets.token_urlsafe(16)


def auth_problem(authorization: str | None) -> str | None:
    """SendGrid's 401 message for this ``Authorization`` header, or None when it is accepted.

    Any non-empty bearer key is accepted except the literal ``invalid``.
    """
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return "authorization required"
    if key == "invalid":
        return "The provided authorization grant is invalid, expired, or revoked"
    return None


def is_valid_address(value: object, *, ascii_only: bool = False) -> bool:
    """Whether ``value`` is a plain ``local@domain.tld`` address (ASCII only, if asked)."""
    if not isinstance(value, str) or (ascii_only and not value.isascii()):
        return False
    return _ADDRESS.match(value) is not None


def attachments(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The name, type and decoded size of each file of a *valid* request (never its bytes)."""
    found = []
    for item in payload.get("attachments") or ():
        content = item["content"]
        found.append(
            {
                "filename": item["filename"],
                "content_type": item.get("type"),
                "disposition": item.get("disposition", "attachment"),
                "content_id": item.get("content_id"),
                "size": len(content) // 4 * 3 - content[-2:].count("="),
            }
        )
    return found


def recipients(payload: Mapping[str, Any]) -> Iterator[tuple[int, str]]:
    """``(personalization index, address)`` of every recipient of a *valid* request."""
    for index, personalization in enumerate(payload["personalizations"]):
        for kind in _KINDS:
            for entry in personalization.get(kind) or ():
                yield index, entry["email"]
