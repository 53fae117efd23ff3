"""HTTP handlers of the SendGrid and Mailgun send APIs: faults, auth, limits, accept.

Thin: each handler applies an injected fault, checks credentials and size, lets the pure
rules in :mod:`~services.sandbox.sendgrid` / :mod:`~services.sandbox.mailgun` judge the
request, then records it and hands it to the webhook dispatcher without waiting.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from services.sandbox import mailgun, mailsend, sendgrid
from services.sandbox.faults import fault_answer
from services.sandbox.state import SandboxState, state_of
from services.sandbox.webhooks import MailgunJob, SendGridJob
from services.sandbox.wire import json_response, parse_form, read_body


def sendgrid_routes() -> list[BaseRoute]:
    """Routes mounted at ``/sendgrid`` (SendGrid's API root)."""
    return [
        Route("/v3/mail/send", mail_send, methods=["POST"]),
        Route("/v3/user/webhooks/event/settings/signed", signed_webhook_settings),
    ]


def mailgun_routes() -> list[BaseRoute]:
    """Routes mounted at ``/mailgun`` (Mailgun's API root)."""
    return [Route("/v3/{domain}/messages", messages, methods=["POST"])]


async def mail_send(request: Request) -> Response:
    """``POST /v3/mail/send``: 202 with ``X-Message-Id``, or SendGrid's error answer."""
    state = state_of(request)
    faulted = await _apply_fault(state, "sendgrid")
    if faulted is not None:
        return faulted
    problem = sendgrid.auth_problem(request.headers.get("authorization"))
    if problem is not None:
        return _sendgrid_error(401, problem)
    raw = await read_body(request, sendgrid.MAX_BODY_BYTES)
    if raw is None:
        return _sendgrid_error(413, "content too large")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _sendgrid_error(400, "Bad Request: the body is not valid JSON")
    now = time.time()
    errors = mailsend.validate(payload, now=now)
    if errors:
        return Response(sendgrid.error_body(errors), 400, media_type="application/json")
    message_id = sendgrid.new_message_id()
    addresses = [email for _, email in sendgrid.recipients(payload)]
    state.ledger.record(
        "sendgrid", addresses, message_id=message_id, size=len(raw), request=payload
    )
    state.dispatcher.submit(SendGridJob(message_id, payload, int(now), len(addresses)))
    return Response(status_code=202, headers={"X-Message-Id": message_id})


async def signed_webhook_settings(request: Request) -> Response:
    """``GET /v3/user/webhooks/event/settings/signed``: the signing public key, as SendGrid."""
    state = state_of(request)
    problem = sendgrid.auth_problem(request.headers.get("authorization"))
    if problem is not None:
        return _sendgrid_error(401, problem)
    return json_response({"enabled": True, "public_key": state.sendgrid_public_key})


async def messages(request: Request) -> Response:
    """``POST /v3/{domain}/messages``: 200 with the queued id, or Mailgun's error answer."""
    state = state_of(request)
    faulted = await _apply_fault(state, "mailgun")
    if faulted is not None:
        return faulted
    if not mailgun.is_authorized(request.headers.get("authorization")):
        return PlainTextResponse("Forbidden", 401)
    domain = request.path_params["domain"]
    if mailgun.is_unknown_domain(domain):
        return json_response({"message": "Domain not found"}, 404)
    raw = await read_body(request, mailgun.MAX_BODY_BYTES)
    if raw is None:
        return json_response({"message": "Message exceeds the 25 MB size limit"}, 413)
    form = await parse_form(request.headers, raw, max_part_size=mailgun.MAX_BODY_BYTES)
    if isinstance(form, str):
        return json_response({"message": form}, 400)
    message = mailgun.parse_message(form.fields)
    if isinstance(message, str):
        return json_response({"message": message}, 400)
    message_id = mailgun.new_message_id(domain, datetime.now(UTC), next(state.mailgun_serial))
    state.ledger.record(
        "mailgun",
        message.recipients,
        message_id=message_id,
        size=len(raw),
        request={"domain": domain, "fields": form.fields, "files": form.files},
    )
    state.dispatcher.submit(MailgunJob(message_id, message))
    return json_response({"id": message_id, "message": "Queued. Thank you."})


async def _apply_fault(state: SandboxState, provider: str) -> Response | None:
    """The injected answer for this call, after its latency; None to handle it normally."""
    fault = state.faults.take(provider)
    if fault is None:
        return None
    if fault.latency_ms:
        await asyncio.sleep(fault.latency_ms / 1000)
    if fault.status is None:
        return None
    answer = fault_answer(fault, now=time.time())
    return Response(answer.body, answer.status, answer.headers, media_type=answer.media_type)


def _sendgrid_error(status: int, message: str) -> Response:
    return Response(
        sendgrid.error_body([sendgrid.FieldError(message, None)]),
        status,
        media_type="application/json",
    )
