"""``POST /webhooks/inbound/mailgun`` and ``POST /webhooks/inbound/sendgrid``: the ``mailto:``
form of List-Unsubscribe, as the providers' inbound routes forward the mail sent to it, into
the same suppression as the one-click POST (``shared.engagement.unsubscribe_event``).

* Mailgun: a route's ``forward()`` POST (urlencoded, or multipart with attachments), signed
  like its webhooks (HMAC of ``timestamp + token`` with the webhook signing key; each token
  accepted once, for one body, ``webhook_tokens``). 401 for a bad or stale signature; 406 for
  a mail that is not an unsubscribe, which tells Mailgun not to retry it.
* SendGrid Inbound Parse: multipart, unsigned. Basic auth given in the configured URL
  (``SAFEDELIVR_WEBHOOKS_INBOUND_BASIC_USER`` and ``_PASSWORD``, compared in constant time)
  stands in; without them every post is a 503 (fail closed; SendGrid retries for 3 days).
  A mail that is not an unsubscribe is a 200 that says so: any other answer is retried.

Either way the token comes from the Subject (``unsubscribe <token>``) or a plus-address, is
verified with the tracking keys, and the recipient's unsubscribe is applied before the 200.
Bodies are read up to :data:`MAX_BODY` (an unsubscribe is a few KB; a larger mail is not
one) within the webhooks' body timeout; anything that is not a form is a 415, a malformed
form a 400.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse
from collections.abc import AsyncGenerator, Mapping
from typing import Final

import orjson
from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import Response

from shared.core.keyring import KeyRing
from shared.core.webhook_events import timestamp_fresh
from shared.engagement.unsubscribe_event import mailto_claim, unsubscribe_event
from shared.infra.config import Settings
from shared.infra.http import JSON, ApiError, read_capped
from shared.ingest.ingest import Ingest
from shared.providers import mailgun_events

#: Largest inbound mail read: a mail to the unsubscribe address is a few KB.
MAX_BODY: Final = 1024 * 1024
#: Fields and files of a form parsed (the providers send a dozen fields or so).
MAX_FIELDS: Final = 64
MAX_FILES: Final = 16
#: Seconds an inbound body may take to arrive (as the webhooks').
BODY_TIMEOUT: Final = 10.0


async def mailgun(request: Request) -> Response:
    """A Mailgun route's forwarded mail: 200 unsubscribed, 406 not an unsubscribe."""
    state = request.app.state
    settings: Settings = state.settings
    signing_key = settings.webhooks.mailgun_signing_key
    if signing_key is None:
        raise ApiError(503, "not_configured", "Mailgun webhook signing key is not configured")
    raw = await read_capped(request, MAX_BODY, timeout=BODY_TIMEOUT)
    form = await parse_form(raw, request.headers.get("content-type", ""))
    stamp, token = form.get("timestamp", ""), form.get("token", "")
    if not timestamp_fresh(stamp, time.time(), settings.webhooks.timestamp_tolerance):
        raise ApiError(401, "bad_signature", "missing or stale signature timestamp")
    if not mailgun_events.verify_signature(
        signing_key.get_secret_value(), stamp, token, form.get("signature", "")
    ):
        raise ApiError(401, "bad_signature", "signature does not match")
    if not await state.intake.tokens.accept_once(token, hashlib.sha256(raw).digest()):
        raise ApiError(401, "bad_signature", "this token was already used with another body")
    subject, addresses = mailgun_mail(form)
    done = await _unsubscribe(state.intake.ingest, state.tracking_ring, subject, addresses)
    if done is None:
        return JSON({"unsubscribed": False, "reason": NOT_AN_UNSUBSCRIBE}, status_code=406)
    return JSON({"unsubscribed": True})


async def sendgrid(request: Request) -> Response:
    """A SendGrid Inbound Parse post: 200 either way (``unsubscribed`` says which)."""
    state = request.app.state
    settings: Settings = state.settings
    check_basic(request.headers.get("authorization", ""), settings)
    raw = await read_capped(request, MAX_BODY, timeout=BODY_TIMEOUT)
    form = await parse_form(raw, request.headers.get("content-type", ""))
    subject, addresses = sendgrid_mail(form)
    done = await _unsubscribe(state.intake.ingest, state.tracking_ring, subject, addresses)
    if done is None:
        return JSON({"unsubscribed": False, "reason": NOT_AN_UNSUBSCRIBE})
    return JSON({"unsubscribed": True})


NOT_AN_UNSUBSCRIBE: Final = (
    "no unsubscribe token of ours in the Subject or a plus-address, or its recipient is gone"
)


async def _unsubscribe(
    ingest: Ingest, ring: KeyRing, subject: str, addresses: list[str]
) -> str | None:
    """The unsubscribed address, suppressed; None when the mail is not an unsubscribe."""
    claim = mailto_claim(subject, addresses, ring)
    if claim is None:
        return None
    row = await ingest.recipients.one(claim.batch_id, claim.chunk, claim.log_id, addresses=True)
    email = str(row["email"]) if row and row.get("email") else None
    if email is None:
        return None
    if await ingest.apply(unsubscribe_event(claim, email, "mailto unsubscribe")) != "applied":
        return None
    return email


def check_basic(authorization: str, settings: Settings) -> None:
    """Refuse an Inbound Parse post without this deployment's Basic auth: 503 when none is
    configured (fail closed: the posts are unsigned), 401 when it does not match."""
    user = settings.webhooks.inbound_basic_user
    password = settings.webhooks.inbound_basic_password
    if not user or password is None or not password.get_secret_value():
        raise ApiError(
            503,
            "not_configured",
            "SendGrid Inbound Parse needs Basic auth in its URL "
            "(SAFEDELIVR_WEBHOOKS_INBOUND_BASIC_USER and _PASSWORD)",
        )
    expected = base64.b64encode(f"{user}:{password.get_secret_value()}".encode()).decode()
    if not hmac.compare_digest(authorization.encode(), f"Basic {expected}".encode()):
        raise ApiError(401, "bad_signature", "bad basic auth credentials")


def mailgun_mail(form: Mapping[str, str]) -> tuple[str, list[str]]:
    """The Subject and the addresses (envelope recipient, To) of a Mailgun forward."""
    return form.get("subject", form.get("Subject", "")), [
        form.get("recipient", ""),
        form.get("To", ""),
    ]


def sendgrid_mail(form: Mapping[str, str]) -> tuple[str, list[str]]:
    """The Subject and the addresses (envelope recipients, To) of an Inbound Parse post."""
    addresses = [form.get("to", "")]
    try:
        envelope = orjson.loads(form.get("envelope", "{}"))
    except orjson.JSONDecodeError:
        envelope = {}
    to = envelope.get("to") if isinstance(envelope, dict) else None
    if isinstance(to, list):
        addresses += [a for a in to if isinstance(a, str)]
    return form.get("subject", ""), addresses


async def parse_form(raw: bytes, content_type: str) -> dict[str, str]:
    """The text fields of an urlencoded or multipart body (files left out); 415 for any
    other body, 400 for a malformed one."""
    kind = content_type.partition(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        try:
            pairs = urllib.parse.parse_qsl(
                raw.decode("utf-8", "replace"),
                keep_blank_values=True,
                max_num_fields=MAX_FIELDS,
            )
        except ValueError as exc:
            raise ApiError(400, "malformed_body", f"not a form: {exc}") from exc
        return dict(pairs)
    if kind != "multipart/form-data":
        raise ApiError(
            415,
            "unsupported_media_type",
            "an inbound mail is application/x-www-form-urlencoded or multipart/form-data",
        )

    async def body() -> AsyncGenerator[bytes, None]:
        yield raw

    parser = MultiPartParser(
        Headers({"content-type": content_type}),
        body(),
        max_files=MAX_FILES,
        max_fields=MAX_FIELDS,
        max_part_size=MAX_BODY,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, "malformed_body", f"not a form: {exc.message}") from exc
    fields: dict[str, str] = {}
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            await value.close()
        else:
            fields.setdefault(name, value)
    return fields
