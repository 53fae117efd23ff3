"""HTTP handlers of the SendGrid and Mailgun send APIs: faults, auth, limits, accept.

Thin: each handler applies an injected fault, checks credentials and size, lets the pure
rules in :mod:`~sandbox.sendgrid` / :mod:`~sandbox.mailgun` judge the
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
from starlette.types import Receive, Scope, Send

from sandbox import mailgun, mailsend, query, rendered, sendgrid
from sandbox.faults import Fault, fault_answer
from sandbox.state import state_of
from sandbox.webhooks import MailgunJob, SendGridJob
from sandbox.wire import json_response, parse_form, read_body


def sendgrid_routes() -> list[BaseRoute]:
    """Routes mounted at ``/sendgrid`` (SendGrid's API root)."""
    return [
        Route("/v3/mail/send", mail_send, methods=["POST"]),
        Route("/v3/messages", query.email_activity, methods=["GET"]),
        Route("/v3/user/webhooks/event/settings/signed", signed_webhook_settings),
    ]


def mailgun_routes() -> list[BaseRoute]:
    """Routes mounted at ``/mailgun`` (Mailgun's API root)."""
    return [
        Route("/v3/{domain}/messages", messages, methods=["POST"]),
        Route("/v3/{domain}/events", query.events, methods=["GET"]),
        Route("/v3/{domain}/events/{token}", query.events, methods=["GET"]),
    ]


async def mail_send(request: Request) -> Response:
    """``POST /v3/mail/send``: 202 with ``X-Message-Id``, or SendGrid's error answer."""
    state = state_of(request)
    fault = state.faults.take("sendgrid")
    faulted = await fault_before(fault)
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
    files = sendgrid.attachments(payload)
    state.ledger.record(
        "sendgrid",
        addresses,
        message_id=message_id,
        size=len(raw),
        request=payload,
        attachments=files,
    )
    state.inbox.add(rendered.sendgrid(payload, files))
    state.index.add(query.sendgrid_entries(payload, message_id, now))
    if fault is None or fault.webhooks:
        state.dispatcher.submit(SendGridJob(message_id, payload, int(now), len(addresses)))
    answer = Response(status_code=202, headers={"X-Message-Id": message_id})
    return await fault_after(fault, answer)


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
    fault = state.faults.take("mailgun")
    faulted = await fault_before(fault)
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
    files = mailgun.attachments(form.files)
    state.ledger.record(
        "mailgun",
        message.recipients,
        message_id=message_id,
        size=len(raw),
        request={"domain": domain, "fields": form.fields, "files": form.files},
        attachments=files,
    )
    state.inbox.add(
        rendered.mailgun(
            form.fields, message.recipients, message.recipient_variables, attachments=files
        )
    )
    state.index.add(query.mailgun_entries(message, message_id, time.time(), domain))
    if fault is None or fault.webhooks:
        state.dispatcher.submit(MailgunJob(message_id, message))
    answer = json_response({"id": message_id, "message": "Queued. Thank you."})
    return await fault_after(fault, answer)


async def fault_before(fault: Fault | None) -> Response | None:
    """What a fault answers instead of handling the call; None to handle it."""
    if fault is None or fault.accept:
        return None
    if fault.latency_ms:
        await asyncio.sleep(fault.latency_ms / 1000)
    if fault.reset:
        return broken_connection()
    if fault.status is None:
        return None
    return _fault_response(fault)


async def fault_after(fault: Fault | None, answer: Response) -> Response:
    """The answer to a call the provider accepted, as a fault with ``accept`` bends it."""
    if fault is None or not fault.accept:
        return answer
    if fault.latency_ms:
        await asyncio.sleep(fault.latency_ms / 1000)
    if fault.reset:
        return broken_connection()
    return answer if fault.status is None else _fault_response(fault)


def _fault_response(fault: Fault) -> Response:
    answer = fault_answer(fault, now=time.time())
    return Response(answer.body, answer.status, answer.headers, media_type=answer.media_type)


class BrokenConnection(Exception):
    """Raised after a response has started, so the server drops the connection."""


class _BrokenResponse(Response):
    """Starts an answer and breaks the connection before its body: the client gets no usable
    answer although it sent the whole request (uvicorn closes a connection whose response
    raised after it started)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"64")]}
        )
        raise BrokenConnection("injected fault: connection broken after the request")


def broken_connection() -> Response:
    return _BrokenResponse()


def _sendgrid_error(status: int, message: str) -> Response:
    return Response(
        sendgrid.error_body([sendgrid.FieldError(message, None)]),
        status,
        media_type="application/json",
    )
