"""HTTP handlers of the providers' query APIs, and what accepted mail leaves in their index.

``GET /sendgrid/v3/messages`` (Email Activity) and ``GET /mailgun/v3/<domain>/events``
(Events), in the shapes described in :mod:`sandbox.activity`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from sandbox import activity, mailgun, sendgrid
from sandbox.activity import EventsQuery, Indexed, QueryError
from sandbox.state import state_of
from sandbox.wire import json_response
from shared.core.digits import natural

#: Most messages one Email Activity answer lists.
SENDGRID_MAX_LIMIT = 1000


def sendgrid_entries(payload: Mapping[str, Any], message_id: str, now: float) -> Iterator[Indexed]:
    """Index entries of an accepted Mail Send request: one per recipient, with its
    personalization's ``custom_args`` over the top-level ones."""
    top = payload.get("custom_args") or {}
    sender = str((payload.get("from") or {}).get("email", ""))
    for index, personalization in enumerate(payload["personalizations"]):
        args = {**top, **(personalization.get("custom_args") or {})}
        subject = str(personalization.get("subject") or payload.get("subject") or "")
        for kind in ("to", "cc", "bcc"):
            for entry in personalization.get(kind) or ():
                yield Indexed(
                    "sendgrid",
                    f"{message_id}.filter0001.{int(now):X}.{index}",
                    str(entry["email"]).lower(),
                    now,
                    {str(k): str(v) for k, v in args.items()},
                    subject,
                    sender,
                )


def mailgun_entries(
    message: mailgun.MailgunMessage, message_id: str, now: float, domain: str
) -> Iterator[Indexed]:
    """Index entries of an accepted Mailgun message: one ``accepted`` event per recipient."""
    for recipient in message.recipients:
        yield Indexed(
            "mailgun",
            message_id.strip("<>"),
            recipient,
            now,
            message.user_variables(recipient),
            message.subject,
            message.sender,
            domain.lower(),
        )


async def email_activity(request: Request) -> Response:
    """``GET /v3/messages?query=...&limit=N``: SendGrid's Email Activity Feed."""
    state = state_of(request)
    problem = sendgrid.auth_problem(request.headers.get("authorization"))
    if problem is not None:
        return _sendgrid_error(401, problem)
    if not state.settings.sendgrid_email_activity:
        # What SendGrid answers an account without the Email Activity History add-on.
        return _sendgrid_error(400, "authorization required")
    limit = natural(request.query_params.get("limit", "10"))
    if limit is None or not 1 <= limit <= SENDGRID_MAX_LIMIT:
        return _sendgrid_error(400, f"limit must be between 1 and {SENDGRID_MAX_LIMIT}", "limit")
    try:
        clauses = activity.parse_query(request.query_params.get("query", ""))
    except QueryError as exc:
        return _sendgrid_error(400, str(exc), "query")
    entries = state.index.visible("sendgrid", time.time())
    return json_response({"messages": activity.search_messages(entries, clauses, limit)})


async def events(request: Request) -> Response:
    """``GET /v3/<domain>/events[/<page token>]``: Mailgun's Events API (``accepted`` only)."""
    state = state_of(request)
    if not mailgun.is_authorized(request.headers.get("authorization")):
        return PlainTextResponse("Forbidden", 401)
    domain = request.path_params["domain"]
    if mailgun.is_unknown_domain(domain):
        return json_response({"message": "Domain not found"}, 404)
    now = time.time()
    try:
        token = request.path_params.get("token")
        query = (
            EventsQuery.from_token(token)
            if token
            else activity.parse_events_query(request.query_params, now)
        )
    except QueryError as exc:
        return json_response({"message": str(exc)}, 400)
    entries = state.index.visible("mailgun", now, query.recipient)
    own = [e for e in entries if e.domain == domain.lower()]
    page, offset = activity.events_page(own, query)
    path = request.url.path
    # The last "/events": a domain may hold the word too (events.example.com).
    url = str(request.url.replace(path=path[: path.rindex("/events") + 7], query=""))
    return json_response(
        {
            "items": [_mailgun_item(e) for e in page],
            "paging": {
                "next": f"{url}/{query.token(offset)}",
                "previous": f"{url}/{query.token(max(0, query.offset - query.limit))}",
                "first": f"{url}/{query.token(0)}",
                "last": f"{url}/{query.token(offset)}",
            },
        }
    )


def _mailgun_item(entry: Indexed) -> dict[str, Any]:
    digest = hashlib.sha256(f"{entry.message_id}/{entry.recipient}".encode()).hexdigest()
    return {
        "event": "accepted",
        "id": digest[:22],
        "timestamp": entry.accepted_at,
        "log-level": "info",
        "method": "HTTP",
        "recipient": entry.recipient,
        "recipient-domain": entry.recipient.partition("@")[2],
        "message": {
            "headers": {
                "message-id": entry.message_id,
                "from": entry.sender,
                "subject": entry.subject,
            }
        },
        "user-variables": dict(entry.args),
        "flags": {"is-test-mode": False},
        "tags": [],
        "campaigns": [],
    }


def _sendgrid_error(status: int, message: str, field: str | None = None) -> Response:
    return Response(
        sendgrid.error_body([sendgrid.FieldError(message, field)]),
        status,
        media_type="application/json",
    )
