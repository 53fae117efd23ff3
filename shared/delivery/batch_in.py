"""The body of ``POST /v1/batches`` as pydantic models: the shape the OpenAPI document
declares (``services.api.schema`` re-exports them) and every batch body is checked against,
with ``shared.delivery.validation`` applying the rules a schema cannot state; and
:func:`field_errors`, pydantic's errors keyed by field path.

Here, in the delivery layer rather than the API, because ``validation.parse_batch_request``
has callers the API cannot serve (``shared.ops.alerts``, ``services.hooks.notice``): this is
where the one batch model can become what validation parses (issue 35).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.delivery import validation


class BodyIn(BaseModel):
    """A request body: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class AddressIn(BodyIn):
    """An address as an object; a string ``"Name <addr@example.com>"`` works too."""

    email: str = Field(max_length=320, examples=["shop@example.com"])
    name: str | None = Field(None, max_length=256, examples=["Shop"])


class RecipientIn(AddressIn):
    """A ``to`` entry as an object, with its own substitutions (``{{key}}`` → value)."""

    substitutions: dict[str, str] | None = Field(
        None, max_length=validation.MAX_SUBSTITUTIONS, examples=[{"first_name": "Ann"}]
    )


class TrackingIn(BodyIn):
    """What to track in a batch's copies."""

    opens: bool | None = None
    clicks: bool | None = None


class BatchIn(BodyIn):
    """``POST /v1/batches``: one message to many recipients."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "from": "Shop <shop@example.com>",
                    "to": ["ann@example.com", {"email": "bob@example.com", "name": "Bob"}],
                    "subject": "Your order",
                    "text": "Thanks!",
                    "html": "<p>Thanks!</p>",
                }
            ]
        }
    )

    from_: str | AddressIn = Field(alias="from", description="The sender.")
    to: str | list[str | RecipientIn] = Field(
        description="A comma-separated string or a list; duplicates collapse, invalid "
        "entries are reported in `rejected` and the rest are sent."
    )
    subject: str | None = Field(
        None,
        max_length=validation.MAX_SUBJECT_LENGTH,
        description="Required unless the batch names a `template_id`.",
    )
    html: str | None = Field(None, description="At least one of html and text.")
    text: str | None = None
    template_id: str | None = Field(
        None,
        description="Send one of your templates instead of subject/html/text: its live "
        "version (and, during a canary rollout, the canary to its share of recipients).",
    )
    version: int | None = Field(
        None, ge=1, description="With `template_id`: this version, not the live one."
    )
    data: dict[str, Any] | None = Field(
        None,
        description="With `template_id`: the variables the whole batch shares. A variable "
        "not in `data` is per recipient: each `to` entry's `substitutions` must give it.",
    )
    send_at: str | None = Field(
        None,
        description="RFC 3339 time to send at (up to the configured horizon ahead): the "
        "batch is `scheduled` until then, and can be cancelled "
        "(`POST /v1/batches/{id}/cancel`).",
        examples=["2026-12-01T09:00:00Z"],
    )
    reply_to: str | AddressIn | None = None
    cc: str | list[str | AddressIn] | None = Field(None, max_length=validation.MAX_COPY_ADDRESSES)
    bcc: str | list[str | AddressIn] | None = Field(None, max_length=validation.MAX_COPY_ADDRESSES)
    headers: dict[str, str] | None = Field(
        None,
        max_length=validation.MAX_HEADERS,
        description="Extra headers. Refused (422 under `headers.<name>`, in any case): "
        "those we set ourselves (`From`, `Sender`, `Return-Path`, `Message-ID`, "
        "`List-Unsubscribe`, `List-Unsubscribe-Post`: ask for ours with `unsubscribe`, ...), "
        "those that steer a provider (`X-Mailgun-*`, `X-SG-*`, `X-SMTPAPI`, `X-Twilio-*`), "
        "`Resent-*`, `Authentication-Results` and `ARC-*`.",
    )
    provider: str | None = Field(
        None,
        description="Pin the batch to one provider (`sendgrid`, `mailgun`, or its code): only "
        "it is used, with no failover or spill-over to another; when it is at its rate limit "
        "or paused, the work waits for it.",
    )
    bulk: bool | None = Field(
        None,
        description="One copy per recipient, personalised: the default already (kept for "
        "existing clients; `false` does not make the message shared).",
    )
    priority: Literal["transactional", "bulk"] | None = Field(
        None,
        description="The lane the batch is sent in: `bulk` work has queues of its own, so it "
        "never delays `transactional` mail. Default: transactional up to "
        "SAFEDELIVR_API_BULK_THRESHOLD recipients (1,000 unless configured), bulk above.",
    )
    shared: bool | None = Field(
        None,
        description="One message to all the recipients of a chunk, so each sees the others' "
        "addresses; needed for cc/bcc with more than one recipient. Off by default.",
    )
    categories: list[str] | None = Field(None, max_length=validation.MAX_CATEGORIES)
    metadata: dict[str, str] | None = Field(
        None, description="Keys of A-Z, a-z, 0-9, `_` and `-`; echoed in webhooks."
    )
    tracking: TrackingIn | None = Field(
        None,
        description="Open and click tracking for this batch (default: your preferences, "
        "off unless you turned it on). Opens and clicks are counted once per recipient "
        "and in total; they never change a recipient's outcome.",
    )
    unsubscribe: bool | None = Field(
        None,
        description="List-Unsubscribe with one-click unsubscribe (RFC 2369, RFC 8058) in "
        "each copy (default: on when the batch names a `list`, else your preferences).",
    )
    list_: str | None = Field(
        None,
        alias="list",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$",
        description="The list or campaign this mail belongs to: an unsubscribe from it "
        "stops only mail naming the same list (without one, all of your mail).",
    )


def field_errors(exc: ValidationError) -> dict[str, str]:
    """pydantic's errors keyed by field path (``to[3].email``; a body that is not an
    object is ``body``)."""
    out: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        path = ""
        for part in error["loc"]:
            if isinstance(part, str) and _is_type_tag(part):
                continue
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        out.setdefault(path or "body", error["msg"])
    return out


def _is_type_tag(part: str) -> bool:
    """Whether a part of a pydantic error location names a union member's type (``str``,
    ``RecipientIn``, ``list[union[str,RecipientIn]]``) rather than a field: our fields are
    lower-case names, so these never collide with one."""
    return "[" in part or part[:1].isupper() or part in _TYPE_TAGS


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
